"""The Checkpointer façade: save, list, verify, rotate and restore committed checkpoints under one root.

A `Checkpointer` holds the configuration and owns one small object per concern, each constructed with what it
needs: `Listing` (what the root holds), `Lifecycle` (verify, rotate, clean up, quarantine), `Planner` (which files
this rank writes), `Measurements` (bandwidths, compression choice), `Arena` (the staging buffers), `Saver` (a save's
phases, blocking or in the background) and `Prestager` (a copy staged ahead of a notice). Below them: `partition`
(which rank writes what), `commit` (the commit protocol and its barrier), `reader` (reading untrusted checkpoints),
`restore` (verification, through the one fallback loop of `fallback`), `handle` (`SaveHandle`); the lifecycle's
marker files in `preemptible.store.markers`, retention in `preemptible.store.retention`, deletion in
`preemptible.store.deletion`.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch

from preemptible import dist
from preemptible.checkpoint.arena import Arena
from preemptible.checkpoint.commit import Job
from preemptible.checkpoint.handle import SaveHandle
from preemptible.checkpoint.lifecycle import Lifecycle
from preemptible.checkpoint.listing import Listing
from preemptible.checkpoint.measure import Measurements
from preemptible.checkpoint.planner import Planner
from preemptible.checkpoint.prestage import Prestager
from preemptible.checkpoint.reader import Reader
from preemptible.checkpoint.restore import Candidate, Restorer
from preemptible.checkpoint.saver import JournalRelay, Saver
from preemptible.checkpoint.steady import SteadyPlans
from preemptible.errors import CheckpointNotFoundError
from preemptible.events import EventSink, NullSink, SaveReason
from preemptible.journal import Journal
from preemptible.notice import Clock
from preemptible.state import check_state, gc_paused
from preemptible.store import compress as compress_mod
from preemptible.store import format as tensor_format
from preemptible.store import layout
from preemptible.store.io import Storage, storage_for
from preemptible.store.layout import CheckpointInfo
from preemptible.store.markers import Markers, State
from preemptible.store.threads import threads_for
from preemptible.validate import DEFAULT_RTOL, Probe
from preemptible.writer import DEFAULT_MAX_FILE_BYTES, METADATA, Staging

STALE_AFTER_S = 15 * 60
"""Uncommitted leftovers younger than this may belong to a machine still inside its notice window."""

_UNSET: Any = object()


def check_best(best: object) -> tuple[str, str] | None:
    """``keep_best``: None, or ``(figure, "min" | "max")``."""
    if best is None:
        return None
    if (
        not isinstance(best, (tuple, list))
        or len(best) != 2
        or not isinstance(best[0], str)
        or not best[0]
        or best[1] not in ("min", "max")
    ):
        raise ValueError(
            f"keep_best: expected (figure, 'min' or 'max'), e.g. ('val_loss', 'min'), found {best!r}; the figure "
            "is one you log with run.log(...)"
        )
    return (best[0], best[1])


class Checkpointer:
    """Saves and restores training state under ``root``.

    Args:
        root: where checkpoints go: a local directory (created on first save) or an object-store URL
            (``s3://bucket/prefix``, ``gs://...``, ``az://...``; see `preemptible.store.io.storage_for`).
        keep: committed checkpoints to keep (>= 2), besides the newest validated one.
        keep_best: ``(figure, "min" | "max")``: also keep the checkpoint whose ``COMMIT.json`` records the best
            value of that figure (``extra={"figures": {...}}`` at save; `Run` records what ``run.log`` logged).
        journal: where to record saves and fallbacks (optional).
        threads: writer threads for tensor files.
        max_file_bytes: split tensor files larger than this.
        storage_options: for a URL root, arguments to its fsspec file system (credentials,
            ``client_kwargs={"endpoint_url": ...}``); the backend's own environment and credential chain apply too.
        stale_after_s: uncommitted leftovers older than this are deleted; younger ones are left alone.
        moments_dtype: write optimizer moments in this dtype (``torch.bfloat16`` halves them; lossy, opt-in);
            restore casts them back into the optimizer's own dtype.
        storage: a ready `Storage` (instead of one chosen from ``root``), e.g. a fault-injecting subclass.
        background_nice: CPU niceness of the background writer threads (0 to leave them alone): a save in the
            background then uses the cycles training leaves idle. Emergency saves run at full priority.
        background_threads: writer threads of a background save (1: it is not in a hurry, and each thread
            competes with training for the CPU). Emergency saves use ``threads``.
        probe: a function returning a loss on a fixed batch (see `preemptible.validate`): stored at save,
            recomputed after restore; a mismatch beyond ``probe_rtol`` (relative) invalidates that checkpoint.
        verify_after_save: read every file back and check its checksum before committing (off by default: it
            costs a full read of the checkpoint; docs/performance.md has the measured cost).
        compress: write tensor files compressed (``.safetensors.zst``: byte-grouped zstd, lossless): True, False,
            or ``"auto"`` (default): per save, from this state's compression ratio and speed measured on this CPU
            and the destination's bandwidth measured by earlier saves, compress when that makes the save at least
            10% faster; a background save also only when its compression costs little CPU (see
            `preemptible.store.compress.choose`).
        per_rank: under several ranks, the state entries that differ between ranks (RNG streams, data loader
            positions): each rank saves its own. Every other entry is taken to be replicated (DDP) and is
            striped: each rank writes a share of its files. Each save checks that it really is replicated (a
            digest of its non-tensor leaves and tensor shapes, compared across ranks): a difference is a
            `StateDivergenceError` naming the entries, or, in an emergency or final save, those entries are
            written per rank and the journal says so (the last save of a process never costs the checkpoint).
        clock: epoch seconds. monotonic: a monotonic clock for durations.

    Attributes:
        bandwidth: bytes of state per second of recent saves (their write phase, end to end), or None before the
            first; used for deadline arithmetic.
        storage_bandwidth: bytes per second the destination took in while recent saves wrote to it (stored bytes
            over the seconds their threads spent in its writes and fsyncs, less the time they waited for a CPU
            meanwhile), or None before the first: what the compression choice weighs compressing against. A
            background save, paced, on one thread at low priority behind training, is slower end to end than the
            destination, and so is each of its writes; this figure is not.

    Raises:
        OutsideRootError: the root (or a path under it) leads outside itself through a symbolic link.
        StorageUnavailableError: a URL root whose fsspec backend is not installed.

    Examples:
        >>> import tempfile, torch
        >>> from preemptible import Checkpointer
        >>> ck = Checkpointer(tempfile.mkdtemp())
        >>> model = torch.nn.Linear(2, 2)
        >>> ck.save({"model": model}, step=10).wait().step
        10
        >>> with torch.no_grad():
        ...     _ = model.weight.zero_()
        >>> ck.restore({"model": model})  # the newest committed step that verifies, loaded in place
        10
        >>> bool(model.weight.abs().sum() > 0)
        True
    """

    def __init__(
        self,
        root: str,
        *,
        keep: int = 2,
        keep_best: tuple[str, str] | None = None,
        journal: Journal | None = None,
        threads: int | None = None,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        stale_after_s: float = STALE_AFTER_S,
        storage_options: dict[str, Any] | None = None,
        moments_dtype: torch.dtype | None = None,
        storage: Storage | None = None,
        background_nice: int = 10,
        background_threads: int = 1,
        probe: Probe | None = None,
        probe_rtol: float = DEFAULT_RTOL,
        verify_after_save: bool = False,
        compress: bool | str = "auto",
        per_rank: Collection[str] = ("_rng",),
        clock: Clock = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 2:
            raise ValueError(
                f"expected keep >= 2 (the previous checkpoint must stay until the newest has validated), found {keep}"
            )
        self._storage: Storage = storage if storage is not None else storage_for(root, storage_options)
        if threads is None:  # object stores gain from many uploads at once; a disk from a few
            threads = threads_for(self._storage.kind)
        self.root = self._storage.root
        if self._storage.kind == "local" and os.path.exists(self.root) and not os.path.isdir(self.root):
            raise NotADirectoryError(
                errno.ENOTDIR,
                f"checkpoint root {root} is a file or device, expected a directory (or a path where one can be made)",
                root,
            )
        self.keep = keep
        self.keep_best = check_best(keep_best)
        self.threads = threads
        self.max_file_bytes = max_file_bytes
        self.stale_after_s = stale_after_s
        self.moments_dtype = moments_dtype
        self.per_rank = frozenset(per_rank)
        self.background_nice = background_nice
        self.background_threads = background_threads
        self.probe = probe
        self.probe_rtol = probe_rtol
        self.verify_after_save = verify_after_save
        self.compress = compress_mod.check_setting(compress)
        self._clock = clock
        self._monotonic = monotonic
        self._coordinator: Any = _UNSET
        self._relay = JournalRelay()
        self.journal = journal
        self._assemble()

    def _assemble(self) -> None:
        """Make the parts, each given what it needs (see the module docs)."""
        storage, root, relay = self._storage, self.root, self._relay
        clocks = {"clock": self._clock, "monotonic": self._monotonic}
        writing: set[int] = set()  # the steps this process is saving now: never cleaned up as stale
        self.markers = Markers(storage)
        self.reader = Reader(storage, root, threads=self.threads)
        self.listing = Listing(storage, root, markers=self.markers, reader=self.reader)
        self.lifecycle = Lifecycle(
            storage,
            root,
            listing=self.listing,
            markers=self.markers,
            reader=self.reader,
            events=relay,
            keep=self.keep,
            keep_best=self.keep_best,
            stale_after_s=self.stale_after_s,
            writing=writing,
            clock=self._clock,
        )
        self.measurements = Measurements(compress=self.compress)
        self.arena = Arena(**clocks)
        self.planner = Planner(
            per_rank=self.per_rank,
            threads=self.threads,
            max_file_bytes=self.max_file_bytes,
            moments_dtype=self.moments_dtype,
            coordinator=self._find_coordinator,
            events=relay,
        )
        self.saver = Saver(
            storage,
            root,
            arena=self.arena,
            planner=self.planner,
            measurements=self.measurements,
            listing=self.listing,
            lifecycle=self.lifecycle,
            markers=self.markers,
            events=relay,
            coordinator=self._find_coordinator,
            writing=writing,
            threads=self.threads,
            background_threads=self.background_threads,
            background_nice=self.background_nice,
            probe=self.probe,
            verify_after_save=self.verify_after_save,
            **clocks,
        )
        self.prestager = Prestager(
            arena=self.arena,
            planner=self.planner,
            listing=self.listing,
            saver=self.saver,
            coordinator=self._find_coordinator,
            events=relay,
            **clocks,
        )

    def __repr__(self) -> str:
        return f"Checkpointer({self.root!r}, keep={self.keep})"

    @property
    def storage(self) -> Storage:
        """Where the checkpoints are written and read."""
        return self._storage

    @storage.setter
    def storage(self, storage: Storage) -> None:
        # the parts that write and list use it from now on; the markers and the reader keep the one they were made
        # with (as a root's marker files and reads must stay on one storage)
        self._storage = storage
        self.listing.storage = self.lifecycle.storage = self.saver.storage = storage

    @property
    def journal(self) -> Journal | None:
        """Where saves, fallbacks and rotations are recorded (`Run` sets it)."""
        return self._relay.journal

    @journal.setter
    def journal(self, journal: Journal | None) -> None:
        self._relay.journal = journal
        self.events: EventSink = journal if journal is not None else NullSink()

    @property
    def coordinator(self) -> dist.Coordinator | None:
        """The job's store coordinator (several ranks under torchrun), found at first use; else None."""
        if self._coordinator is _UNSET:
            self._coordinator = dist.coordinator()
        coordinator: dist.Coordinator | None = self._coordinator
        return coordinator

    def _find_coordinator(self) -> dist.Coordinator | None:
        return self.coordinator

    # what saves measured (see the class docs) --------------------------------------------------------------
    @property
    def bandwidth(self) -> float | None:
        return self.measurements.bandwidth

    @bandwidth.setter
    def bandwidth(self, value: float | None) -> None:
        self.measurements.bandwidth = value

    @property
    def storage_bandwidth(self) -> float | None:
        return self.measurements.storage_bandwidth

    @storage_bandwidth.setter
    def storage_bandwidth(self, value: float | None) -> None:
        self.measurements.storage_bandwidth = value

    @property
    def fixed_s(self) -> float:
        """Seconds a save takes besides its bytes (directory creation, fsyncs, the commit marker)."""
        return self.measurements.fixed_s

    @property
    def compression(self) -> compress_mod.Measured | None:
        """This state's compression ratio and speed, sampled at the first save that asks, refined by each
        compressed save."""
        return self.measurements.compression

    @property
    def last_choice(self) -> compress_mod.Choice | None:
        """The last save's compression choice."""
        return self.measurements.last_choice

    @property
    def steady(self) -> SteadyPlans:
        """The steady state's plans (see `preemptible.checkpoint.steady`): ``steady.hits`` saves reused one."""
        return self.planner.steady

    def predict(self, nbytes: int) -> float | None:
        """Seconds a save of ``nbytes`` should take from here, by the bandwidth recent saves measured."""
        return self.measurements.predict(nbytes)

    # paths and listing ---------------------------------------------------------------------------------------
    def path_of(self, step: int) -> str:
        return self.listing.path_of(step)

    def files_dir(self, step: int) -> str:
        """Where the files of committed checkpoint ``step`` are: its directory, or on an object store the attempt
        prefix inside it that its COMMIT.json names (``step-N/a-<token>/``)."""
        return self.listing.files_dir(step)

    def is_committed(self, step: int) -> bool:
        return self.listing.is_committed(step)

    def checkpoints(self, *, include_uncommitted: bool = False) -> list[CheckpointInfo]:
        """Every committed checkpoint under the root, oldest first (and leftovers, if asked)."""
        return self.listing.checkpoints(include_uncommitted=include_uncommitted)

    def latest(self) -> int | None:
        """The newest committed step, or None."""
        return self.listing.latest()

    # lifecycle: verification, rotation, cleanup (see `Lifecycle`) -----------------------------------------------
    def rotate(self, *, just_saved: Job | None = None) -> list[int]:
        """Apply retention (`preemptible.store.retention`): delete committed checkpoints it allows to go, and stale
        leftovers. A checkpoint goes only once a newer one has validated; when older ones wait for that, the one
        ``just_saved`` is verified first (its files read back). Returns the deleted steps."""
        return self.lifecycle.rotate(just_saved=just_saved)

    def cleanup(self, infos: list[CheckpointInfo] | None = None) -> list[int]:
        """Delete uncommitted leftovers older than ``stale_after_s``; younger ones may still be being written."""
        return self.lifecycle.cleanup(infos)

    def verify(self, step: int, *, mark: bool = True) -> CheckpointInfo:
        """Fully verify checkpoint ``step``: manifest, sizes, headers, every checksum; record the verdict.

        A pass marks it validated, unless it carries a probe value (that needs the model: the next restore checks
        it, and until then it stays ``committed``). A content failure marks it invalid (removing any earlier
        ``VALID.json``). An I/O error marks nothing. ``mark=False`` leaves every file untouched.

        Raises:
            CheckpointNotFoundError: no committed checkpoint ``step``.
            CheckpointCorruptError: it failed verification.
            OSError: it could not be verified.
        """
        return self.lifecycle.verify(step, mark=mark)

    def verify_report(self, step: int, *, mark: bool = True) -> tuple[CheckpointInfo, list[str]]:
        """`verify`, plus notes that do not fail it (files the manifest does not list, a probe left to check)."""
        return self.lifecycle.verify_report(step, mark=mark)

    def mark_finished(self, step: int) -> None:
        """Leave ``DONE.json`` in the root: the run finished all its steps (a wrapper tells "done" from "preempted")."""
        self.lifecycle.mark_finished(step)

    def clear_finished(self) -> None:
        """Remove ``DONE.json``: the run is training again."""
        self.lifecycle.clear_finished()

    def quarantine(self) -> str | None:
        """Move every checkpoint directory aside to ``<root>/quarantine/<utc>/`` (for a deliberate fresh start
        when none verifies: kept for inspection, out of the way of new saves). Returns where, or None."""
        return self.lifecycle.quarantine()

    # staging and pre-staging (see `Prestager`) ---------------------------------------------------------------
    @property
    def staging(self) -> Staging:
        """The reused staging buffers of background saves (laid out at first use)."""
        return self.arena.staging

    def prestage(self, state: Mapping[str, Any], step: int) -> bool:
        """Copy ``state`` into the staging buffer without writing it (for a later `flush_staged`).

        Returns False (and does nothing) while a background save is still writing from the buffer: the buffer
        then holds that save's step, which is as recent.
        """
        return self.prestager.prestage(state, step)

    def flush_staged(self, *, reason: str = SaveReason.PRESTAGED, deadline: float | None = None) -> SaveHandle | None:
        """Write what the staging buffer holds as the checkpoint of its step, in the background.

        Returns None when the buffer is empty, or its step is already committed or being written.
        """
        return self.prestager.flush_staged(reason=reason, deadline=deadline)

    # saving ------------------------------------------------------------------------------------------------
    def save(
        self,
        state: Mapping[str, Any],
        step: int,
        *,
        blocking: bool = True,
        reason: str = SaveReason.MANUAL,
        deadline: float | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> SaveHandle:
        """Write ``state`` as the checkpoint of ``step`` and commit it.

        ``blocking=True`` writes straight from the live tensors (training must not change them meanwhile: this
        is the emergency path) and returns a finished handle. ``blocking=False`` copies the state into the reused
        staging buffers (the only stall) and writes in the background thread ``preemptible-writer``; the live
        objects may change as soon as it returns. One asynchronous save runs at a time: a new one first waits
        for the previous one.

        A step that is already committed is not written again (``SaveResult.skipped``), unless it is marked
        invalid: a new save replaces it. Uncommitted leftovers of the same step are removed first. After a save
        other than an emergency one, retention runs (see `rotate`).

        Args:
            state: names to stateful objects or dicts (see `preemptible.state`).
            step: completed steps (the next step to run after a restore).
            blocking: see above.
            reason: recorded in the journal, one of `SaveReason` (``manual``, ``periodic``, ``emergency``, ``final``,
                ``advisory``, ``best``, ...).
            deadline: epoch seconds by which the save must be durable, for the journal's budget figures.
            extra: additional JSON keys for COMMIT.json.

        Raises:
            SaveError: an I/O failure (disk full, permission); nothing was committed. From ``wait()`` when async.
            UnsupportedStateError: a leaf that cannot be stored, naming its key.
            StateDivergenceError: state taken as replicated differs between ranks (not in an emergency save).
        """
        check_state(state)
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 10**layout.STEP_DIGITS:
            raise ValueError(
                f"expected a step from 0 to {10**layout.STEP_DIGITS - 1} (the layout's width), found {step!r}"
            )
        with gc_paused():
            try:
                return self.saver.save(
                    state, step, blocking=blocking, reason=str(reason), deadline=deadline, extra=extra
                )
            finally:
                self.saver.release()  # the writer starts once the caller has its thread back

    def prepare(self, state: Mapping[str, Any], *, arena: bool = False) -> bool:
        """Make the plan of a save of ``state`` ahead of it, writing nothing: its tensor names and files and each
        file's safetensors header (`preemptible.checkpoint.steady`), so that a save soon after, while the state
        keeps its shape, only refills it. `Run` calls it after its first step, so that even an emergency save
        before any periodic one starts from a made plan. One process only (False under several ranks, and for
        states only the general path handles). Raises what a save would (`UnsupportedStateError`).

        ``arena``: also lay out the staging arena for the state, its pages touched, where a blocking save would
        use it (`Arena.stage_blocking`: GPU tensors, or CPU tensors mostly small): for a run whose background saves will
        allocate it anyway at their first save, so that an emergency save before that one goes through it too
        (10,000 small CPU tensors, 120 MB: 0.77 of the same bytes' throughput without it, about 0.85 with it)."""
        if self.coordinator is not None:  # the steady state's plans are one process's
            return False
        check_state(state)
        with gc_paused():
            plan = self.planner.plan(state, key="prepare", reason="prepare")
            if plan.layout_token is None:
                return False
            for spec in plan.specs:
                tensor_format.prepare(spec.items, METADATA, stored=spec.stored, prepared=spec.prepared)
        if arena and (not plan.all_cpu() or self.arena.mostly_small(plan)):
            self.staging.lay_out(plan)
        return True

    @property
    def inflight(self) -> SaveHandle | None:
        """The asynchronous save still writing, or None."""
        return self.saver.inflight

    # loading -----------------------------------------------------------------------------------------------
    def load(self, step: int, *, into: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any]:
        """Read and fully verify checkpoint ``step``.

        Args:
            into: optional live tensors by stored name (``model/fc.weight``): each one whose dtype and shape match
                and that is a contiguous CPU tensor is read into directly, without a fresh allocation.

        Raises:
            CheckpointNotFoundError: no committed checkpoint of that step.
            CheckpointCorruptError: anything fails verification, naming the file and the reason.
        """
        return self.reader.read(self.reader.open(step), into)

    def restore(self, state: Mapping[str, Any], step: int | None = None) -> int | None:
        """Load the newest committed checkpoint that verifies into ``state``, in place.

        Every entry of ``state`` must be in the checkpoint (extra entries in the checkpoint are ignored), with
        matching tensor keys, shapes and dtypes; that is checked from the headers before a single live byte
        changes. Tensor data is then read straight into the live tensors where dtype and shape match (no fresh
        allocation), verifying every checksum on the way. A checkpoint that fails a content check is marked
        invalid and skipped with a `CheckpointFallbackWarning`, and the next newest is read over it; one that
        cannot be read (an I/O error) is skipped unmarked. The one restored is marked validated. If none
        verifies, the live objects may hold part of a rejected checkpoint: do not train on them.

        Args:
            state: names to stateful objects or dicts, as given to `save`.
            step: restore exactly this step (no fallback).

        Returns:
            The restored step, or None when the root holds no committed checkpoint.

        Raises:
            CheckpointCorruptError: committed checkpoints exist but none verifies (lists each and why).
            CheckpointNotFoundError: ``step`` was given and is not committed.
            StateMismatchError: the checkpoint does not fit the live objects (names every difference).
            OSError: none could be restored and some could not even be read (nothing was marked).
        """
        check_state(state)
        infos = self.checkpoints()
        if step is not None and not any(c.step == step for c in infos):
            raise CheckpointNotFoundError(
                f"no committed checkpoint of step {step} under {self.root}; committed steps: "
                f"{[c.step for c in infos] or 'none'}",
                path=self.path_of(step),
                step=step,
            )
        chosen = [c for c in reversed(infos) if step is None or c.step == step]
        if not chosen:
            return None
        candidates = [
            Candidate(c.step, State.INVALID if c.invalid is not None else State.COMMITTED, c.invalid) for c in chosen
        ]
        restorer = Restorer(
            self.reader,
            self.markers,
            coordinator=self.coordinator,
            events=self.events,
            probe=self.probe,
            probe_rtol=self.probe_rtol,
            monotonic=self._monotonic,
            now=self._now,
        )
        with gc_paused():
            return restorer.restore(state, candidates, explicit=step is not None)

    def _now(self) -> str:
        return layout.now_iso(self._clock())
