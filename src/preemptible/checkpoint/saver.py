"""A save from start to commit: the phases `Checkpointer.save` runs, blocking or in the background.

`Saver.save` is the list of phases: wait for the save still writing, skip a step already committed, plan this
rank's files, replace a step marked invalid, describe the job (probe, budget, prediction, compression), then write
and commit it, here (`write_blocking`) or in the thread ``preemptible-writer`` (`save_async`). After a commit it
refines the measurements (`preemptible.checkpoint.measure`) and applies retention (`Lifecycle.rotate`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from preemptible import dist
from preemptible.checkpoint.arena import Arena
from preemptible.checkpoint.commit import Committer, Job, save_error
from preemptible.checkpoint.handle import SaveHandle, SaveResult
from preemptible.checkpoint.lifecycle import Lifecycle
from preemptible.checkpoint.listing import Listing
from preemptible.checkpoint.measure import Measurements
from preemptible.checkpoint.planner import Planner
from preemptible.errors import SaveCancelled, SaveError
from preemptible.events import Event, SaveReason
from preemptible.journal import Journal
from preemptible.progress import Meter
from preemptible.store import compress as compress_mod
from preemptible.store import deletion, direct
from preemptible.store.io import Storage
from preemptible.store.markers import Markers, State, Transition, Verdict
from preemptible.store.threads import PlanChanged
from preemptible.validate import Probe, run_probe
from preemptible.writer import ArenaFill, FileSpec, Progress, SavePlan, Staged

log = logging.getLogger("preemptible")


class JournalRelay:
    """The event sink the `Checkpointer`'s parts share: the journal `Run` sets (`Checkpointer.journal`), or none
    (events dropped)."""

    def __init__(self) -> None:
        self.journal: Journal | None = None

    def event(self, event: str, step: int | None, **fields: Any) -> Any:
        if self.journal is None:
            return None
        return self.journal.event(event, step, **fields)

    def sync(self) -> None:
        if self.journal is not None:
            self.journal.sync()


def _lower_priority(nice: int) -> None:
    """Lower this thread's CPU priority (Linux: nice is per thread, inherited by threads it starts), so a
    background save takes the cycles training leaves idle instead of stalling its parallel kernels."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


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


class Saver:
    """Writes and commits saves of one root (see the module docs); one background save at a time."""

    def __init__(
        self,
        storage: Storage,
        root: str,
        *,
        arena: Arena,
        planner: Planner,
        measurements: Measurements,
        listing: Listing,
        lifecycle: Lifecycle,
        markers: Markers,
        events: JournalRelay,
        coordinator: Callable[[], dist.Coordinator | None],
        writing: set[int],
        threads: int,
        background_threads: int,
        background_nice: int,
        probe: Probe | None,
        verify_after_save: bool,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
    ) -> None:
        self.storage = storage
        self.root = root
        self.arena = arena
        self.planner = planner
        self.measurements = measurements
        self.listing = listing
        self.lifecycle = lifecycle
        self.markers = markers
        self.events = events
        self._coordinator = coordinator
        self._writing = writing
        self.threads = threads
        self.background_threads = background_threads
        self.background_nice = background_nice
        self.probe = probe
        self.verify_after_save = verify_after_save
        self._clock = clock
        self._monotonic = monotonic
        self._inflight: SaveHandle | None = None
        self._go: threading.Event | None = None

    @property
    def inflight(self) -> SaveHandle | None:
        """The asynchronous save still writing, or None."""
        handle = self._inflight
        return handle if handle is not None and not handle.done() else None

    @property
    def _leader(self) -> bool:
        coord = self._coordinator()
        return coord is None or coord.rank == 0

    def progress(self, total: int, deadline: float | None = None, *, what: str = "save") -> Progress:
        """A save's byte counter; a save that runs longer than a few seconds logs how it goes (bytes, throughput,
        time left against its deadline)."""
        progress = Progress(
            total=total, deadline=deadline, started=self._monotonic(), clock=self._clock, monotonic=self._monotonic
        )
        progress.meter = Meter(what, total, bar=False, deadline=deadline, clock=self._clock, monotonic=self._monotonic)
        return progress

    def release(self) -> None:
        """After `save` returns: let the background writer it started go (it starts once the caller has its thread
        back), and drop an early copy left running by a background save that failed before staging."""
        go, self._go = self._go, None
        if go is not None:
            go.set()
        if self.arena.laid_out is not None:
            self.arena.laid_out.drop_early()

    # the phases of a save -----------------------------------------------------------------------------------
    def save(
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
        path = self.listing.path_of(step)
        self.wait_inflight(reason)
        verdict = self.markers.read(path)
        if verdict.state in (State.COMMITTED, State.VALIDATED):
            self.events.event(Event.SAVE_SKIPPED, step, reason=reason, why="already committed")
            return SaveHandle(step, result=SaveResult(step=step, path=path, bytes=0, seconds=0.0, skipped=True))
        coord = self._coordinator()
        key = coord.round("save") if coord is not None else "save/0"
        plan = self._plan(state, key=key, reason=reason, blocking=blocking)
        self._replace_invalid(step, verdict)
        job = self._job(
            state, plan, step=step, path=path, reason=reason, start=start, key=key, blocking=blocking, deadline=deadline
        )
        job.extra = {**(extra or {}), **job.extra}
        if not blocking:
            return self.save_async(plan, job)
        self._announce(job, plan)
        result = self.write_blocking(state, plan, job)
        return SaveHandle(step, result=result, progress=job.progress)

    def _plan(self, state: Mapping[str, Any], *, key: str, reason: str, blocking: bool) -> SavePlan:
        """Plan the save. Checks the whole state before any write; but a blocking refill of CPU tensors checks its
        tensors while its files are written, and commits only if they fit (`SavePlan.check`)."""
        # A background save's copy into the staging arena starts while its plan is checked (`Staging.begin`):
        # not with a probe, which runs the model on the live state before it is copied.
        early = self.arena.staging.begin if not blocking and self.probe is None else None
        return self.planner.plan(state, key=key, reason=reason, early=early, defer=blocking and self.probe is None)

    def _replace_invalid(self, step: int, verdict: Verdict) -> None:
        """A step marked invalid is deleted (by rank 0) before it is saved again."""
        if verdict.state is State.INVALID and self._leader:
            log.info("replacing the checkpoint of step %d, marked invalid (%s)", step, verdict.invalid_reason)
            deletion.delete_checkpoint(self.storage, self.root, step, verdict.state, transition=Transition.REPLACE)

    def _job(
        self,
        state: Mapping[str, Any],
        plan: SavePlan,
        *,
        step: int,
        path: str,
        reason: str,
        start: float,
        key: str,
        blocking: bool,
        deadline: float | None,
    ) -> Job:
        """The save as it starts: its probe value, budget, predicted duration and compression choice."""
        probe_value = self._probe_at_save(state, step)
        t_probe = self._monotonic() - start
        budget = deadline - self._clock() if deadline is not None else None
        predicted = self.measurements.predict(plan.nbytes)
        choice, codec = self._codec(plan, background=not blocking)
        if choice.on and choice.compressed_s is not None and predicted is not None:
            predicted = round(choice.compressed_s + self.measurements.fixed_s, 3)  # as it will be written: compressed
        job = Job(
            step=step,
            path=path,
            reason=reason,
            start=start,
            extra={**_transformers_configs(state), "predicted_save_s": predicted},
            budget=budget,
            deadline=deadline,
            progress=self.progress(plan.nbytes, deadline, what=f"{reason} save of step {step}"),
            probe=probe_value,
            key=key,
            codec=codec,
            choice=choice,
        )
        if self.probe is not None:
            job.timings["probe"] = t_probe
        return job

    def _codec(self, plan: SavePlan, *, background: bool) -> tuple[compress_mod.Choice, compress_mod.Codec | None]:
        """Whether this save compresses, and the codec that does it (`Measurements.codec`)."""
        threads = self.background_threads if background else self.threads
        return self.measurements.codec(
            plan, background=background, threads=threads, object_store=self.storage.kind == "object"
        )

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

    def _announce(self, job: Job, plan: SavePlan) -> None:
        """A blocking save's ``save_started`` event; its capture phase ends here."""
        self.events.event(
            Event.SAVE_STARTED,
            job.step,
            reason=job.reason,
            budget_s=job.budget,
            bytes=plan.nbytes,
            predicted_s=job.extra.get("predicted_save_s"),
            compress=job.choice.to_json() if job.choice is not None else None,
            plan=self.planner.steady.last,
        )
        job.timings["capture"] = self._monotonic() - job.start

    def write_blocking(self, state: Mapping[str, Any], plan: SavePlan, job: Job) -> SaveResult:
        """Write and commit a blocking save: through the staging arena where it is ready and pays
        (`Arena.stage_blocking`), else straight from the live tensors. A plan the state no longer fits is thrown
        away and made again, checked first this time."""
        try:
            staging = self.arena.stage_blocking(plan, job.step, lazily=job.codec is None)
            if staging is None:
                job.check = plan.check
                return self.write_and_commit(job, plan.specs, plan.docs, blobs=None)
            return self._write_staged(plan, job, *staging)
        except PlanChanged:  # thrown away: planned again, checked first this time
            log.info("step %d: the state changed its tensors since the last save; planning it again", job.step)
            plan = self.planner.plan(state, key=job.key, reason=job.reason)
            job.check = None
            job.progress = self.progress(plan.nbytes, job.deadline, what=f"{job.reason} save of step {job.step}")
            job.choice, job.codec = self._codec(plan, background=False)
            return self.write_and_commit(job, plan.specs, plan.docs, blobs=None)

    def _write_staged(self, plan: SavePlan, job: Job, staged: Staged, fills: dict[str, ArenaFill] | None) -> SaveResult:
        """Write what `Arena.stage_blocking` staged (``staging.busy`` held, released here)."""
        staging = self.arena.staging
        try:
            job.timings["stage"] = staged.seconds
            job.check, job.fills = plan.check, fills
            result = self.write_and_commit(job, staged.specs, staged.docs, blobs=staged.blobs)
            if fills is not None:  # every file written: the arena holds the whole state
                staging.current = staged
            return result
        except PlanChanged:
            staging.current = None  # the arena holds tensors that did not fit: never flushed
            raise
        finally:
            staging.busy.release()

    def wait_inflight(self, reason: str) -> None:
        """Wait for the background save still writing (its failure is its own handle's)."""
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

    # background saves ---------------------------------------------------------------------------------------
    def save_async(self, plan: SavePlan, job: Job) -> SaveHandle:
        """Copy the state into the arena (the only stall) and write it in the background once `release` lets
        the writer go."""
        staging = self.arena.staging
        if not staging.early:  # an early copy holds it already
            staging.busy.acquire()
        try:
            staged = staging.stage(plan, step=job.step)
        except BaseException:
            staging.busy.release()
            raise
        job.deadline = None
        job.progress = self.progress(staged.nbytes, what=f"{job.reason} save of step {job.step} (background)")
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
            plan=self.planner.steady.last,
        )
        self._go = threading.Event()
        return self.spawn(job, staged, go=self._go)

    def spawn(self, job: Job, staged: Staged, *, go: threading.Event | None = None) -> SaveHandle:
        """Write ``staged`` in the background; the caller holds ``staging.busy``, released when writing ends.
        ``go``: the writer waits for it first. A new thread that runs Python at once keeps the GIL from the thread
        that started it for up to a switch interval (5 ms), which `save` would add to the training loop's stall."""
        handle = SaveHandle(job.step, progress=job.progress)
        handle.asynchronous = True
        staging = self.arena.staging

        def write() -> SaveResult:
            if go is not None:
                go.wait()
            _lower_priority(self.background_nice)
            try:
                return self.write_and_commit(
                    job, staged.specs, staged.docs, blobs=staged.blobs, threads=self.background_threads
                )
            finally:
                staging.busy.release()

        def committed() -> None:  # now, unhurried, the buffers an emergency save's threads need
            with contextlib.suppress(OSError):  # no memory to map them: an emergency save makes its own
                direct.PooledBuffer.reserve(direct.BUFFERS_PER_WRITER * self.threads)

        handle.start(write, name="preemptible-writer", committed=committed)
        self._inflight = handle
        return handle

    # writing and committing ---------------------------------------------------------------------------------
    def write_and_commit(
        self,
        job: Job,
        specs: list[FileSpec],
        docs: dict[str, bytes],
        *,
        blobs: dict[str, memoryview] | None,
        threads: int | None = None,
    ) -> SaveResult:
        """Write the job's files and commit them (`Committer`); then learn from it, record it, rotate."""
        self._writing.add(job.step)
        committer = Committer(
            self.storage,
            self.root,
            coordinator=self._coordinator(),
            clock=self._clock,
            monotonic=self._monotonic,
            verify_after_save=self.verify_after_save,
        )
        try:
            result = committer.write(job, specs, docs, blobs, threads or self.threads)
        except BaseException as e:
            self._failed(job, e)
            raise
        finally:
            self._writing.discard(job.step)
        self._committed(job, result)
        return result

    def _failed(self, job: Job, e: BaseException) -> None:
        """A save that did not commit: its own files removed, the journal told; an I/O error raised as the
        `SaveError` that says what is left (else the caller re-raises ``e``)."""
        if job.codec is not None:
            job.codec.close()
        if self._leader and job.write_dir:
            self._abandon(job.write_dir)  # this attempt's own files only: never a committed step's
        if isinstance(e, PlanChanged):
            return
        if isinstance(e, SaveCancelled):
            self.events.event(Event.SAVE_ABANDONED, job.step, reason=job.reason, written=job.progress.done)
            return
        self.events.event(Event.SAVE_FAILED, job.step, reason=job.reason, error=f"{type(e).__name__}: {e}")
        if isinstance(e, OSError) and not isinstance(e, SaveError):
            object_store = self.storage.kind == "object"
            raise save_error(
                e, job.step, job.path, root=self.root, newest=self.listing.latest(), object_store=object_store
            ) from e

    def _committed(self, job: Job, result: SaveResult) -> None:
        """After a commit: the measurements refined, the journal told and synced, retention applied."""
        compression = self.measurements.learn(job, result)
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
            self.lifecycle.rotate(just_saved=job)  # one rank deletes; the others would race it
        self.events.sync()

    def _abandon(self, path: str) -> None:
        try:
            self.storage.remove_tree(path)
        except OSError as e:  # leftovers are harmless: invisible without COMMIT.json, cleaned later
            log.warning("could not remove the failed save's leftovers at %s (%s)", path, e)
