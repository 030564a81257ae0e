"""Checkpointer: save, list, verify and restore committed checkpoints under one root.

The commit protocol (DESIGN.md): data files go straight into ``step-N/``, each made durable; ``COMMIT.json``
is published last. A directory without it is invisible to restore. Restore verifies every checksum *before*
touching the live objects, so a bad checkpoint never half-loads, and falls back to the next newest one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from preemptible import dist
from preemptible.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    SaveError,
    StateMismatchError,
)
from preemptible.journal import Journal
from preemptible.notice import Clock
from preemptible.state import (
    RNGState,
    apply,
    capture,
    cast_moments,
    check_state,
    differences,
    flatten,
    gc_paused,
    group_of,
    select,
    unflatten,
)
from preemptible.store import checksum, layout, retention, tagged_json
from preemptible.store import format as tensor_format
from preemptible.store.io import FileTooLargeError, Storage, storage_for
from preemptible.store.layout import CheckpointInfo, FileRecord, Manifest
from preemptible.validate import DEFAULT_RTOL, Probe, ProbeCheck, run_probe
from preemptible.writer import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_THREADS,
    FileSpec,
    Progress,
    SaveCancelled,
    SavePlan,
    Staged,
    Staging,
    parallel_map,
    plan_files,
    state_json,
    write_bytes,
    write_files,
)

log = logging.getLogger("preemptible")

OBJECT_STORE_THREADS = 8
STALE_AFTER_S = 15 * 60
"""Uncommitted leftovers younger than this may belong to a machine still inside its notice window."""


@dataclass
class _Job:
    """One save on its way: what it writes and what it has measured so far."""

    step: int
    path: str
    reason: str
    start: float
    extra: dict[str, Any]
    budget: float | None
    deadline: float | None
    progress: Progress
    timings: dict[str, float] = field(default_factory=dict)
    probe: float | None = None
    seq: int = 0  # the n-th save of this process: names its keys in the store (same on every rank)


@dataclass
class _Opened:
    """A committed checkpoint whose manifest, state.json and tensor headers have been read and checked."""

    step: int
    directory: str
    manifest: Manifest
    tree: Any = None
    numpy: set[str] = field(default_factory=set)
    casts: dict[str, torch.dtype] = field(default_factory=dict)
    entries: dict[str, tensor_format.Entry] = field(default_factory=dict)
    extra_files: list[str] = field(default_factory=list)
    file_entries: dict[str, list[tensor_format.Entry]] = field(default_factory=dict)
    selected: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    dtensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    entry_owner: dict[str, int | None] = field(default_factory=dict)

    def bad(self, why: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(
            f"checkpoint of step {self.step} at {self.directory}: {why}", path=self.directory, step=self.step
        )


_UNSET: Any = object()


def assign(specs: Sequence[FileSpec], world: int) -> list[int]:
    """Which rank writes each file: largest first, to the least loaded rank. The same on every rank."""
    load = [0] * world
    owner = [0] * len(specs)
    for i in sorted(range(len(specs)), key=lambda i: (-specs[i].nbytes, specs[i].name)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += specs[i].nbytes
    return owner


def _records_doc(records: Mapping[str, FileRecord]) -> dict[str, list[Any]]:
    return {n: [r.bytes, r.checksum] for n, r in records.items()}


def _records_from(doc: Mapping[str, list[Any]]) -> dict[str, FileRecord]:
    return {n: FileRecord(int(v[0]), str(v[1])) for n, v in doc.items()}


def _lower_priority(nice: int) -> None:
    """Lower this thread's CPU priority (Linux: nice is per thread, inherited by threads it starts), so a
    background save takes the cycles training leaves idle instead of stalling its parallel kernels."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def _placeholder(meta: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in meta:
        raise CheckpointCorruptError(f"state.json refers to tensor {name!r}, which no tensor file holds", path=name)
    return meta[name]


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


class CheckpointFallbackWarning(UserWarning):
    """Restore skipped a checkpoint that failed verification and fell back to an older one."""


@dataclass(frozen=True, kw_only=True)
class SaveResult:
    """What a finished save did.

    Attributes:
        step: the step saved.
        path: its directory.
        bytes: bytes written (0 when the step was already committed).
        seconds: wall time from the call to the commit.
        timings: seconds by phase (capture, write, commit).
        skipped: True when the step was already committed and nothing was written.
    """

    step: int
    path: str
    bytes: int
    seconds: float
    timings: Mapping[str, float] = field(default_factory=dict)
    skipped: bool = False
    predicted_s: float | None = None

    @property
    def throughput(self) -> float:
        """Bytes per second (0 when skipped)."""
        return self.bytes / self.seconds if self.seconds > 0 and not self.skipped else 0.0


class SaveHandle:
    """A save in progress or done.

    ``done()`` never blocks; ``wait()`` blocks until the save has committed (or failed) and returns its
    `SaveResult`, re-raising the save's own exception (same type, same object) if it failed. ``cancel()`` abandons
    an asynchronous save that has not committed yet (it then raises `SaveCancelled` from ``wait()``).
    """

    def __init__(
        self,
        step: int,
        *,
        result: SaveResult | None = None,
        error: BaseException | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.step = step
        self._result = result
        self._error = error
        self._thread: threading.Thread | None = None
        self.progress = progress or Progress()
        self.asynchronous = False

    def __repr__(self) -> str:
        state = "done" if self.done() else f"writing {self.progress.done}/{self.progress.total} bytes"
        return f"SaveHandle(step={self.step}, {state})"

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> SaveResult:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the save of step {self.step} is still writing after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> bool:
        """Abandon the save if it has not committed; True if it was still running."""
        self.progress.cancelled.set()
        return not self.done()

    @property
    def result(self) -> SaveResult | None:
        return self._result

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def bytes_left(self) -> int:
        return max(0, self.progress.total - self.progress.done) if not self.done() else 0


class Checkpointer:
    """Saves and restores training state under ``root``.

    Args:
        root: a local directory (created on first save).
        keep: committed checkpoints to keep (>= 2), besides the newest validated one.
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
        per_rank: under several ranks, the state entries that differ between ranks (RNG streams, data loader
            positions): each rank saves its own. Every other entry is taken to be replicated (DDP) and is
            striped: each rank writes a share of its files.
        clock: epoch seconds. monotonic: a monotonic clock for durations.

    Attributes:
        bandwidth: bytes per second of recent saves (write phase), or None before the first; used for deadline
            arithmetic.
    """

    def __init__(
        self,
        root: str,
        *,
        keep: int = 2,
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
        per_rank: Collection[str] = ("_rng",),
        clock: Clock = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if keep < 2:
            raise ValueError(
                f"expected keep >= 2 (the previous checkpoint must stay until the newest has validated), found {keep}"
            )
        self.storage: Storage = storage if storage is not None else storage_for(root, storage_options)
        if threads is None:  # object stores gain from many uploads at once; a disk from a few
            threads = OBJECT_STORE_THREADS if self.storage.kind == "object" else DEFAULT_THREADS
        self.root = self.storage.root
        self.keep = keep
        self.journal = journal
        self.threads = threads
        self.max_file_bytes = max_file_bytes
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._monotonic = monotonic
        self._writing: set[int] = set()
        self.moments_dtype = moments_dtype
        self.bandwidth: float | None = None
        self.fixed_s = 0.05  # directory creation, fsyncs and the commit marker: refined by every save
        self._inflight: SaveHandle | None = None
        self._staging: Staging | None = None
        self._seq = 0
        self._coordinator: Any = _UNSET
        self.per_rank = frozenset(per_rank)
        self.background_nice = background_nice
        self.background_threads = background_threads
        self.probe = probe
        self.probe_rtol = probe_rtol
        self.verify_after_save = verify_after_save

    def __repr__(self) -> str:
        return f"Checkpointer({self.root!r}, keep={self.keep})"

    # paths -------------------------------------------------------------------------------------------------
    def path_of(self, step: int) -> str:
        return self.storage.join(self.root, layout.step_dir(step))

    def _commit_path(self, step: int) -> str:
        return self.storage.join(self.path_of(step), layout.COMMIT)

    def is_committed(self, step: int) -> bool:
        return self.storage.exists(self._commit_path(step))

    def _replaceable(self, step: int) -> bool:
        """A committed checkpoint that failed validation: a new save of its step replaces it."""
        return self.storage.exists(self.storage.join(self.path_of(step), layout.INVALID))

    def _read_back(self, job: _Job, records: Mapping[str, FileRecord]) -> None:
        """Read every file back and check it hashes as written (verify_after_save)."""
        for name, rec in records.items():
            stream = self.storage.open_read(self.storage.join(job.path, name))
            hasher = checksum.new()
            buf = memoryview(bytearray(tensor_format.READ_CHUNK_BYTES))
            try:
                while True:
                    n = stream.readinto(buf)
                    if not n:
                        break
                    hasher.update(buf[:n])
            finally:
                stream.close()
            if hasher.hexdigest() != rec.checksum:
                raise SaveError(
                    f"read-back verification of {name} in step {job.step} failed: written with checksum "
                    f"{rec.checksum}, read back as {hasher.hexdigest()}; the storage altered it on the way. Nothing "
                    "was committed; check the disk or the mount",
                    path=job.path,
                    step=job.step,
                )

    def _event(self, event: str, step: int | None, **fields: Any) -> None:
        if self.journal is not None:
            self.journal.event(event, step, **fields)

    # listing -----------------------------------------------------------------------------------------------
    def checkpoints(self, *, include_uncommitted: bool = False) -> list[CheckpointInfo]:
        """Every committed checkpoint under the root, oldest first (and leftovers, if asked)."""
        out = []
        for name in self.storage.listdir(self.root):
            step = layout.parse_step_dir(name)
            if step is None:
                continue
            path = self.storage.join(self.root, name)
            if not self.storage.isdir(path):
                continue
            info = self._info(step, path)
            if info.committed or include_uncommitted:
                out.append(info)
        return sorted(out, key=lambda c: c.step)

    def _info(self, step: int, path: str) -> CheckpointInfo:
        commit = self.storage.join(path, layout.COMMIT)
        if not self.storage.exists(commit):
            size = 0
            for name in self.storage.listdir(path):
                with contextlib.suppress(OSError):
                    size += self.storage.size(self.storage.join(path, name))
            return CheckpointInfo(step=step, path=path, committed=False, bytes=size)
        try:
            manifest = self._manifest(step)
        except CheckpointCorruptError as e:
            manifest_error: str | None = str(e)
            manifest = None
        except CheckpointNotFoundError:  # deleted a moment ago (rotation): no longer a checkpoint
            return CheckpointInfo(step=step, path=path, committed=False)
        else:
            manifest_error = None
        validated = self.storage.exists(self.storage.join(path, layout.VALID))
        invalid = None
        invalid_path = self.storage.join(path, layout.INVALID)
        if self.storage.exists(invalid_path):
            try:
                invalid = str(json.loads(self.storage.read_bytes(invalid_path, 1 << 20)).get("reason", "invalid"))
            except (OSError, ValueError, AttributeError):
                invalid = "marked invalid"
            validated = False
        if manifest is None:
            return CheckpointInfo(
                step=step, path=path, committed=True, validated=validated, error=manifest_error, invalid=invalid
            )
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
            invalid=invalid,
        )

    def latest(self) -> int | None:
        """The newest committed step, or None."""
        infos = self.checkpoints()
        return infos[-1].step if infos else None

    def _manifest(self, step: int) -> Manifest:
        where = self._commit_path(step)
        try:
            raw = self.storage.read_bytes(where, layout.MAX_MANIFEST_BYTES)
        except FileTooLargeError as e:
            raise CheckpointCorruptError(f"{where}: {e}", path=where, step=step) from e
        except FileNotFoundError as e:
            raise CheckpointNotFoundError(
                f"no committed checkpoint of step {step} under {self.root}: {layout.COMMIT} is missing",
                path=where,
                step=step,
            ) from e
        return Manifest.from_json(raw, where=where, expect_step=step)

    # saving ------------------------------------------------------------------------------------------------
    def save(
        self,
        state: Mapping[str, Any],
        step: int,
        *,
        blocking: bool = True,
        reason: str = "manual",
        deadline: float | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> SaveHandle:
        """Write ``state`` as the checkpoint of ``step`` and commit it.

        ``blocking=True`` writes straight from the live tensors (training must not change them meanwhile: this
        is the emergency path) and returns a finished handle. ``blocking=False`` copies the state into the reused
        staging buffers (the only stall) and writes in the background thread ``preemptible-writer``; the live
        objects may change as soon as it returns. One asynchronous save runs at a time: a new one first waits
        for the previous one.

        A step that is already committed is not written again (``SaveResult.skipped``). Uncommitted leftovers of
        the same step are removed first.

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
        """
        check_state(state)
        with gc_paused():
            return self._save(state, step, blocking=blocking, reason=reason, deadline=deadline, extra=extra)

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
        if self.is_committed(step) and not self._replaceable(step):
            self._event("save_skipped", step, reason=reason, why="already committed")
            return SaveHandle(step, result=SaveResult(step=step, path=path, bytes=0, seconds=0.0, skipped=True))
        probe_value = self._probe_at_save(state, step)
        t_probe = self._monotonic() - start
        plan = self._plan(state)
        budget = deadline - self._clock() if deadline is not None else None
        predicted = self.predict(plan.nbytes)
        extra = {**(extra or {}), "predicted_save_s": predicted}
        self._seq += 1
        if not blocking:
            return self._save_async(
                plan,
                step=step,
                path=path,
                start=start,
                reason=reason,
                budget=budget,
                extra=dict(extra or {}),
                probe=probe_value,
                probe_s=t_probe,
            )
        self._event("save_started", step, reason=reason, budget_s=budget, bytes=plan.nbytes, predicted_s=predicted)
        job = _Job(
            step=step,
            path=path,
            reason=reason,
            start=start,
            extra=dict(extra or {}),
            budget=budget,
            deadline=deadline,
            progress=Progress(total=plan.nbytes, deadline=deadline),
            probe=probe_value,
            seq=self._seq,
        )
        job.timings["capture"] = self._monotonic() - start
        if self.probe is not None:
            job.timings["probe"] = t_probe
        staged = self._stage_device_tensors(plan, step)
        if staged is not None:
            try:
                job.timings["stage"] = staged.seconds
                result = self._write_and_commit(job, staged.specs, staged.docs, blobs=staged.blobs)
            finally:
                self.staging.busy.release()
        else:
            result = self._write_and_commit(job, plan.specs, plan.docs, blobs=None)
        return SaveHandle(step, result=result, progress=job.progress)

    def _stage_device_tensors(self, plan: SavePlan, step: int) -> Staged | None:
        """For a blocking save of GPU tensors: copy them into the pinned staging arena in one batch (device-to-host
        at the bus's speed, on side streams) when the arena already has this layout, instead of one pageable
        ``.cpu()`` copy per tensor (about 40x slower on an H200). Never allocates an arena here: an emergency is
        no time to pin the state's size in host memory. Returns the staged state (``staging.busy`` held), or None.
        """
        if not any(t.device.type != "cpu" for spec in plan.specs for _, t in spec.items):
            return None
        staging = self._staging
        if staging is None or not staging.fits(plan.specs) or not staging.busy.acquire(blocking=False):
            return None
        try:
            return staging.stage(plan, step=step)
        except BaseException:
            staging.busy.release()
            raise

    def _plan(self, state: Mapping[str, Any]) -> SavePlan:
        """Which tensors and documents this process writes (see `SavePlan`)."""
        coord = self.coordinator
        world, me = (coord.world, coord.rank) if coord is not None else (1, 0)
        flat = flatten(capture(state))
        if self.moments_dtype is not None:
            cast_moments(state, flat, self.moments_dtype)
        if world == 1:
            specs = plan_files(flat, threads=self.threads, max_file_bytes=self.max_file_bytes)
            return SavePlan(specs, {layout.STATE: state_json(flat)}, flat.tensor_bytes, flat.tensor_bytes)
        # Entries that differ between ranks (named per_rank, or holding sharded DTensors) are each rank's own;
        # the rest is replicated and striped across ranks.
        sharded = {group_of(n) for n in flat.dtensors}
        own = {n for n in state if n in self.per_rank} | sharded
        shared = select(flat, set(state) - own)
        mine_flat = select(flat, own)
        specs = plan_files(shared, threads=self.threads * world, max_file_bytes=self.max_file_bytes)
        mine = [s for s, owner in zip(specs, assign(specs, world), strict=True) if owner == me]
        own_specs = [
            FileSpec(layout.with_rank(s.name, me), s.items, s.stored)
            for s in plan_files(mine_flat, threads=self.threads, max_file_bytes=self.max_file_bytes)
        ]
        docs = {f"state{layout.rank_suffix(me)}.json": state_json(mine_flat)}
        if me == 0:
            docs[layout.STATE] = state_json(shared)
        nbytes = sum(s.nbytes for s in mine) + mine_flat.tensor_bytes
        return SavePlan(mine + own_specs, docs, nbytes, shared.tensor_bytes + mine_flat.tensor_bytes)

    @property
    def coordinator(self) -> dist.Coordinator | None:
        """The job's store coordinator (several ranks under torchrun), found at the first save; else None."""
        if self._coordinator is _UNSET:
            self._coordinator = dist.Coordinator.from_env()
        coordinator: dist.Coordinator | None = self._coordinator
        return coordinator

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
        if waited > 0.5 and reason != "emergency":
            log.warning(
                "%s save waited %.1f s for the background save of step %d: saves come faster than the storage "
                "absorbs them; a larger save_every (or save_interval_s) stops stalling training",
                reason,
                waited,
                handle.step,
            )

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

    def _save_async(
        self,
        plan: SavePlan,
        *,
        step: int,
        path: str,
        start: float,
        reason: str,
        budget: float | None,
        extra: dict[str, Any],
        probe: float | None,
        probe_s: float,
    ) -> SaveHandle:
        staging = self.staging
        staging.busy.acquire()
        try:
            staged = staging.stage(plan, step=step)
        except BaseException:
            staging.busy.release()
            raise
        job = _Job(
            step=step,
            path=path,
            reason=reason,
            start=start,
            extra=extra,
            budget=budget,
            deadline=None,
            progress=Progress(total=staged.nbytes),
            probe=probe,
            seq=self._seq,
        )
        job.timings["capture"] = self._monotonic() - start
        job.timings["stall"] = job.timings["capture"]
        if self.probe is not None:
            job.timings["probe"] = probe_s
        self._event(
            "save_started",
            step,
            reason=reason,
            budget_s=budget,
            bytes=staged.nbytes,
            asynchronous=True,
            stall_s=round(job.timings["stall"], 6),
            predicted_s=extra.get("predicted_save_s"),
        )
        return self._spawn(job, staged)

    def _spawn(self, job: _Job, staged: Staged) -> SaveHandle:
        """Write ``staged`` in the background; the caller holds ``staging.busy``, released when writing ends."""
        handle = SaveHandle(job.step, progress=job.progress)
        handle.asynchronous = True

        def body() -> None:
            _lower_priority(self.background_nice)
            try:
                handle._result = self._write_and_commit(
                    job, staged.specs, staged.docs, blobs=staged.blobs, threads=self.background_threads
                )
            except BaseException as e:
                handle._error = e
            finally:
                self.staging.busy.release()

        handle._thread = threading.Thread(target=body, name="preemptible-writer")
        handle._thread.start()
        self._inflight = handle
        return handle

    def _write_and_commit(
        self,
        job: _Job,
        specs: list[FileSpec],
        docs: dict[str, bytes],
        *,
        blobs: dict[str, memoryview] | None,
        threads: int | None = None,
    ) -> SaveResult:
        self._writing.add(job.step)
        try:
            result = self._write(job, specs, docs, blobs, threads or self.threads)
        except BaseException as e:
            if self.coordinator is None or self.coordinator.rank == 0:
                self._abandon(job.path)
            if isinstance(e, SaveCancelled):
                self._event("save_abandoned", job.step, reason=job.reason, written=job.progress.done)
                raise
            self._event("save_failed", job.step, reason=job.reason, error=f"{type(e).__name__}: {e}")
            if isinstance(e, OSError) and not isinstance(e, SaveError):
                raise self._save_error(e, job.step, job.path) from e
            raise
        finally:
            self._writing.discard(job.step)
        write_s = result.timings.get("write", 0.0)
        if result.bytes and write_s > 0:
            bw = result.bytes / write_s
            self.bandwidth = bw if self.bandwidth is None else 0.5 * self.bandwidth + 0.5 * bw
            self.fixed_s = 0.5 * self.fixed_s + 0.5 * result.timings.get("commit", self.fixed_s)
        remaining = job.deadline - self._clock() if job.deadline is not None else None
        self._event(
            "save_committed",
            job.step,
            reason=job.reason,
            bytes=result.bytes,
            seconds=round(result.seconds, 6),
            predicted_s=result.predicted_s,
            throughput_mb_s=round(result.throughput / 1e6, 3),
            timings={k: round(v, 6) for k, v in result.timings.items()},
            budget_s=job.budget,
            remaining_s=remaining,
        )
        if self.coordinator is None or self.coordinator.rank == 0:
            self.rotate()  # one rank deletes; the others would race it
        if self.journal is not None:
            self.journal.sync()
        return result

    def _write(
        self,
        job: _Job,
        specs: list[FileSpec],
        docs: dict[str, bytes],
        blobs: dict[str, memoryview] | None,
        threads: int,
    ) -> SaveResult:
        t0 = self._monotonic()
        coord = self.coordinator
        store = coord.client() if coord is not None else None
        key = f"save/{job.seq}"
        if coord is None or coord.rank == 0:
            if self.storage.exists(job.path):
                log.info("removing uncommitted leftovers of step %d at %s before writing it again", job.step, job.path)
                self.storage.remove_tree(job.path)
            self.storage.makedirs(job.path)
            self.storage.sync_dir(self.root)
            if store is not None:
                store.set(f"{key}/ready", str(job.step))
        else:
            assert store is not None
            coord.collect_one(store, f"{key}/ready")  # rank 0 has cleared leftovers and made the directory
        try:
            records: dict[str, FileRecord] = write_files(
                self.storage, job.path, specs, threads=threads, progress=job.progress, blobs=blobs
            )
            for name, doc in docs.items():
                records[name] = write_bytes(self.storage, job.path, name, doc)
            self.storage.sync_dir(job.path)
            if self.verify_after_save:
                t_read = self._monotonic()
                self._read_back(job, records)
                job.timings["read_back"] = self._monotonic() - t_read
            job.progress.add(0)  # last chance to abandon before the commit point
        except BaseException as e:
            if store is not None and coord is not None:
                store.set(f"{key}/report/{coord.rank}", json.dumps({"error": f"{type(e).__name__}: {e}"}))
            raise
        t_write = self._monotonic()
        world = 1
        if store is not None and coord is not None:
            # IMPORTANT: the commit barrier. Every rank reports its files as durable; rank 0 commits only if all
            # did, within the timeout; everyone learns the outcome. A dead rank means no commit.
            reports = coord.gather(store, f"{key}/report", json.dumps({"files": _records_doc(records)}))
            errors = [(r, json.loads(x)["error"]) for r, x in enumerate(reports) if "error" in json.loads(x)]
            if coord.rank != 0:
                outcome = coord.collect_one(store, f"{key}/outcome")
                if outcome != "committed":
                    raise SaveError(f"step {job.step} was not committed: {outcome}", path=job.path, step=job.step)
                timings = dict(job.timings)
                timings["write"] = t_write - t0
                timings["total"] = self._monotonic() - job.start
                return SaveResult(
                    step=job.step,
                    path=job.path,
                    bytes=sum(r.bytes for r in records.values()),
                    seconds=self._monotonic() - job.start,
                    timings=timings,
                )
            if errors:
                why = "; ".join(f"rank {r}: {e}" for r, e in errors)
                store.set(f"{key}/outcome", f"rank(s) failed: {why}")
                raise SaveError(
                    f"step {job.step} was not committed, a rank failed: {why}", path=job.path, step=job.step
                )
            for x in reports:
                records.update(_records_from(json.loads(x)["files"]))
            world = coord.world
        timings = dict(job.timings)
        timings["write"] = t_write - t0
        timings["total"] = t_write - job.start
        manifest = Manifest(
            step=job.step,
            created=layout.now_iso(self._clock()),
            world_size=world,
            checksum_algorithm=checksum.ALGORITHM,
            files=records,
            timings={k: round(v, 6) for k, v in timings.items()},
            predicted_save_s=job.extra.pop("predicted_save_s", None),
            probe=job.probe,
            extra=job.extra,
        )
        try:
            self.storage.publish(self._commit_path(job.step), manifest.to_json())
        except BaseException as e:
            if store is not None:
                store.set(f"{key}/outcome", f"rank 0 could not write COMMIT.json: {e}")
            raise
        if store is not None:
            store.set(f"{key}/outcome", "committed")
        end = self._monotonic()
        timings["commit"] = end - t_write
        timings["total"] = end - job.start
        return SaveResult(
            step=job.step,
            path=job.path,
            bytes=manifest.total_bytes,
            seconds=end - job.start,
            timings=timings,
            predicted_s=manifest.predicted_save_s,
        )

    # staging and pre-staging ----------------------------------------------------------------------------------
    @property
    def staging(self) -> Staging:
        if self._staging is None:
            self._staging = Staging()
        return self._staging

    def prestage(self, state: Mapping[str, Any], step: int) -> bool:
        """Copy ``state`` into the staging buffer without writing it (for a later `flush_staged`).

        Returns False (and does nothing) while a background save is still writing from the buffer: the buffer
        then holds that save's step, which is as recent.
        """
        staging = self.staging
        if not staging.busy.acquire(blocking=False):
            return False
        try:
            staging.stage(self._plan(state), step=step)
        finally:
            staging.busy.release()
        return True

    def flush_staged(self, *, reason: str = "prestaged", deadline: float | None = None) -> SaveHandle | None:
        """Write what the staging buffer holds as the checkpoint of its step, in the background.

        Returns None when the buffer is empty, or its step is already committed or being written.
        """
        staging = self.staging
        staged = staging.current
        if staged is None or staged.step is None or self.is_committed(staged.step):
            return None
        inflight = self.inflight
        if inflight is not None and inflight.step == staged.step:
            return inflight
        staging.busy.acquire()
        staged = staging.current
        assert staged is not None
        assert staged.step is not None
        budget = deadline - self._clock() if deadline is not None else None
        job = _Job(
            step=staged.step,
            path=self.path_of(staged.step),
            reason=reason,
            start=self._monotonic(),
            extra={},
            budget=budget,
            deadline=deadline,
            progress=Progress(total=staged.nbytes),
        )
        self._seq += 1
        job.seq = self._seq
        self._event(
            "save_started",
            staged.step,
            reason=reason,
            budget_s=budget,
            bytes=staged.nbytes,
            asynchronous=True,
            staged_at=layout.now_iso(staged.staged_at),
        )
        return self._spawn(job, staged)

    def _abandon(self, path: str) -> None:
        try:
            self.storage.remove_tree(path)
        except OSError as e:  # leftovers are harmless: invisible without COMMIT.json, cleaned later
            log.warning("could not remove the failed save's leftovers at %s (%s)", path, e)

    def _save_error(self, e: OSError, step: int, path: str) -> SaveError:
        newest = self.latest()
        kept = f"step {newest} remains the newest checkpoint" if newest is not None else "no earlier checkpoint exists"
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            try:
                free = shutil.disk_usage(self.root).free
                space = f"{free / 1e6:.1f} MB free now"
            except OSError:
                space = "free space unknown"
            what = (
                f"no space left while writing step {step} to {path} ({space}); nothing was committed and "
                f"{kept}. Free space, lower keep=, or point the root at a larger volume"
            )
        else:
            what = (
                f"writing step {step} to {path} failed: {e}; nothing was committed and {kept}. Check that the "
                "root is writable and mounted"
            )
        return SaveError(what, path=path, step=step)

    # rotation and cleanup ----------------------------------------------------------------------------------
    def rotate(self) -> list[int]:
        """Delete committed checkpoints beyond the retention policy and stale leftovers. Returns deleted steps."""
        infos = self.checkpoints(include_uncommitted=True)
        kept = retention.keep_steps(infos, self.keep)
        deleted = []
        for info in infos:
            if info.committed and info.step not in kept:
                # IMPORTANT: the marker goes first, so a crash mid-delete leaves an invisible leftover, never a
                # committed checkpoint with missing files.
                self.storage.remove(self.storage.join(info.path, layout.VALID))
                self.storage.remove(self.storage.join(info.path, layout.COMMIT))
                self.storage.remove_tree(info.path)
                deleted.append(info.step)
        deleted += self.cleanup(infos)
        if deleted:
            self._event("rotated", None, deleted=deleted, kept=sorted(kept))
        return deleted

    def quarantine(self) -> str | None:
        """Move every checkpoint directory aside to ``<root>/quarantine/<utc>/`` (for a deliberate fresh start
        when none verifies: kept for inspection, out of the way of new saves). Returns where, or None."""
        infos = self.checkpoints(include_uncommitted=True)
        if not infos:
            return None
        stamp = layout.now_iso(self._clock()).replace(":", "").replace("-", "")
        target = self.storage.join(self.root, "quarantine", stamp)
        self.storage.makedirs(target)
        for info in infos:
            self.storage.move(info.path, self.storage.join(target, layout.step_dir(info.step)))
        self.storage.sync_dir(self.root)
        return target

    def cleanup(self, infos: list[CheckpointInfo] | None = None) -> list[int]:
        """Delete uncommitted leftovers older than ``stale_after_s``; younger ones may still be being written."""
        if infos is None:
            infos = self.checkpoints(include_uncommitted=True)
        leftovers = [c for c in infos if not c.committed]
        mtimes = {c.step: self.storage.newest_mtime(c.path) for c in leftovers}
        stale = retention.stale_leftovers(
            leftovers, mtimes, now=self._clock(), older_than_s=self.stale_after_s, protect=self._writing
        )
        for step in stale:
            log.info("removing stale uncommitted leftovers of step %d (older than %.0f s)", step, self.stale_after_s)
            self.storage.remove_tree(self.path_of(step))
        return stale

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
        return self._read(self._open(step), into)

    def _open(self, step: int, rank: int | None = None) -> _Opened:
        """Everything but the tensor data: manifest, file sizes, state documents, tensor headers. Cheap.

        ``rank``: read what that rank needs (the replicated files, and its own per-rank files, or rank 0's when
        the checkpoint was written by fewer ranks); None: every file (verification).
        """
        manifest = self._manifest(step)
        directory = self.path_of(step)
        opened = _Opened(step=step, directory=directory, manifest=manifest)
        bad = opened.bad
        if manifest.checksum_algorithm != checksum.ALGORITHM:
            raise bad(
                f"checksum algorithm {manifest.checksum_algorithm!r} is unknown here (expected "
                f"{checksum.ALGORITHM!r}); upgrade preemptible"
            )
        if layout.STATE not in manifest.files:
            raise bad(f"the manifest lists no {layout.STATE}")
        for name, rec in manifest.files.items():
            p = self.storage.join(directory, name)
            if not self.storage.exists(p):
                raise bad(f"file {name} listed in COMMIT.json is missing")
            size = self.storage.size(p)
            if size != rec.bytes:
                raise bad(f"file {name} is {size} bytes, COMMIT.json records {rec.bytes} (truncated or replaced)")
        markers = (layout.COMMIT, layout.VALID, layout.INVALID)
        opened.extra_files = sorted(
            n
            for n in self.storage.listdir(directory)
            if n not in manifest.files and n not in markers and not n.startswith(tuple(m + ".tmp-" for m in markers))
        )
        opened.selected = self._select(manifest, rank, opened)
        opened.tree = {}
        for name in [n for n in opened.selected if n.endswith(".json")]:
            rec = manifest.files[name]
            raw = self.storage.read_bytes(self.storage.join(directory, name), max(rec.bytes, 0))
            found = checksum.of_bytes(raw)
            if found != rec.checksum:
                raise bad(f"{name} checksum mismatch: COMMIT.json records {rec.checksum}, file hashes to {found}")
            try:
                doc = json.loads(raw)
                tree = doc["tree"]
                if not isinstance(tree, dict) or next(iter(tree), "").startswith("$"):
                    raise TypeError("the tree is not an object of state entries")
                if rank is None or name == layout.STATE or not (opened.tree.keys() & tree.keys()):
                    opened.tree.update(tree)
                opened.numpy |= set(doc.get("numpy", []))
                opened.dtensors.update(doc.get("dtensors") or {})
                opened.casts.update({str(n): _dtype(str(d)) for n, d in (doc.get("casts") or {}).items()})
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise bad(f"{name} is not a preemptible state document ({e})") from e
        for name in opened.selected:
            if not name.endswith(layout.TENSOR_SUFFIX):
                continue
            rec = manifest.files[name]
            p = self.storage.join(directory, name)
            stream = self.storage.open_read(p)
            try:
                entries = tensor_format.read_header(stream, rec.bytes, where=p)
            except CheckpointCorruptError as e:
                raise bad(str(e)) from e
            finally:
                stream.close()
            owner = layout.file_rank(name)
            for entry in entries:
                if entry.name in opened.entries and opened.entry_owner.get(entry.name) == owner:
                    raise bad(f"tensor {entry.name!r} appears in more than one file")
                opened.entries[entry.name] = entry
                opened.entry_owner[entry.name] = owner
            opened.file_entries[name] = entries
        return opened

    def _select(self, manifest: Manifest, rank: int | None, opened: _Opened) -> list[str]:
        """The files one rank reads (see `_open`)."""
        names = list(manifest.files)
        if rank is None:
            return names
        ranks = {layout.file_rank(n) for n in names} - {None}
        own = rank if rank in ranks else 0
        if ranks and own != rank:
            opened.notes.append(
                f"the checkpoint was written by {manifest.world_size} rank(s) and holds no per-rank state of rank "
                f"{rank}: rank 0's (RNG streams, ...) is used instead"
            )
        return [n for n in names if layout.file_rank(n) in (None, own)]

    @staticmethod
    def _rewrap(opened: _Opened, tensors: dict[str, Any], live: Mapping[str, Any]) -> None:
        """Local shards back into DTensors: the live DTensor when its shard was read in place, else a new one on
        the live state's device mesh (an optimizer's moments, created lazily, have no live DTensor yet)."""
        from torch.distributed.tensor import DTensor

        from preemptible.state import parse_placement

        mesh = next((t.device_mesh for t in live.values()), None)
        for name, meta in opened.dtensors.items():
            local = tensors.get(name)
            if local is None:
                continue
            existing = live.get(name)
            if existing is not None and existing.to_local().data_ptr() == local.data_ptr():
                tensors[name] = existing
                continue
            if mesh is None:
                raise opened.bad(f"{name} is sharded (DTensor) but the live state has no device mesh to place it on")
            tensors[name] = DTensor.from_local(
                local,
                mesh,
                [parse_placement(p) for p in meta["placements"]],
                run_check=False,
                shape=torch.Size(meta["shape"]),
                stride=tuple(meta["stride"]),
            )

    def _skeleton(self, opened: _Opened) -> dict[str, Any]:
        """The stored state with shape-and-dtype placeholders (meta tensors) instead of data."""
        meta = {
            n: torch.empty(e.shape, dtype=opened.casts.get(n, e.dtype), device="meta")
            for n, e in opened.entries.items()
        }
        try:
            tree = tagged_json.decode(opened.tree, lambda name, is_numpy: _placeholder(meta, name))
        except CheckpointCorruptError as e:
            raise opened.bad(str(e)) from e
        if not isinstance(tree, dict):
            raise opened.bad(f"{layout.STATE} holds a {type(tree).__name__}, expected an object of state entries")
        return tree

    def _check_sharding(self, opened: _Opened, coord: dist.Coordinator | None) -> None:
        if not opened.dtensors:
            return
        world = coord.world if coord is not None else 1
        if opened.manifest.world_size != world:
            raise StateMismatchError(
                f"the checkpoint of step {opened.step} holds sharded state (DTensor/FSDP2) written by "
                f"{opened.manifest.world_size} ranks; this job has {world}. Resharding is not supported: restore "
                f"it with {opened.manifest.world_size} ranks (the same mesh), or save full tensors",
                path=opened.directory,
                step=opened.step,
                differences=[f"world size {opened.manifest.world_size} in checkpoint, {world} live"],
            )

    def _read(
        self,
        opened: _Opened,
        into: Mapping[str, torch.Tensor] | None,
        *,
        sharded: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        into = into or {}

        def target(e: tensor_format.Entry) -> torch.Tensor | None:
            t = into.get(e.name)
            if (
                t is not None
                and t.dtype == e.dtype
                and tuple(t.shape) == e.shape
                and t.device.type == "cpu"
                and t.is_contiguous()
                and type(t) in (torch.Tensor, torch.nn.Parameter)
            ):
                return t.detach()
            return None

        def read_file(name: str) -> dict[str, torch.Tensor]:
            rec = opened.manifest.files[name]
            p = self.storage.join(opened.directory, name)
            stream = self.storage.open_read(p)
            try:
                return tensor_format.read(
                    stream,
                    rec.bytes,
                    where=p,
                    expected_checksum=rec.checksum,
                    into=target,
                    entries=opened.file_entries.get(name),
                    chunk=(32 << 20) if self.storage.kind == "object" else tensor_format.READ_CHUNK_BYTES,
                )
            except CheckpointCorruptError as e:
                raise opened.bad(str(e)) from e
            finally:
                stream.close()

        names = sorted(
            (n for n in opened.selected if n.endswith(layout.TENSOR_SUFFIX)),
            key=lambda n: -opened.manifest.files[n].bytes,
        )
        tensors: dict[str, torch.Tensor] = {}
        for part in parallel_map(read_file, names, threads=self.threads, name="preemptible-read"):
            tensors.update(part)
        for name, dtype in opened.casts.items():  # bf16 moments back into the optimizer's own dtype
            stored = tensors.get(name)
            if stored is None:
                raise opened.bad(f"state.json casts tensor {name!r}, which no tensor file holds")
            live = into.get(name)
            if live is not None and live.dtype == dtype and live.shape == stored.shape:
                tensors[name] = live.detach().copy_(stored)
            else:
                tensors[name] = stored.to(dtype)
        if opened.dtensors:
            self._rewrap(opened, tensors, sharded or {})
        try:
            loaded = unflatten(opened.tree, tensors, opened.numpy)
        except CheckpointCorruptError as e:
            raise opened.bad(str(e)) from e
        if not isinstance(loaded, dict):
            raise opened.bad(f"{layout.STATE} holds a {type(loaded).__name__}, expected an object of state entries")
        return loaded

    def verify_report(self, step: int) -> tuple[CheckpointInfo, list[str]]:
        """`verify`, plus warnings that do not fail it (files the manifest does not list)."""
        opened = self._open(step)
        self._read(opened, None)
        if opened.manifest.probe is None:
            self._mark_valid(step, by="verify")
        notes = [f"extra file not in COMMIT.json (ignored): {n}" for n in opened.extra_files]
        if opened.manifest.probe is not None:
            notes.append("probe value stored: checked by the next restore, which has the model")
        return self._info(step, self.path_of(step)), notes

    def verify(self, step: int) -> CheckpointInfo:
        """Fully verify checkpoint ``step``: manifest, sizes, headers, every checksum.

        It is then marked validated, unless it carries a probe value: that needs the model, and is checked by the
        next restore (``CheckpointInfo.validated`` stays False until then).

        Raises:
            CheckpointNotFoundError, CheckpointCorruptError.
        """
        return self.verify_report(step)[0]

    def _probe_check(self, state: Mapping[str, Any], manifest: Manifest) -> ProbeCheck | None:
        if self.probe is None or manifest.probe is None:
            return None
        return ProbeCheck(manifest.probe, run_probe(self.probe, state), self.probe_rtol)

    def _mark_valid(self, step: int, *, by: str, probe: ProbeCheck | None = None) -> None:
        doc = {
            "validated_at": layout.now_iso(self._clock()),
            "by": by,
            "checksums": True,
            "probe": {"stored": probe.stored, "recomputed": probe.recomputed, "rtol": probe.rtol} if probe else None,
        }
        directory = self.path_of(step)
        try:
            self.storage.publish(self.storage.join(directory, layout.VALID), json.dumps(doc).encode())
            self.storage.remove(self.storage.join(directory, layout.INVALID))
        except OSError as e:
            log.warning("could not record that step %d validated (%s); it stays unvalidated", step, e)

    def _mark_invalid(self, step: int, reason: str) -> None:
        doc = {"invalidated_at": layout.now_iso(self._clock()), "reason": reason}
        directory = self.path_of(step)
        try:
            self.storage.remove(self.storage.join(directory, layout.VALID))
            self.storage.publish(self.storage.join(directory, layout.INVALID), json.dumps(doc).encode())
        except OSError as e:
            log.warning("could not record that step %d is invalid (%s)", step, e)

    def restore(self, state: Mapping[str, Any], step: int | None = None) -> int | None:
        """Load the newest committed checkpoint that verifies into ``state``, in place.

        Every entry of ``state`` must be in the checkpoint (extra entries in the checkpoint are ignored), with
        matching tensor keys, shapes and dtypes; that is checked from the headers before a single live byte
        changes. Tensor data is then read straight into the live tensors where dtype and shape match (no fresh
        allocation), verifying every checksum on the way. A checkpoint that fails verification is skipped with a
        `CheckpointFallbackWarning` and the next newest is read over it. If none verifies, the live objects may
        hold part of a rejected checkpoint: do not train on them.

        Args:
            state: names to stateful objects or dicts, as given to `save`.
            step: restore exactly this step (no fallback).

        Returns:
            The restored step, or None when the root holds no committed checkpoint.

        Raises:
            CheckpointCorruptError: committed checkpoints exist but none verifies (lists each and why).
            CheckpointNotFoundError: ``step`` was given and is not committed.
            StateMismatchError: the checkpoint does not fit the live objects (names every difference).
        """
        check_state(state)
        if step is not None:
            candidates = [step]
            if not self.is_committed(step):
                have = [c.step for c in self.checkpoints()]
                raise CheckpointNotFoundError(
                    f"no committed checkpoint of step {step} under {self.root}; committed steps: {have or 'none'}",
                    path=self.path_of(step),
                    step=step,
                )
        else:
            candidates = [c.step for c in reversed(self.checkpoints())]
        if not candidates:
            return None
        with gc_paused():
            return self._restore(state, candidates, step)

    def _restore(self, state: Mapping[str, Any], candidates: list[int], step: int | None) -> int:
        failures: list[tuple[int, str]] = []
        live_flat = flatten(capture(state))
        live = live_flat.tensors
        coord = self.coordinator
        store = coord.client() if coord is not None else None
        for candidate in candidates:
            t0 = self._monotonic()
            check: ProbeCheck | None = None
            opened: _Opened | None = None
            try:
                opened = self._open(candidate, rank=coord.rank if coord is not None else 0)
                self._check_sharding(opened, coord)
                self._check_fits(state, self._skeleton(opened), candidate)  # before a single byte changes
                loaded = self._read(opened, live, sharded=live_flat.dtensor_objs)
                apply(state, loaded)
                check = self._probe_check(state, opened.manifest)
                if check is not None and not check.ok:
                    self._event(
                        "checkpoint_invalid",
                        candidate,
                        error=check.describe(),
                        stored_probe=check.stored,
                        recomputed_probe=check.recomputed,
                    )
                    raise opened.bad(check.describe())
                local_error: CheckpointCorruptError | None = None
            except CheckpointCorruptError as corrupt:
                local_error = corrupt
            if coord is not None and store is not None:
                # Every rank must restore the same step: a checkpoint counts only if it verified on all of them.
                self._seq += 1
                reports = coord.gather(store, f"restore/{self._seq}", str(local_error or "ok"))
                others = [f"rank {r}: {x}" for r, x in enumerate(reports) if x != "ok" and r != coord.rank]
                if local_error is None and others:
                    local_error = CheckpointCorruptError(
                        "; ".join(others), path=self.path_of(candidate), step=candidate
                    )
            if local_error is not None:
                failures.append((candidate, str(local_error)))
                if check is not None and not check.ok and (coord is None or coord.rank == 0):
                    self._mark_invalid(candidate, check.describe())
                else:
                    self._event("checkpoint_invalid", candidate, error=str(local_error))
                if step is not None:
                    raise local_error
                warnings.warn(
                    f"skipping the checkpoint of step {candidate}: {local_error}; falling back to the next newest",
                    CheckpointFallbackWarning,
                    stacklevel=2,
                )
                continue
            assert opened is not None
            for note in opened.notes:
                log.warning("restoring step %d: %s", candidate, note)
            if opened.extra_files:
                warnings.warn(
                    f"the checkpoint of step {candidate} holds files its COMMIT.json does not list, ignored: "
                    f"{', '.join(opened.extra_files)}",
                    CheckpointFallbackWarning,
                    stacklevel=2,
                )
            if coord is None or coord.rank == 0:
                self._mark_valid(candidate, by="restore", probe=check)
            self._event(
                "restored", candidate, seconds=round(self._monotonic() - t0, 6), skipped=[s for s, _ in failures]
            )
            return candidate
        lines = "\n".join(f"  step {s}: {why}" for s, why in failures)
        raise CheckpointCorruptError(
            f"none of the {len(failures)} committed checkpoints under {self.root} verifies:\n{lines}\n"
            "Nothing was loaded. Restore from a backup, or move the root aside to start fresh deliberately.",
            path=self.root,
            failures=failures,
        )

    def _check_fits(self, state: Mapping[str, Any], loaded: Mapping[str, Any], step: int) -> None:
        # Entries named "_..." are preemptible's own (RNG streams, run metadata): a checkpoint written by a bare
        # Checkpointer lacks them, and restores fine (with a warning in the journal).
        missing = [name for name in state if name not in loaded and not name.startswith("_")]
        diffs = [f"{name}: missing from checkpoint (it holds {sorted(loaded)})" for name in missing]
        for name, obj in state.items():
            if name in loaded and not isinstance(obj, (dict, RNGState)):
                diffs += differences(capture({name: obj}), {name: loaded[name]})
        if diffs:
            shown = "\n".join(f"  {d}" for d in diffs[:50])
            more = f"\n  ... and {len(diffs) - 50} more" if len(diffs) > 50 else ""
            raise StateMismatchError(
                f"the checkpoint of step {step} at {self.path_of(step)} does not fit the live objects "
                f"({len(diffs)} difference{'s' if len(diffs) != 1 else ''}):\n{shown}{more}\n"
                "Build the model and optimizer exactly as when the checkpoint was saved, or start a new root.",
                path=self.path_of(step),
                step=step,
                differences=diffs,
            )
