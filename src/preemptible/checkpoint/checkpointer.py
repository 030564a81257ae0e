"""The Checkpointer façade: save, list, verify, rotate and restore committed checkpoints under one root.

Each concern lives in its own module: `partition` (which rank writes what), `commit` (the commit protocol and
its barrier), `reader` (reading untrusted checkpoints), `restore` (fallback), `handle` (`SaveHandle`); the
lifecycle's marker files in `preemptible.store.markers`, retention in `preemptible.store.retention`, deletion in
`preemptible.store.deletion`. This class holds the configuration and ties them together.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch

from preemptible import dist
from preemptible.checkpoint.commit import Committer, Job, save_error
from preemptible.checkpoint.handle import SaveHandle, SaveResult
from preemptible.checkpoint.lifecycle import Lifecycle
from preemptible.checkpoint.partition import check_replicated, plan_share
from preemptible.checkpoint.partition import split as split_state
from preemptible.checkpoint.prestage import Prestaging
from preemptible.checkpoint.reader import Reader
from preemptible.checkpoint.restore import Candidate, Restorer
from preemptible.checkpoint.steady import SteadyPlans
from preemptible.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    NotRegularFileError,
    SaveCancelled,
    SaveError,
)
from preemptible.events import Event, EventSink, NullSink, SaveReason
from preemptible.journal import Journal
from preemptible.notice import Clock
from preemptible.progress import Meter
from preemptible.state import capture, check_state, flatten, gc_paused
from preemptible.store import compress as compress_mod
from preemptible.store import deletion, direct, layout
from preemptible.store import format as tensor_format
from preemptible.store.io import Storage, storage_for
from preemptible.store.layout import CheckpointInfo
from preemptible.store.markers import Markers, State, Transition
from preemptible.validate import DEFAULT_RTOL, Probe, run_probe
from preemptible.writer import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_THREADS,
    METADATA,
    ArenaFill,
    FileSpec,
    PlanChanged,
    Progress,
    SavePlan,
    Staged,
    Staging,
)

log = logging.getLogger("preemptible")

OBJECT_STORE_THREADS = 8
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


def _cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _lower_priority(nice: int) -> None:
    """Lower this thread's CPU priority (Linux: nice is per thread, inherited by threads it starts), so a
    background save takes the cycles training leaves idle instead of stalling its parallel kernels."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


class Checkpointer(Lifecycle, Prestaging):
    """Saves and restores training state under ``root``.

    Args:
        root: a local directory (created on first save).
        keep: committed checkpoints to keep (>= 2), besides the newest validated one.
        keep_best: ``(figure, "min" | "max")``: also keep the checkpoint whose ``COMMIT.json`` records the best
            value of that figure (``extra={"figures": {...}}`` at save; `Run` records what ``run.log`` logged).
        journal: where to record saves and fallbacks (optional).
        threads: writer threads for tensor files.
        max_file_bytes: split tensor files larger than this.
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
            costs a full read of the checkpoint; see the README for the measured cost).
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
        self.storage: Storage = storage if storage is not None else storage_for(root, storage_options)
        if threads is None:  # object stores gain from many uploads at once; a disk from a few
            threads = OBJECT_STORE_THREADS if self.storage.kind == "object" else DEFAULT_THREADS
        self.root = self.storage.root
        if self.storage.kind == "local" and os.path.exists(self.root) and not os.path.isdir(self.root):
            raise NotADirectoryError(
                errno.ENOTDIR,
                f"checkpoint root {root} is a file or device, expected a directory (or a path where one can be made)",
                root,
            )
        self.keep = keep
        self.keep_best = check_best(keep_best)
        self.journal = journal
        self.threads = threads
        self.max_file_bytes = max_file_bytes
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._monotonic = monotonic
        self._writing: set[int] = set()
        self.moments_dtype = moments_dtype
        self.bandwidth: float | None = None
        self.storage_bandwidth: float | None = None
        self.fixed_s = 0.05  # directory creation, fsyncs and the commit marker: refined by every save
        self._inflight: SaveHandle | None = None
        self._go: threading.Event | None = None
        self._staging: Staging | None = None
        self._small_layout: tuple[object, bool] | None = None  # `_mostly_small`, for the last steady layout
        self.steady = SteadyPlans()
        """The steady state's plans (see `preemptible.checkpoint.steady`): ``steady.hits`` saves reused one."""
        self._coordinator: Any = _UNSET
        self.markers = Markers(self.storage)
        self.reader = Reader(self.storage, self.root, threads=threads)
        self.per_rank = frozenset(per_rank)
        self.background_nice = background_nice
        self.background_threads = background_threads
        self.probe = probe
        self.probe_rtol = probe_rtol
        self.verify_after_save = verify_after_save
        if compress not in (True, False, "auto"):
            raise ValueError(f"expected compress=True, False or 'auto', found {compress!r}")
        self.compress = compress
        self.compression: compress_mod.Measured | None = None
        """This state's compression ratio and speed, sampled at the first save that asks, refined by each
        compressed save."""
        self.last_choice: compress_mod.Choice | None = None

    def __repr__(self) -> str:
        return f"Checkpointer({self.root!r}, keep={self.keep})"

    @property
    def journal(self) -> Journal | None:
        """Where saves, fallbacks and rotations are recorded (`Run` sets it)."""
        return self._journal

    @journal.setter
    def journal(self, journal: Journal | None) -> None:
        self._journal = journal
        self.events: EventSink = journal if journal is not None else NullSink()

    @property
    def coordinator(self) -> dist.Coordinator | None:
        """The job's store coordinator (several ranks under torchrun), found at first use; else None."""
        if self._coordinator is _UNSET:
            self._coordinator = dist.coordinator()
        coordinator: dist.Coordinator | None = self._coordinator
        return coordinator

    @property
    def _leader(self) -> bool:
        coord = self.coordinator
        return coord is None or coord.rank == 0

    def _now(self) -> str:
        return layout.now_iso(self._clock())

    def _progress(self, total: int, deadline: float | None = None, *, what: str = "save") -> Progress:
        """A save's byte counter; a save that runs longer than a few seconds logs how it goes (bytes, throughput,
        time left against its deadline)."""
        progress = Progress(
            total=total, deadline=deadline, started=self._monotonic(), clock=self._clock, monotonic=self._monotonic
        )
        progress.meter = Meter(what, total, bar=False, deadline=deadline, clock=self._clock, monotonic=self._monotonic)
        return progress

    # paths and listing ---------------------------------------------------------------------------------------
    def path_of(self, step: int) -> str:
        return self.storage.join(self.root, layout.step_dir(step))

    def files_dir(self, step: int) -> str:
        """Where the files of committed checkpoint ``step`` are: its directory, or on an object store the attempt
        prefix inside it that its COMMIT.json names (``step-N/a-<token>/``)."""
        return self.reader.manifest(step).file_dir(self.storage.join, self.path_of(step))

    def is_committed(self, step: int) -> bool:
        return self.storage.exists(self.storage.join(self.path_of(step), layout.COMMIT))

    def checkpoints(self, *, include_uncommitted: bool = False) -> list[CheckpointInfo]:
        """Every committed checkpoint under the root, oldest first (and leftovers, if asked)."""
        out = []
        for name in self.storage.listdir(self.root):
            step = layout.parse_step_dir(name)
            attempt = layout.parse_attempt_dir(name)
            if step is None and attempt is None:
                continue
            path = self.storage.join(self.root, name)
            target = self.storage.escapes(path)
            if target is not None:
                if include_uncommitted:
                    where = "inside the root" if target.startswith(self.root.rstrip("/") + "/") else "outside the root"
                    why = f"{name} is a link to {target}, {where}: never read, restored or deleted through"
                    out.append(CheckpointInfo(step=step or attempt or 0, path=path, committed=False, refused=why))
                continue
            if not self.storage.isdir(path):
                continue
            if attempt is not None:  # a local save attempt that never got renamed into place
                if include_uncommitted:
                    out.append(CheckpointInfo(step=attempt, path=path, committed=False, bytes=self._bytes_in(path)))
                continue
            assert step is not None
            info = self._info(step, path)
            if info.committed or include_uncommitted:
                out.append(info)
            if include_uncommitted and info.manifest is not None and info.manifest.prefix:
                out += self._losing_attempts(info)
        return sorted(out, key=lambda c: (c.step, c.committed))

    def _bytes_in(self, path: str) -> int:
        size = 0
        for name in self.storage.listdir(path):
            with contextlib.suppress(OSError):
                size += self.storage.size(self.storage.join(path, name))
        return size

    def _losing_attempts(self, info: CheckpointInfo) -> list[CheckpointInfo]:
        """Object stores: attempt prefixes under a committed step that its COMMIT.json does not name."""
        assert info.manifest is not None
        return [
            CheckpointInfo(step=info.step, path=p, committed=False, bytes=self._bytes_in(p))
            for name in self.storage.listdir(info.path)
            if layout.PREFIX_RE.fullmatch(name) and name != info.manifest.prefix
            for p in [self.storage.join(info.path, name)]
        ]

    def _info(self, step: int, path: str) -> CheckpointInfo:
        try:
            verdict = self.markers.read(path)
        except NotRegularFileError as e:  # COMMIT.json itself a link out of the root, or not a file
            return CheckpointInfo(step=step, path=path, committed=True, error=str(e))
        if verdict.state is State.UNCOMMITTED:
            return CheckpointInfo(step=step, path=path, committed=False, bytes=self._bytes_in(path))
        validated = verdict.state is State.VALIDATED
        try:
            manifest = self.reader.manifest(step)
        except CheckpointCorruptError as e:
            return CheckpointInfo(
                step=step, path=path, committed=True, validated=validated, error=str(e), invalid=verdict.invalid_reason
            )
        except CheckpointNotFoundError:  # deleted a moment ago (rotation): no longer a checkpoint
            return CheckpointInfo(step=step, path=path, committed=False)
        return CheckpointInfo(
            step=step,
            path=path,
            committed=True,
            validated=validated,
            bytes=manifest.total_bytes,
            created=manifest.created,
            save_s=manifest.timings.get("total"),
            predicted_save_s=manifest.predicted_save_s,
            manifest=manifest,
            invalid=verdict.invalid_reason,
        )

    def latest(self) -> int | None:
        """The newest committed step, or None."""
        infos = self.checkpoints()
        return infos[-1].step if infos else None

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
            reason: recorded in the journal: ``periodic``, ``emergency``, ``final``, ``manual``.
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
                return self._save(state, step, blocking=blocking, reason=str(reason), deadline=deadline, extra=extra)
            finally:
                go, self._go = self._go, None
                if go is not None:
                    go.set()  # the writer starts once the caller has its thread back
                if self._staging is not None:
                    self._staging.drop_early()  # a background save that failed before staging: nothing left running

    def _save(
        self,
        state: Mapping[str, Any],
        step: int,
        *,
        blocking: bool,
        reason: str,
        deadline: float | None,
        extra: Mapping[str, Any] | None,
    ) -> SaveHandle:
        start = self._monotonic()
        path = self.path_of(step)
        self._wait_inflight(reason)
        verdict = self.markers.read(path)
        if verdict.state in (State.COMMITTED, State.VALIDATED):
            self.events.event(Event.SAVE_SKIPPED, step, reason=reason, why="already committed")
            return SaveHandle(step, result=SaveResult(step=step, path=path, bytes=0, seconds=0.0, skipped=True))
        key = self.coordinator.round("save") if self.coordinator is not None else "save/0"
        # A background save's copy into the staging arena starts while its plan is checked (`Staging.begin`):
        # not with a probe, which runs the model on the live state before it is copied.
        early = self.staging.begin if not blocking and self.probe is None else None
        # Checks the whole state before any write; but a blocking refill of CPU tensors checks its tensors while
        # its files are written, and commits only if they fit (`SavePlan.check`).
        plan = self._plan(state, key=key, reason=reason, early=early, defer=blocking and self.probe is None)
        if verdict.state is State.INVALID and self._leader:
            log.info("replacing the checkpoint of step %d, marked invalid (%s)", step, verdict.invalid_reason)
            deletion.delete_checkpoint(self.storage, self.root, step, verdict.state, transition=Transition.REPLACE)
        probe_value = self._probe_at_save(state, step)
        t_probe = self._monotonic() - start
        budget = deadline - self._clock() if deadline is not None else None
        predicted = self.predict(plan.nbytes)
        choice, codec = self._codec(plan, background=not blocking)
        if choice.on and choice.compressed_s is not None and predicted is not None:
            predicted = round(choice.compressed_s + self.fixed_s, 3)  # as it will be written: compressed
        job = Job(
            step=step,
            path=path,
            reason=reason,
            start=start,
            extra={**(extra or {}), **_transformers_configs(state), "predicted_save_s": predicted},
            budget=budget,
            deadline=deadline,
            progress=self._progress(plan.nbytes, deadline, what=f"{reason} save of step {step}"),
            probe=probe_value,
            key=key,
            codec=codec,
            choice=choice,
        )
        if self.probe is not None:
            job.timings["probe"] = t_probe
        if not blocking:
            return self._save_async(plan, job)
        self.events.event(
            Event.SAVE_STARTED,
            step,
            reason=reason,
            budget_s=budget,
            bytes=plan.nbytes,
            predicted_s=predicted,
            compress=choice.to_json(),
            plan=self.steady.last,
        )
        job.timings["capture"] = self._monotonic() - start
        try:
            staging = self._stage_blocking(plan, step, lazily=job.codec is None)
            if staging is not None:
                staged, fills = staging
                try:
                    job.timings["stage"] = staged.seconds
                    job.check, job.fills = plan.check, fills
                    result = self._write_and_commit(job, staged.specs, staged.docs, blobs=staged.blobs)
                    if fills is not None:  # every file written: the arena holds the whole state
                        self.staging.current = staged
                except PlanChanged:
                    self.staging.current = None  # the arena holds tensors that did not fit: never flushed
                    raise
                finally:
                    self.staging.busy.release()
            else:
                job.check = plan.check
                result = self._write_and_commit(job, plan.specs, plan.docs, blobs=None)
        except PlanChanged:  # thrown away: planned again, checked first this time
            log.info("step %d: the state changed its tensors since the last save; planning it again", step)
            plan = self._plan(state, key=key, reason=reason)
            job.check = None
            job.progress = self._progress(plan.nbytes, deadline, what=f"{reason} save of step {step}")
            job.choice, job.codec = self._codec(plan, background=False)
            result = self._write_and_commit(job, plan.specs, plan.docs, blobs=None)
        return SaveHandle(step, result=result, progress=job.progress)

    def _stage_blocking(
        self, plan: SavePlan, step: int, *, lazily: bool
    ) -> tuple[Staged, dict[str, ArenaFill] | None] | None:
        """For a blocking save, when the staging arena is laid out for its tensors already (background saves of
        this state came before) and is free: copy them into it and write its page-aligned regions, where that
        beats writing each tensor from its own memory:

        - GPU tensors: device-to-host at the bus's speed, on side streams, instead of one pageable ``.cpu()`` copy
          per tensor (about 40x slower on an H200); all of them before the writes;
        - CPU tensors, most of whose bytes are in small ones (`_mostly_small`): the writers would copy those
          anyway, gathering them one memmove at a time under the GIL (threads that write take turns at it); the
          arena copy is one ``_foreach_copy_`` per piece, which lets it go. With ``lazily`` (an uncompressed
          save), each writer copies a piece just before writing it (`Staging.stage_lazily`, returned ``fills``).

        The plan's deferred check (`SavePlan.check`) is left to the writes of the staged bytes, as on the unstaged
        path: made during a copy before them, it took a core from it (10,000 tensors: 7 ms of checking, the copy
        16 ms alone and 23 ms beside it). A copy that fails (a tensor that changed shape) is checked at once:
        `PlanChanged`. Never allocates an arena here: an emergency is no time to take the state's size in host
        memory (pinned, for GPU tensors). Returns the staged state and its fills (``staging.busy`` held), or
        None."""
        staging = self._staging
        if staging is None or not staging.fits(plan.specs, plan.layout_token):
            return None
        on_cpu = plan.all_cpu()
        if on_cpu and not self._mostly_small(plan):
            return None
        if not staging.busy.acquire(blocking=False):  # a background save is writing from it
            return None
        try:
            if on_cpu and lazily:
                return staging.stage_lazily(plan, step=step)
            try:
                return staging.stage(plan, step=step), None
            except RuntimeError:
                if plan.check is not None and not plan.check():
                    raise PlanChanged from None
                raise
        except BaseException:
            staging.busy.release()
            raise

    def _mostly_small(self, plan: SavePlan) -> bool:
        """Whether at least half the plan's bytes are in tensors under `tensor_format.SMALL_TENSOR_BYTES` (asked once
        per steady-state layout: 10,000s of tensors)."""
        token = plan.layout_token
        known = self._small_layout
        if token is not None and known is not None and known[0] is token:
            return known[1]
        sizes = [t.nbytes for spec in plan.specs for _, t in spec.items]
        small = sum(n for n in sizes if n < tensor_format.SMALL_TENSOR_BYTES)
        verdict = 2 * small >= sum(sizes) > 0
        self._small_layout = (token, verdict) if token is not None else None
        return verdict

    def _plan(
        self,
        state: Mapping[str, Any],
        *,
        key: str,
        reason: str,
        early: Callable[[object, list[torch.Tensor]], object] | None = None,
        defer: bool = False,
    ) -> SavePlan:
        """This rank's share of the save, after checking that replicated state is the same on every rank.
        ``early``, ``defer``: see `SteadyPlans.plan`."""
        coord = self.coordinator
        world, me = (coord.world, coord.rank) if coord is not None else (1, 0)
        captured = capture(state)

        def general(tree: Mapping[str, Any]) -> SavePlan:
            flat = flatten(tree)
            split = split_state(flat, state, self.per_rank, world=world, rank=me)
            if coord is not None:
                split = check_replicated(coord, flat, set(state), split, key=key, reason=reason, events=self.events)
            return plan_share(
                state,
                flat,
                split,
                threads=self.threads,
                max_file_bytes=self.max_file_bytes,
                moments_dtype=self.moments_dtype,
            )

        # The steady state of one process: the plan of the last save, refilled. Not made for an emergency save:
        # the process stops after it, and making the template costs as much again as the plan it refills
        # (10,000 tensors: 50 of 200 ms).
        if world == 1 and (reason != SaveReason.EMERGENCY or self.steady.remembers):
            config = (self.threads, self.max_file_bytes, self.moments_dtype, [(k, type(v)) for k, v in state.items()])
            plan = self.steady.plan(state, captured, config, general, early, defer=defer)
            if plan is not None:
                return plan
        self.steady.last = "general"
        return general(captured)

    def _codec(self, plan: SavePlan, *, background: bool) -> tuple[compress_mod.Choice, compress_mod.Codec | None]:
        """Whether this save compresses (see `compress_mod.choose`), and the codec that does it."""
        threads = self.background_threads if background else self.threads
        object_store = self.storage.kind == "object"
        if (
            self.compress == "auto"
            and self.compression is None
            and plan.nbytes >= compress_mod.MIN_AUTO_BYTES
            and compress_mod.weighed_bandwidth(self.storage_bandwidth, object_store=object_store) is not None
        ):
            self.compression = compress_mod.measure(
                (t, spec.stored.get(n, t.dtype)) for spec in plan.specs for n, t in spec.items
            )
        choice = compress_mod.choose(
            plan.nbytes,
            setting=self.compress,
            measured=self.compression,
            bandwidth=self.storage_bandwidth,
            threads=threads,
            cores=_cores(),
            background=background,
            object_store=object_store,
        )
        self.last_choice = choice
        if not choice.on:
            return choice, None
        return choice, compress_mod.Codec(threads=1 if background else max(1, min(threads, _cores())))

    def _learn(self, codec: compress_mod.Codec) -> dict[str, Any]:
        """What a compressed save measured of this state: its ratio and its compression speed."""
        stats = codec.stats
        if not stats.decoded:
            return {}
        if stats.encode_s > 0:
            ratio, rate = stats.stored / stats.decoded, stats.decoded / stats.encode_s
            old = self.compression
            if old is not None:
                ratio, rate = 0.5 * (old.ratio + ratio), 0.5 * (old.rate + rate)
            self.compression = compress_mod.Measured(ratio, rate, stats.decoded)
        return {
            "decoded_bytes": stats.decoded,
            "stored_bytes": stats.stored,
            "ratio": round(stats.stored / stats.decoded, 4),
            "encode_cpu_s": round(stats.encode_s, 4),
            "io_s": round(stats.io_s, 4),
        }

    def _probe_at_save(self, state: Mapping[str, Any], step: int) -> float | None:
        """The probe's value on the weights being saved (None without a probe; non-finite values are kept out of
        the manifest, with a warning, since they cannot validate anything)."""
        if self.probe is None:
            return None
        value = run_probe(self.probe, state)
        if not math.isfinite(value):
            log.warning(
                "the probe returned %r at step %d: this checkpoint cannot be validated by its probe", value, step
            )
            return None
        return value

    def _wait_inflight(self, reason: str) -> None:
        handle = self._inflight
        if handle is None:
            return
        t0 = self._monotonic()
        with contextlib.suppress(Exception):  # its failure belongs to its own handle
            handle.wait()
        waited = self._monotonic() - t0
        self._inflight = None
        if waited > 0.5 and reason != SaveReason.EMERGENCY:
            log.warning(
                "%s save waited %.1f s for the background save of step %d: saves come faster than the storage "
                "absorbs them; a larger save_every (or save_interval_s) stops stalling training",
                reason,
                waited,
                handle.step,
            )

    def prepare(self, state: Mapping[str, Any], *, arena: bool = False) -> bool:
        """Make the plan of a save of ``state`` ahead of it, writing nothing: its tensor names and files and each
        file's safetensors header (`preemptible.checkpoint.steady`), so that a save soon after, while the state
        keeps its shape, only refills it. `Run` calls it after its first step, so that even an emergency save
        before any periodic one starts from a made plan. One process only (False under several ranks, and for
        states only the general path handles). Raises what a save would (`UnsupportedStateError`).

        ``arena``: also lay out the staging arena for the state, its pages touched, where a blocking save would
        use it (`_stage_blocking`: GPU tensors, or CPU tensors mostly small): for a run whose background saves will
        allocate it anyway at their first save, so that an emergency save before that one goes through it too
        (10,000 small CPU tensors, 120 MB: 0.77 of the same bytes' throughput without it, about 0.85 with it)."""
        if self.coordinator is not None:  # the steady state's plans are one process's
            return False
        check_state(state)
        with gc_paused():
            plan = self._plan(state, key="prepare", reason="prepare")
            if plan.layout_token is None:
                return False
            for spec in plan.specs:
                tensor_format.prepare(spec.items, METADATA, stored=spec.stored, prepared=spec.prepared)
        if arena and (not plan.all_cpu() or self._mostly_small(plan)):
            self.staging.lay_out(plan)
        return True

    def predict(self, nbytes: int) -> float | None:
        """Seconds a save of ``nbytes`` should take from here, by the bandwidth recent saves measured."""
        if not self.bandwidth:
            return None
        return round(nbytes / self.bandwidth + self.fixed_s, 3)

    @property
    def inflight(self) -> SaveHandle | None:
        """The asynchronous save still writing, or None."""
        handle = self._inflight
        return handle if handle is not None and not handle.done() else None

    def _save_async(self, plan: SavePlan, job: Job) -> SaveHandle:
        staging = self.staging
        if not staging.early:  # an early copy holds it already
            staging.busy.acquire()
        try:
            staged = staging.stage(plan, step=job.step)
        except BaseException:
            staging.busy.release()
            raise
        job.deadline = None
        job.progress = self._progress(staged.nbytes, what=f"{job.reason} save of step {job.step} (background)")
        job.timings["capture"] = self._monotonic() - job.start
        job.timings["stall"] = job.timings["capture"]
        self.events.event(
            Event.SAVE_STARTED,
            job.step,
            reason=job.reason,
            budget_s=job.budget,
            bytes=staged.nbytes,
            asynchronous=True,
            stall_s=round(job.timings["stall"], 6),
            predicted_s=job.extra.get("predicted_save_s"),
            compress=job.choice.to_json() if job.choice is not None else None,
            plan=self.steady.last,
        )
        self._go = threading.Event()
        return self._spawn(job, staged, go=self._go)

    def _spawn(self, job: Job, staged: Staged, *, go: threading.Event | None = None) -> SaveHandle:
        """Write ``staged`` in the background; the caller holds ``staging.busy``, released when writing ends.
        ``go``: the writer waits for it first. A new thread that runs Python at once keeps the GIL from the thread
        that started it for up to a switch interval (5 ms), which `save` would add to the training loop's stall."""
        handle = SaveHandle(job.step, progress=job.progress)
        handle.asynchronous = True

        def body() -> None:
            if go is not None:
                go.wait()
            _lower_priority(self.background_nice)
            try:
                handle._result = self._write_and_commit(
                    job, staged.specs, staged.docs, blobs=staged.blobs, threads=self.background_threads
                )
            except BaseException as e:
                handle._error = e
            finally:
                self.staging.busy.release()
            if handle._error is None:  # committed: now, unhurried, the buffers an emergency save's threads need
                with contextlib.suppress(OSError):  # no memory to map them: an emergency save makes its own
                    direct.PooledBuffer.reserve(direct.BUFFERS_PER_WRITER * self.threads)

        handle._thread = threading.Thread(target=body, name="preemptible-writer")
        handle._thread.start()
        self._inflight = handle
        return handle

    def _write_and_commit(
        self,
        job: Job,
        specs: list[FileSpec],
        docs: dict[str, bytes],
        *,
        blobs: dict[str, memoryview] | None,
        threads: int | None = None,
    ) -> SaveResult:
        self._writing.add(job.step)
        committer = Committer(
            self.storage,
            self.root,
            coordinator=self.coordinator,
            clock=self._clock,
            monotonic=self._monotonic,
            verify_after_save=self.verify_after_save,
        )
        try:
            result = committer.write(job, specs, docs, blobs, threads or self.threads)
        except BaseException as e:
            if job.codec is not None:
                job.codec.close()
            if self._leader and job.write_dir:
                self._abandon(job.write_dir)  # this attempt's own files only: never a committed step's
            if isinstance(e, PlanChanged):
                raise
            if isinstance(e, SaveCancelled):
                self.events.event(Event.SAVE_ABANDONED, job.step, reason=job.reason, written=job.progress.done)
                raise
            self.events.event(Event.SAVE_FAILED, job.step, reason=job.reason, error=f"{type(e).__name__}: {e}")
            if isinstance(e, OSError) and not isinstance(e, SaveError):
                object_store = self.storage.kind == "object"
                raise save_error(
                    e, job.step, job.path, root=self.root, newest=self.latest(), object_store=object_store
                ) from e
            raise
        finally:
            self._writing.discard(job.step)
        compression: dict[str, Any] | None = None
        write_s = result.timings.get("write", 0.0)
        if job.codec is not None:
            job.codec.close()
            compression = self._learn(job.codec)
        if result.timings.get("io") and job.stored_here:  # the destination's bandwidth: stored bytes over the
            bw = job.stored_here / result.timings["io"]  # seconds it took to take them in
            old = self.storage_bandwidth
            self.storage_bandwidth = bw if old is None else 0.5 * old + 0.5 * bw
        state_bytes = job.progress.total or result.bytes  # the state's bytes, compressed or not
        if state_bytes and write_s > 0:
            bw = state_bytes / write_s
            self.bandwidth = bw if self.bandwidth is None else 0.5 * self.bandwidth + 0.5 * bw
            self.fixed_s = 0.5 * self.fixed_s + 0.5 * result.timings.get("commit", self.fixed_s)
        remaining = job.deadline - self._clock() if job.deadline is not None else None
        self.events.event(
            Event.SAVE_COMMITTED,
            job.step,
            reason=job.reason,
            bytes=result.bytes,
            seconds=round(result.seconds, 6),
            predicted_s=result.predicted_s,
            throughput_mb_s=round(result.throughput / 1e6, 3),
            timings={k: round(v, 6) for k, v in result.timings.items()},
            budget_s=job.budget,
            remaining_s=remaining,
            compression=compression,
        )
        # No rotation inside a notice window: deleting is not urgent, and the next start rotates after restore.
        if self._leader and job.reason != SaveReason.EMERGENCY:
            self.rotate(just_saved=job)  # one rank deletes; the others would race it
        if self._journal is not None:
            self._journal.sync()
        return result

    def _abandon(self, path: str) -> None:
        try:
            self.storage.remove_tree(path)
        except OSError as e:  # leftovers are harmless: invisible without COMMIT.json, cleaned later
            log.warning("could not remove the failed save's leftovers at %s (%s)", path, e)

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


def _transformers_configs(state: Mapping[str, Any]) -> dict[str, Any]:
    """COMMIT.json's ``transformers`` record: for each entry that is a Hugging Face ``PreTrainedModel``, its class
    and ``config`` (as the config writes itself to JSON), so `preemptible export --format hf` can write a
    ``save_pretrained`` directory. Empty when there is none (nothing is imported to find out)."""
    out: dict[str, Any] = {}
    for name, obj in state.items():
        config = getattr(obj, "config", None)
        if config is None or not any(c.__name__ == "PreTrainedModel" for c in type(obj).__mro__):
            continue
        try:
            doc = json.loads(config.to_json_string(use_diff=False))
        except (AttributeError, TypeError, ValueError) as e:  # an odd config: the save goes on without it
            log.warning("entry %r: its config cannot be recorded for export --format hf (%s)", name, e)
            continue
        out[name] = {"class": type(obj).__name__, "module": type(obj).__module__, "config": doc}
    return {"transformers": out} if out else {}
