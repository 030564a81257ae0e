"""Run: the training loop wrapper that ties notice, save, exit and resume together.

``for step in run.steps(total)`` resumes after the newest valid checkpoint, saves periodically, and at the
first step boundary after a notice writes the emergency checkpoint and ends the process with the exit
policy's code. Everything it does is written to the journal.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

import numpy
import torch

from preemptible import dist
from preemptible._version import __version__
from preemptible.accumulation import OptimizerSteps
from preemptible.checkpoint import Checkpointer, SaveHandle, SaveResult
from preemptible.emergency import Emergency
from preemptible.errors import (
    CheckpointCorruptError,
    PreemptibleError,
    SaveCancelled,
    StateDivergenceError,
    UnsupportedStateError,
)
from preemptible.events import Advisory, Event, SaveReason, tag
from preemptible.guard import Guard
from preemptible.journal import Journal, clean, user_fields
from preemptible.notice import Clock, Notice, NoticeKind, NoticeSource
from preemptible.options import EXIT_SAVE_FAILED, RunOptions
from preemptible.relay import ReportFile
from preemptible.sources import slurm
from preemptible.state import RNGState, capture, check_state, flatten
from preemptible.store import retention
from preemptible.store.io import ephemeral_reason
from preemptible.trackers import Trackers, continue_wandb
from preemptible.validate import DEFAULT_RTOL, Probe

log = logging.getLogger("preemptible")

ROOT_ENV = "PREEMPTIBLE_ROOT"
"""Overrides the root given in code (``preemptible drill --reference`` gives its reference run a root of its own)."""

PROGRESS_QUIET_S = 5.0
"""After this many seconds without a journal event, the next step boundary journals a ``progress`` event: what a
process killed without a word ran past its last checkpoint shows in ``preemptible report`` (steps redone) to
within these seconds, at one short line per 5 s at most."""

_RNG = "_rng"
_RUN = "_run"
_LOOP = "_loop"


class Run:
    """A preemption-safe training run.

    Args:
        root: where checkpoints and the journal live: a local path or an s3://, gs://, az:// URL
            (``$PREEMPTIBLE_ROOT`` overrides it).
        save_every: save every this many completed steps (``step % save_every == 0``). None: no step-based saves.
        save_interval_s: save when this many seconds have passed since the last save. None: no time-based saves.
        keep: committed checkpoints kept (>= 2); the newest validated one is kept in addition.
        keep_best: ``(figure, "min" | "max")``, e.g. ``("val_loss", "min")``: also keep the best checkpoint by a
            figure logged with `log`. A figure logged during step k belongs to the next checkpoint taken after it
            (``figures`` in its COMMIT.json).
        save_on_best: save at the boundary after a new best of the ``keep_best`` figure, so the best state is not
            left unsaved until the next periodic save.
        sources: notice sources (see `Guard`); None auto-detects, ``$PREEMPTIBLE_SOURCES`` overrides.
        grace: seconds from a signal to the hard kill (the deadline of signal notices). None: the platform's
            default (see `Guard`).
        exit_code: the process's exit code after an emergency save. None: ``$PREEMPTIBLE_EXIT_CODE``, else the
            platform's default: 143 on Kubernetes (so a Job does not count the pod as Succeeded), 0 elsewhere.
        on_advisory: what an advisory notice (AWS rebalance recommendation) does: ``"save"`` (default) an
            early checkpoint at the next boundary while training goes on, ``"stop"`` treat it as a notice,
            ``"ignore"``.
        requeue: SLURM only: ``scontrol requeue`` the job after a successful emergency save. None:
            ``$PREEMPTIBLE_SLURM_REQUEUE``, else when Slurm says the job is requeueable (``--requeue``) and still
            running (not cancelled by its user); see `preemptible.sources.slurm`.
        async_save: periodic saves copy the state into reused staging buffers and write in the background
            (default True): training stalls only for the copy. Emergency and final saves are always direct.
        prestage_every: keep the staging buffer refreshed every this many steps (for GPU states and long steps).
            When a notice leaves too little time for the current step to land, the pre-staged state (at most
            ``prestage_every - 1`` steps old) is flushed instead, even before the step in progress ends; the
            journal says so. None: off.
        bf16_moments: write optimizer moments as bfloat16 (halves optimizer state; lossy: a resumed run is close
            to, not bit-identical with, an uninterrupted one). Restored into the optimizer's own dtype.
        probe: a function returning a loss on a fixed batch, e.g. ``lambda: loss_fn(model(x0), y0)``. Its value is
            stored at every save and recomputed after a restore; a checkpoint whose probe disagrees (relative
            difference over ``probe_rtol``) is marked invalid and the previous one is used. It runs with
            gradients off, modules in eval mode and the random streams forked: it never changes training.
        verify_after_save: read every file back and check its checksum before committing a save.
        compress: write tensor files compressed (lossless, byte-grouped zstd: ``.safetensors.zst``): ``"auto"``
            (default) compresses a save when this state's measured compression makes it at least 10% faster on the
            destination's measured bandwidth (object stores, network disks; not a fast local disk), True always,
            False never. See the README's "Compression".
        per_rank: under several ranks (torchrun), the state entries that differ between ranks (a data loader's
            position, a dict of per-rank counters): each rank saves and restores its own. Every other entry is
            taken to be the same on every rank (DDP) and saved once; each save checks that it is (see
            `Checkpointer`), and a difference is a `StateDivergenceError` naming the entries and this option.
            RNG streams are always per rank.
        allow_fresh_start: when checkpoints exist but none verifies, move them aside (``<root>/quarantine/``)
            and start at step 0 instead of raising `CheckpointCorruptError` (the default: never silently).
        storage_options: for a URL root (``s3://``, ``gs://``, ``az://``), arguments to its fsspec file system
            (credentials, ``client_kwargs={"endpoint_url": ...}``); the backend's own environment variables and
            credential chain apply as well.
        trackers: TensorBoard ``SummaryWriter``s (anything with ``flush()``) to flush on a notice, after the
            emergency save. The active W&B run is marked preempting without being named here, and a restart
            continues it (see `preemptible.trackers`).
        exit_on_notice: True (default) ends the process after the emergency save; False ends ``steps()``
            instead and leaves ``run.notice`` set, for loops that must do more before exiting.
        guard: a ready `Guard` to use instead of building one from ``sources``/``grace``.
        clock: epoch seconds; monotonic: a monotonic clock (both injected by tests).
        **state: what to checkpoint: modules, optimizers, schedulers, GradScaler, stateful data loaders (anything
            with ``state_dict``/``load_state_dict``) and plain dicts (updated in place on restore). RNG streams
            are added automatically. Names must not start with ``_`` nor be one of `RESERVED` (this class's own
            keywords).

    Raises:
        UnsupportedStateError: a state entry that cannot be checkpointed (checked here, leaf by leaf), naming it.
        ValueError: an option out of its range.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        save_every: int | None = None,
        save_interval_s: float | None = None,
        keep: int = 2,
        keep_best: tuple[str, str] | None = None,
        save_on_best: bool = False,
        sources: str | Iterable[str | NoticeSource] | None = None,
        grace: float | None = None,
        exit_code: int | None = None,
        exit_on_notice: bool = True,
        on_advisory: str = "save",
        requeue: bool | None = None,
        async_save: bool = True,
        prestage_every: int | None = None,
        bf16_moments: bool = False,
        probe: Probe | None = None,
        probe_rtol: float = DEFAULT_RTOL,
        verify_after_save: bool = False,
        compress: bool | str = "auto",
        allow_fresh_start: bool = False,
        storage_options: dict[str, Any] | None = None,
        guard: Guard | None = None,
        clock: Clock = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        per_rank: Iterable[str] = (),
        trackers: Iterable[Any] = (),
        **state: Any,
    ) -> None:
        for name in state:
            if name.startswith("_"):
                raise UnsupportedStateError(
                    f"state name {name!r} starts with '_', which preemptible reserves for its own entries; rename it",
                    key=name,
                )
        check_state(state)
        self.options = RunOptions.build(
            state,
            RESERVED,
            per_rank=per_rank,
            on_advisory=on_advisory,
            save_every=save_every,
            save_interval_s=save_interval_s,
            keep=keep,
            prestage_every=prestage_every,
            exit_code=exit_code,
            requeue=requeue,
        )
        self.on_advisory = self.options.on_advisory
        self.requeue = requeue
        override = os.environ.get(ROOT_ENV, "").strip()
        if override:
            log.info("checkpoint root %s from $%s (the code asked for %s)", override, ROOT_ENV, os.fspath(root))
        self.root = override or os.fspath(root)
        self.save_every = save_every
        self.save_interval_s = save_interval_s
        self.exit_code = exit_code
        self.exit_on_notice = exit_on_notice
        self._clock = clock
        self._monotonic = monotonic
        self.rank = dist.rank()
        self.journal: Journal | None = None
        self.async_save = async_save
        self.prestage_every = prestage_every
        if save_on_best and keep_best is None:
            raise ValueError(
                "save_on_best=True needs keep_best=(figure, 'min' or 'max'): which figure makes a checkpoint the best"
            )
        self.save_on_best = save_on_best
        self._figures: dict[str, Any] = {}
        """Figures logged since the last save: the next checkpoint records them (``figures`` in COMMIT.json)."""
        self._best: float | None = None
        self._best_known = False
        self.checkpointer = Checkpointer(
            self.root,
            keep=keep,
            keep_best=keep_best,
            clock=clock,
            monotonic=monotonic,
            moments_dtype=torch.bfloat16 if bf16_moments else None,
            probe=probe,
            probe_rtol=probe_rtol,
            verify_after_save=verify_after_save,
            compress=compress,
            storage_options=storage_options,
            per_rank=(_RNG, _LOOP, *self.options.per_rank),
        )
        self.allow_fresh_start = allow_fresh_start
        self.guard = guard if guard is not None else Guard(sources, grace=grace, clock=clock)
        self.trackers = Trackers(trackers)
        """What a notice flushes and marks (`preemptible.trackers`); integrations add the framework's writers."""
        self._meta: dict[str, Any] = {}
        self._loop: dict[str, Any] = {"epoch": 0, "done": 0, "rng": None}
        """Where `epochs`/`batches` are: the epoch, the batches done in it, the random streams at its start."""
        self._finished = False  # the last step ran and its final checkpoint committed
        self.state: dict[str, Any] = {**state, _RNG: RNGState(), _RUN: self._meta, _LOOP: self._loop}
        flatten(capture(self.state))  # every leaf storable now: a clear error here, not at the first save
        self.step: int = 0
        """Completed steps so far (the step a checkpoint taken now would carry)."""
        self.attempt: int | None = None
        """This process start's attempt number (1-based, the same on every rank of one launch), once begun."""
        self.resumed_from: int | None = None
        """The step restored at start, or None for a fresh start."""
        self.preempted = False
        """True once an emergency save has ended the loop."""
        self.last_save: SaveResult | None = None
        self._last_save_time = 0.0
        self._entered = False
        self._advisory_done = False
        self._prepared = False
        self._pending: SaveHandle | None = None
        self.emergency = Emergency(
            self.checkpointer,
            self.guard,
            events=lambda: self.journal,
            state_bytes=self._state_bytes,
            prestage_every=prestage_every,
            clock=clock,
            rank=self.rank,
        )
        self._boundary_at = 0.0
        self._optimizer_steps: OptimizerSteps | None = None  # from the start of the loop to `close`
        self._waited = 0  # boundaries a notice's stop waited for an accumulation to end (`_waits_for_optimizer`)
        self._owed: int | None = None  # the step a periodic save fell due at, mid-accumulation: saved at its end
        self._prestage_owed = False  # a pre-stage fell due mid-accumulation: staged at its end
        self._start: int | None = None
        self._auto_close = False
        self._total: int | None = None
        self._planned = False
        self.step_time: float | None = None
        """Seconds per step (moving average), once steps have run."""

    def __repr__(self) -> str:
        names = [n for n in self.state if not n.startswith("_")]
        return f"Run({self.root!r}, state={names}, step={self.step})"

    # lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self) -> Run:
        self._open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _open(self) -> None:
        if self._entered:
            return
        _ensure_log_handler()
        continue_wandb(self.root)
        self.journal = Journal(self.checkpointer.storage, rank=self.rank, clock=self._clock)
        self.checkpointer.journal = self.journal
        if self.rank == 0:
            self.journal.report = ReportFile.from_env(root=self.root, journal=self.journal.path)
        reason = ephemeral_reason(self.checkpointer.storage)
        if reason is not None and self.rank == 0:
            log.warning(
                "[rank=%d] checkpoints will not survive the machine: %s. Use storage that outlives it: a network "
                "or persistent volume, or an object store (s3://, gs://, az://)",
                self.rank,
                reason,
            )
            self.journal.event(Event.EPHEMERAL_ROOT, None, why=reason)
        coord = self.checkpointer.coordinator
        if coord is not None:
            if self.save_interval_s is not None or self.prestage_every is not None:
                raise PreemptibleError(
                    f"save_interval_s and prestage_every need one process; this job has {coord.world} ranks, whose "
                    "clocks would pick different steps. Use save_every (steps), which every rank counts alike"
                )
            dist.check_shared_root(self.checkpointer.storage, coord)
        self.guard.start()
        self.emergency.start()
        self._entered = True

    def close(self) -> None:
        """Finish a background save, remove signal handlers, stop pollers, flush the journal. Idempotent."""
        self.emergency.stop()
        if self._pending is not None:
            self._reap(block=True)
        if self._optimizer_steps is not None:
            self._optimizer_steps.close()
            self._optimizer_steps = None
        self.guard.close()
        if self._finished and self.guard.platform.scheduler == "slurm":
            _ignore_late_warning()
        if self.journal is not None:
            self.journal.close()
        self._entered = False

    @property
    def notice(self) -> Notice | None:
        """The notice that stopped (or will stop) this run, or None."""
        return self.guard.notice

    # the loop ----------------------------------------------------------------------------------------------
    @property
    def start_step(self) -> int:
        """The step this run starts at: 0 on a fresh start, else the step of the checkpoint it resumed from.

        Reading it the first time opens the run (signal handlers, notice sources, journal) and restores the newest
        valid checkpoint, verified, with fallback, exactly as `steps` would; later reads (and `steps`) reuse that.
        For loops that need the step before they start, e.g. to build a scheduler or skip epochs.
        """
        if self._start is None:
            self._begin(None)
        assert self._start is not None
        return self._start

    def _begin(self, total: int | None) -> int:
        if self._start is not None:
            return self._start
        self._auto_close = not self._entered
        self._open()
        if self._optimizer_steps is None:
            self._optimizer_steps = OptimizerSteps(self.state)
        assert self.journal is not None
        self.attempt = self._attempt(self.journal)
        self.journal.event(
            Event.START,
            None,
            attempt=self.attempt,
            total=total,
            pid=os.getpid(),
            host=socket.gethostname(),
            version=__version__,
            world_size=dist.world_size(),
            sources=[s.name for s in self.guard.sources],
            argv=sys.argv,
        )
        start = self._resume()
        self.step = start
        self._start = start
        self._last_save_time = self._monotonic()
        self._boundary_at = self._monotonic()
        return start

    def _attempt(self, journal: Journal) -> int:
        """This process start's attempt number (1-based): rank 0 counts the earlier starts in the journal, and every
        rank of the launch takes rank 0's number through the store (one round)."""
        mine = journal.earlier_starts() + 1 if self.rank == 0 else 0
        coord = self.checkpointer.coordinator
        if coord is None:
            return mine
        with dist.session(coord) as store:
            return int(coord.reduce(store, coord.round("attempt"), str(mine), lambda values: values[0]))

    def steps(self, total: int) -> Iterator[int]:
        """Yield the step numbers still to run, ``0 .. total-1``, after restoring the newest valid checkpoint.

        At each boundary (when the loop body returns) it saves if a save is due, and after a notice it writes
        the emergency checkpoint and exits (see the class docs). After the last step it saves a final
        checkpoint and leaves ``DONE.json`` in the root, so a wrapper can tell "finished" from "preempted". Leaving
        the loop early (a ``break``) saves nothing and is journaled as such: a rerun resumes from the last checkpoint.
        """
        if total < 0:
            raise ValueError(f"expected total >= 0 steps, found {total}")
        self._total = total
        try:
            start = self._begin(total)
            if not self._ready(start, total):
                return
            for step in range(start, total):
                try:
                    yield step
                except GeneratorExit:
                    self._left(step)
                    raise
                if self.boundary(step + 1):
                    return
            self._finish(total)
        finally:
            if self._auto_close:
                self.close()

    def _left(self, step: int) -> None:
        """The loop was left before its end: a ``break`` in it (early stopping), or an error raised in its body.
        Journaled, so that a report tells it from a kill. Nothing is saved (the step may be half done): run again,
        and it resumes from the last checkpoint."""
        if self.journal is not None and not self.preempted and not self._finished:
            self.journal.event(Event.EXIT, step, code=None, reason="left the loop", saved=False)

    def _ready(self, start: int, total: int | None) -> bool:
        """False when there is nothing to run: a notice came during the restore, or the run had finished."""
        assert self.journal is not None
        if self.guard.should_stop(start):
            self._stop(start)  # a notice during restore: nothing new to save, exit promptly
            return False
        if total is not None and start >= total:
            self.journal.event(Event.DONE, start, total=total, already=True)
            self._finished = True
            return False
        self.checkpointer.clear_finished()
        return True

    def boundary(self, completed: int) -> bool:
        """A step boundary: call it after each optimizer step with the number of steps completed, when driving the
        loop yourself (`steps`, `epochs` and the framework integrations call it for you).

        It saves when a save is due and, after a notice, agrees the stop step with every rank, writes the emergency
        checkpoint and ends the process with the exit policy's code (``SystemExit``). With ``exit_on_notice=False``
        it returns True instead: end the loop now. Otherwise False: train on.
        """
        if self._start is None:
            self._begin(None)
        total = self._total
        self.step = completed
        now = self._monotonic()
        spent = now - self._boundary_at
        self._boundary_at = now
        self.step_time = spent if self.step_time is None else 0.9 * self.step_time + 0.1 * spent
        steps = self._optimizer_steps
        stepped = steps.boundary(completed) if steps is not None else True
        if self.guard.should_stop(completed):
            if self._waits_for_optimizer(completed, stepped):
                return False
            self._stop(completed)
            return True
        if self.guard.advisory is not None and not self._advisory_done and (total is None or completed < total):
            if self._advisory(completed):
                return True
        elif self._periodic_due(completed, total) or (self._owed is not None and (total is None or completed < total)):
            if self._owed is None:
                self._owed = completed
            if steps is not None and completed - self._owed < steps.limit and steps.accumulating(stepped):
                pass  # owed: saved at the optimizer step that ends this accumulation (see `_waits_for_optimizer`)
            else:
                self._owed = None
                self._save(completed, SaveReason.PERIODIC, blocking=not self.async_save)
                # a notice that came during the save
                if self.guard.should_stop(completed) and not self._waits_for_optimizer(completed, stepped):
                    self._stop(completed)
                    return True
        elif self.prestage_every is not None and (completed % self.prestage_every == 0 or self._prestage_owed):
            # staged mid-accumulation, a flush would land a state without the accumulated gradients: at its end
            self._prestage_owed = steps is not None and steps.accumulating(stepped)
            if not self._prestage_owed:
                self.checkpointer.prestage(self.state, completed)
        elif self.save_on_best and self._is_new_best():
            self._save(completed, SaveReason.BEST, blocking=not self.async_save)
        elif not self._prepared:
            self._prepare()
        if self._pending is not None:
            self._reap()
        journal = self.journal
        if journal is not None and journal.last_at is not None and self._clock() - journal.last_at >= PROGRESS_QUIET_S:
            journal.event(Event.PROGRESS, completed)  # a process killed without a word still shows what it ran
        return False

    def _waits_for_optimizer(self, completed: int, stepped: bool) -> bool:
        """Whether a notice's stop at this boundary waits for the optimizer step that ends a gradient accumulation
        (see `preemptible.accumulation`): a checkpoint here would hold the data position after batches whose
        gradients it lacks. It waits at most `OptimizerSteps.limit` boundaries (twice the longest gap between
        optimizer steps seen), on one process also not past half the time left; then it stops anyway, and says the
        resume will not be exact. Every rank decides alike: the same loop, the same gradients (one process alone
        weighs time)."""
        steps = self._optimizer_steps
        if steps is None or not steps.accumulating(stepped):
            if self._waited:
                log.warning(
                    "[rank=%d] the gradient accumulation ended at step %d: stopping there", self.rank, completed
                )
            return False
        self._waited += 1
        left = self.guard.remaining()
        need = (steps.limit - self._waited) * (self.step_time or 0.0)
        if self._waited >= steps.limit or (dist.world_size() == 1 and left is not None and need > 0.5 * left):
            log.warning(
                "[rank=%d] stopping at step %d in the middle of a gradient accumulation (no optimizer step for %d "
                "steps, %s left): the batches since the last optimizer step are in the checkpoint's data position "
                "but not their gradients, so the resume will not be exact",
                self.rank,
                completed,
                self._waited,
                f"{left:.1f} s" if left is not None else "unknown time",
            )
            return False
        if self._waited == 1:
            log.warning(
                "[rank=%d] notice at step %d, in the middle of a gradient accumulation (no optimizer step since the "
                "last boundary): training on to its optimizer step (at most %d more steps), then the emergency save",
                self.rank,
                completed,
                steps.limit - 1,
            )
        return True

    def _prepare(self) -> None:
        """After the first step of this process (the optimizer's state exists by then): make the plan of a save
        ahead of any notice, so the emergency save only refills it (`Checkpointer.prepare`)."""
        self._prepared = True
        t = self._monotonic()
        self._stamp(self.step)  # as a save sets it: the same shape
        try:
            periodic = self.save_every is not None or self.save_interval_s is not None
            staged = (self.async_save and periodic) or self.prestage_every is not None  # they will allocate the arena
            ready = self.checkpointer.prepare(self.state, arena=staged)
        except Exception as e:  # the first save will say what is wrong, with its own error
            log.debug("preparing the save plan failed: %r", e)
            return
        log.debug("save plan prepared (%s) in %.3f s", "ready" if ready else "general path", self._monotonic() - t)

    # epoch-structured loops ------------------------------------------------------------------------------------
    def epochs(self, total: int) -> Iterator[int]:
        """Yield the epoch numbers still to run, ``0 .. total-1``, for loops built of epochs over a data loader:

            for epoch in run.epochs(args.epochs):
                for data, target in run.batches(train_loader):  # one optimizer step per batch
                    ...
                evaluate(); scheduler.step()                    # epoch-end work runs once per epoch

        A resume restarts the epoch it stopped in, and `batches` skips the batches that epoch had done, in the
        same order (see there). An epoch whose batches were all done but whose end-of-epoch work had not run yet
        (a notice at its last step) is yielded again with no batches left, so that work runs exactly once. After
        the last epoch it saves the final checkpoint, as `steps` does.
        """
        if total < 0:
            raise ValueError(f"expected total >= 0 epochs, found {total}")
        try:
            start = self._begin(None)
            if self._loop["epoch"] >= total:
                assert self.journal is not None
                self.journal.event(Event.DONE, start, total=start, already=True)
                return
            if not self._ready(start, None):
                return
            while self._loop["epoch"] < total:
                try:
                    yield self._loop["epoch"]
                except GeneratorExit:
                    self._left(self.step)
                    raise
                if self.preempted:
                    return  # exit_on_notice=False: batches() ended the epoch early
                self._loop.update(epoch=self._loop["epoch"] + 1, done=0, rng=None)
            self._finish(self.step)
        finally:
            if self._auto_close:
                self.close()

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """The batches of this epoch still to run, each followed by a step boundary (see `boundary`).

        After a resume mid-epoch it makes the loader's iterator as the interrupted epoch made it (the random streams
        as they were at that epoch's start, so a shuffling sampler draws the same order and workers the same
        seeds), skips the batches done before the checkpoint (they are loaded and dropped: O(batches done)), then
        puts the streams back as the checkpoint had them. A loader given to `Run` as state (a stateful loader
        that saves its own position) is not skipped.
        """
        loop = self._loop
        skip = int(loop["done"])
        stateful = any(loader is obj for obj in self.state.values())
        if stateful or skip == 0:
            loop["rng"] = None if stateful else {"global": RNGState().state_dict(), **_loader_streams(loader)}
            iterator = iter(loader)
        else:
            if loop["rng"] is None:
                raise PreemptibleError(
                    f"expected the random streams of epoch {loop['epoch']}'s start in the checkpoint, to skip its "
                    f"{skip} done batches in their order; found none (the checkpoint was not written inside "
                    "run.batches()). Resume with the loop that wrote it"
                )
            resumed = RNGState().state_dict()
            RNGState().load_state_dict(loop["rng"]["global"])
            _put_back_loader_streams(loader, loop["rng"])
            iterator = iter(loader)
            for _ in range(skip):
                if next(iterator, _END) is _END:
                    break
            RNGState().load_state_dict(resumed)
        for batch in iterator:
            yield batch
            loop["done"] += 1
            if self.boundary(self.step + 1):
                return

    def log(self, **figures: Any) -> None:
        """Record figures (loss, throughput, ...) for the current step in the journal. A one-element tensor or a
        NumPy scalar is recorded as its number (``.item()``: on a GPU that waits for the step's kernels, so there
        log every few steps, or log a number you read anyway).

        Nothing logged can end training or spoil the journal: a figure named like a field the journal writes itself
        (``t``, ``event``, ``step``, ``rank``, ``file``) is recorded as ``user_<name>`` (``run.log(step=3)`` gives
        ``user_step``); NaN and infinities are recorded as the strings ``"nan"``, ``"inf"`` and ``"-inf"``, an int
        beyond 64 bits as the nearest float (``"inf"``/``"-inf"`` beyond the float range). Only finite numbers count
        for ``keep_best`` (a NaN is never the best) and appear in ``preemptible report``'s figures.

        Raises:
            PreemptibleError: called outside ``run.steps()``.
        """
        if self.journal is None:
            raise PreemptibleError("Run.log() needs a started run: call it inside `for step in run.steps(...)`")
        kept = user_fields({k: _figure(v) for k, v in figures.items()})
        self.journal.event(Event.LOG, self.step, **kept)
        self._figures.update(kept)

    def save(self, reason: str = SaveReason.MANUAL) -> SaveResult:
        """Save a checkpoint of the current step now (blocking)."""
        self._open()
        return self._save(self.step, reason, raise_errors=True)  # type: ignore[return-value]

    # internals ---------------------------------------------------------------------------------------------
    def _resume(self) -> int:
        assert self.journal is not None
        t0 = self._monotonic()
        self.checkpointer.cleanup()
        try:
            restored = self.checkpointer.restore(self.state)
        except CheckpointCorruptError as e:
            if not self.allow_fresh_start:
                raise
            moved = self.checkpointer.quarantine()
            self.journal.event(Event.FRESH_AFTER_CORRUPTION, 0, error=str(e), quarantined=moved)
            log.error(
                "[rank=%d] no checkpoint under %s verifies; allow_fresh_start=True: starting at step 0 and "
                "moving them aside to %s",
                self.rank,
                self.root,
                moved,
            )
            restored = None
        if restored is None:
            self.journal.event(Event.FRESH, 0)
            log.info("[rank=%d] no checkpoint under %s: starting at step 0", self.rank, self.root)
            return 0
        self.resumed_from = restored
        if self.rank == 0:
            self.checkpointer.rotate()  # the restored checkpoint has just validated: older ones may go now
        seconds = self._monotonic() - t0
        self.journal.event(Event.RESUME, restored, seconds=round(seconds, 6))
        log.info("[rank=%d] resumed from the checkpoint of step %d (%.2f s)", self.rank, restored, seconds)
        return restored

    def _periodic_due(self, completed: int, total: int | None) -> bool:
        if total is not None and completed >= total:
            return False  # the final save covers it
        if self.save_every is not None and completed % self.save_every == 0:
            return True
        return self.save_interval_s is not None and self._monotonic() - self._last_save_time >= self.save_interval_s

    def _save(
        self,
        step: int,
        reason: str,
        *,
        raise_errors: bool = False,
        deadline: float | None = None,
        blocking: bool = True,
    ) -> SaveResult | None:
        self._stamp(step)
        figures = _recordable(self._figures)
        try:
            handle = self.checkpointer.save(
                self.state,
                step,
                reason=reason,
                deadline=deadline,
                blocking=blocking,
                extra={"figures": figures} if figures else None,
            )
            self._last_save_time = self._monotonic()
            self._figures.clear()  # they belong to this checkpoint
            self._note_best(figures)
            if not handle.done():
                self._pending = handle
                return None
            result = handle.wait()
        except (UnsupportedStateError, StateDivergenceError):
            raise  # the state itself cannot be saved: retrying at the next save would fail the same way
        except (OSError, PreemptibleError) as e:
            if raise_errors:
                raise
            log.warning("[rank=%d] %s save of step %d failed, training continues: %s", self.rank, reason, step, e)
            return None
        self._report(result, reason)
        return result

    def _stamp(self, step: int) -> None:
        """The run's own entry of the checkpoint: the step and the version that saved it."""
        self._meta.clear()
        self._meta.update({"step": step, "saved_by": __version__})

    def _is_new_best(self) -> bool:
        """Whether the keep_best figure logged since the last save beats every checkpoint's so far."""
        best = self.checkpointer.keep_best
        value = _recordable(self._figures).get(best[0]) if best else None
        if best is None or value is None:
            return False
        if not self._best_known:  # once per process: what the checkpoints already on storage record
            self._best_known = True
            infos = self.checkpointer.checkpoints()
            step = retention.best_step(infos, best)
            self._best = next((retention.figure_of(c, best[0]) for c in infos if c.step == step), None)
        return self._best is None or (value < self._best if best[1] == "min" else value > self._best)

    def _note_best(self, figures: dict[str, Any]) -> None:
        best = self.checkpointer.keep_best
        value = figures.get(best[0]) if best else None
        if best is None or value is None or not self._best_known:
            return
        if self._best is None or (value < self._best if best[1] == "min" else value > self._best):
            self._best = value

    def _reap(self, *, block: bool = False) -> None:
        """Collect a finished background save: log it, or warn if it failed (training goes on)."""
        handle = self._pending
        if handle is None or (not block and not handle.done()):
            return
        self._pending = None
        try:
            result = handle.wait()
        except SaveCancelled:
            return
        except (OSError, PreemptibleError) as e:
            log.warning(
                "[rank=%d] background save of step %d failed, training continues: %s", self.rank, handle.step, e
            )
            return
        self._report(result, SaveReason.BACKGROUND)

    def _report(self, result: SaveResult, reason: str) -> None:
        self.last_save = result
        if not result.skipped and not self._planned and reason != SaveReason.EMERGENCY:  # advice for what comes
            self._plan(result)
        if not result.skipped:
            log.log(
                logging.INFO if self.rank == 0 or reason == SaveReason.EMERGENCY else logging.DEBUG,
                "[rank=%d] %s checkpoint of step %d committed: %.1f MB in %.2f s (%.0f MB/s)",
                self.rank,
                reason,
                result.step,
                result.bytes / 1e6,
                result.seconds,
                result.throughput / 1e6,
            )

    def _plan(self, result: SaveResult) -> None:
        """After the first save: will the emergency save fit this platform's window? (`budget.advise`)"""
        assert self.journal is not None
        self._planned = True
        bandwidth = self.checkpointer.bandwidth
        if bandwidth:
            from preemptible import budget

            budget.advise(
                result.step,
                state_bytes=result.bytes,
                bandwidth=bandwidth,
                platform=self.guard.platform,
                step_time=self.step_time or 0.0,
                journal=self.journal,
                rank=self.rank,
            )

    def _finish(self, total: int) -> None:
        assert self.journal is not None
        self._reap(block=True)
        self._save(total, SaveReason.FINAL, raise_errors=True)
        if self.rank == 0:
            self.checkpointer.mark_finished(total)
        self.journal.event(Event.DONE, total, total=total)
        self._finished = True

    def _advisory(self, completed: int) -> bool:
        """An advisory notice: save early (and keep training), stop, or ignore. True when the loop must end."""
        assert self.journal is not None
        self._advisory_done = True
        notice = self.guard.advisory
        assert notice is not None
        self.journal.event(Event.ADVISORY, completed, **notice.to_json(), action=self.on_advisory)
        log.warning(
            "[rank=%d] advisory %s notice (%s): %s",
            self.rank,
            notice.source,
            notice.detail,
            {Advisory.SAVE: "saving early, training continues", Advisory.STOP: "stopping", Advisory.IGNORE: "ignored"}[
                self.on_advisory
            ],
        )
        if self.on_advisory is Advisory.SAVE:
            self._save(completed, SaveReason.ADVISORY)
        elif self.on_advisory is Advisory.STOP:
            self.guard.trigger(
                Notice(
                    source=notice.source,
                    kind=NoticeKind.TERMINATE,
                    received_at=notice.received_at,
                    deadline=notice.deadline,
                    detail=f"{notice.detail} (on_advisory='stop')",
                )
            )
        if self.guard.should_stop(completed):
            self._stop(completed)
            return True
        return False

    def _state_bytes(self) -> int:
        if self.last_save is not None and self.last_save.bytes:
            return self.last_save.bytes
        return flatten(capture(self.state)).tensor_bytes

    def _stop(self, completed: int) -> None:
        """The emergency path: journal the notice, save (unless nothing new), exit."""
        assert self.journal is not None
        notice = self.guard.notice
        assert notice is not None
        remaining = self.guard.remaining()
        waited = {"waited_for_optimizer_steps": self._waited} if self._waited else {}
        self.journal.event(Event.NOTICE, completed, **notice.to_json(), remaining_s=remaining, **waited)
        log.warning(
            "[rank=%d] %s: %s notice (%s) received; stopping at step %d with %s left",
            self.rank,
            tag(Event.NOTICE, source=notice.source),
            notice.source,
            notice.detail or notice.kind.value,
            completed,
            f"{remaining:.1f} s" if remaining is not None else "unknown time",
        )
        code = self.options.exit_code_after_notice(self.guard.platform.exit_code)
        saved = True
        self.emergency.at_boundary()
        handle = self.emergency.settle(completed, self._pending)
        if handle is not None:
            self._pending = handle
            self._reap(block=True)
        landed, stop_with_it = self.emergency.flush_prestaged(completed)
        if landed is not None:
            self._report(landed, SaveReason.PRESTAGED)
        if stop_with_it:
            pass  # the journal says which step landed and why
        elif completed in (0, self.resumed_from):
            self.journal.event(
                Event.SAVE_SKIPPED, completed, reason=SaveReason.EMERGENCY, why="nothing new since the last checkpoint"
            )
        else:
            deadline = notice.deadline.timestamp() if notice.deadline is not None else None
            try:
                self._save(completed, SaveReason.EMERGENCY, raise_errors=True, deadline=deadline)
                self.guard.acknowledge(notice)
            except BaseException as e:
                saved = False
                code = EXIT_SAVE_FAILED
                log.error("[rank=%d] emergency save of step %d failed: %s", self.rank, completed, e)
                if not isinstance(e, Exception):
                    raise
        if saved and self.rank == 0 and self.guard.platform.scheduler == "slurm":
            wanted = self.options.requeue_wanted()
            requeue, why = slurm.decide(wanted, slurm.job_info() if wanted is None else None)
            log.info("[rank=%d] SLURM: %s", self.rank, why)
            self.journal.event(Event.REQUEUE, completed, ok=slurm.requeue() if requeue else False, why=why)
        self.preempted = True
        tracked = self.trackers.on_notice()
        if tracked["flushed"] or "wandb" in tracked:
            self.journal.event(Event.TRACKERS, completed, **tracked)
        repeats = len(self.guard.notices) - 1
        self.journal.event(
            Event.EXIT,
            completed,
            code=code,
            reason="notice",
            saved=saved,
            later_notices=repeats,
            remaining_s=self.guard.remaining(),
            exit_process=self.exit_on_notice,
        )
        self.journal.sync()
        if self.exit_on_notice:
            _ignore_late_notices()  # before close(): it then leaves these alone (it restores only its own handlers)
            self.close()
            # Interpreter teardown with torch loaded spends 1-1.5 s in the final garbage collection; freezing
            # the heap skips that walk (atexit handlers and finally blocks still run) and cuts it to ~0.3 s.
            gc.freeze()
            raise SystemExit(code)


_END = object()

_LOADER_PARTS = ("sampler", "batch_sampler", "base_dataloader", "dataset")
_COUNTERS = ("iteration", "epoch")


def _loader_parts(loader: Any) -> Iterator[tuple[str, Any]]:
    """The loader and the objects it draws its order from (sampler, batch sampler, a wrapped loader: as Accelerate
    nests them), by attribute path."""
    seen: set[int] = set()
    todo: list[tuple[str, Any, int]] = [("", loader, 0)]
    while todo:
        path, obj, depth = todo.pop(0)
        if obj is None or id(obj) in seen or isinstance(obj, (int, float, str, torch.Tensor)):
            continue
        seen.add(id(obj))
        yield path, obj
        if depth < 4:
            todo += [(f"{path}.{n}" if path else n, getattr(obj, n, None), depth + 1) for n in _LOADER_PARTS]


def _loader_streams(loader: Any) -> dict[str, Any]:
    """What decides a loader's order for the coming epoch besides the global streams: the state of every
    ``torch.Generator`` its parts hold (a sampler's own generator, as Accelerate gives one under several processes)
    and their epoch counters (a seedable sampler's ``epoch``, Accelerate's ``iteration``)."""
    generators: dict[str, torch.Tensor] = {}
    counters: dict[str, int] = {}
    for path, obj in _loader_parts(loader):
        gen = getattr(obj, "generator", None)
        if isinstance(gen, torch.Generator):
            generators[path] = gen.get_state()
        for name in _COUNTERS:
            value = getattr(obj, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                counters[f"{path}:{name}"] = value
    return {"generators": generators, "counters": counters}


def _put_back_loader_streams(loader: Any, saved: dict[str, Any]) -> None:
    parts = dict(_loader_parts(loader))
    for path, state in saved.get("generators", {}).items():
        gen = getattr(parts.get(path), "generator", None)
        if isinstance(gen, torch.Generator):
            gen.set_state(state)
    for key, value in saved.get("counters", {}).items():
        path, name = key.rsplit(":", 1)
        if path in parts:
            setattr(parts[path], name, value)


def _figure(value: Any) -> Any:
    """A value given to `Run.log` as the journal keeps it: a one-element tensor (``loss``, as the step left it) or a
    NumPy scalar as its Python number, so that `report` and the checkpoint's figures see a number, not its text."""
    if isinstance(value, numpy.generic) or (isinstance(value, torch.Tensor) and value.numel() == 1):
        value = value.item()
    return clean(value)  # a NaN or 10**400 as the journal keeps it: keep_best compares only finite numbers


def _recordable(figures: dict[str, Any]) -> dict[str, Any]:
    """The logged figures a checkpoint can record: finite numbers, by name."""
    out: dict[str, Any] = {}
    for k, v in figures.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = v
    return out


def _ignore_late_notices() -> None:
    """From the emergency exit on, SIGTERM and SIGUSR1 are ignored until the process has exited with the policy's
    code: a late SIGTERM (a storm of them, or the orchestrator's second) must not turn a committed, clean stop into
    143. SIGINT keeps its handler: a second Ctrl-C still aborts at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


def _ensure_log_handler() -> None:
    """Show preemptible's INFO lines on stderr unless the application configured logging itself."""
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("preemptible %(levelname)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


RESERVED = frozenset(p for p in inspect.signature(Run.__init__).parameters if p not in ("self", "state"))
"""`Run`'s own keywords: none of them can name a state entry (Python hands them to `Run`, never to ``**state``)."""


def _ignore_late_warning() -> None:
    """After a finished run under Slurm, a ``--signal`` warning (USR1, whose default action ends the process) that
    arrives before the process exits has nothing left to save; left to its default it would turn a finished job
    into a FAILED one (seen on a loaded machine: the warning came a moment after the final checkpoint). Ignore it,
    unless someone installed a handler of their own."""
    import signal

    early = sys.modules.get("_preemptible_early")  # its holding handler is not one of the user's; and Python
    current = signal.getsignal(signal.SIGUSR1)  # resets Python-level handlers to the default as it shuts down
    if current == signal.SIG_DFL or (early is not None and current == early.hold):
        with contextlib.suppress(ValueError):  # closed from another thread: only the main thread sets handlers
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
