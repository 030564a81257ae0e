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
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

import numpy
import torch

from preemptible import budget, dist
from preemptible._version import __version__
from preemptible.accumulation import OptimizerSteps
from preemptible.checkpoint import Checkpointer, SaveResult
from preemptible.checkpoint.memtier import MemoryTier, Tier
from preemptible.emergency import EXIT_PEER_NODE, Emergency, NodeRole, wait_fits
from preemptible.errors import (
    CheckpointCorruptError,
    PreemptibleError,
    UnsupportedStateError,
)
from preemptible.events import Advisory, Event, ExitReason, SaveReason, tag
from preemptible.guard import Guard
from preemptible.journal import Journal, clean, user_fields
from preemptible.loaders import LoopPosition, MidEpochAim, length
from preemptible.notice import Clock, Notice, NoticeKind, NoticeSource
from preemptible.options import RunOptions
from preemptible.relay import AIM_ENV, MID_EPOCH, ReportFile
from preemptible.saves import Saves
from preemptible.schedule import Due, SaveSchedule, StepTimer
from preemptible.state import RNGState, capture, check_state, flatten
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

AIM_HOLD_S = 60.0
"""How long a run under ``preemptible drill`` holds at the boundary it aimed at (`MidEpochAim`) for the drill's
notice or kill; then it trains on (a drill that died must not stall the run)."""

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
            Under several ranks (torchrun) rank 0's clock decides, and every rank saves at one step agreed in the
            background (`preemptible.dist.IntervalAgreement`: no collective at the steps in between).
        save_every_epochs: save after every this many epochs of `epochs` (after the epoch's end work: evaluation,
            ``scheduler.step()``), e.g. 1 for every epoch. None: no epoch-based saves.
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
            platform's default: 143 on Kubernetes (so a Job does not count the pod as Succeeded), 0 elsewhere. An
            emergency save that failed exits 75 (EX_TEMPFAIL: the previous checkpoint is intact, restart the job).
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
        probe_rtol: the relative difference of a recomputed probe from the stored one that fails a checkpoint
            (a finite number >= 0; default `preemptible.validate.DEFAULT_RTOL`).
        verify_after_save: read every file back and check its checksum before committing a save.
        compress: write tensor files compressed (lossless, byte-grouped zstd: ``.safetensors.zst``): ``"auto"``
            (default) compresses a save when this state's measured compression makes it at least 10% faster on the
            destination's measured bandwidth (object stores, network disks; not a fast local disk), True always,
            False never. See docs/storage.md ("Compression").
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
        peer_timeout_s: in a multi-node torchrun job, a rank or node gone without notice (or cut off) is detected
            within this many seconds (`preemptible.dist.PeerWatch`: a stall at the step boundaries, then a check of
            which ranks answer through the store); the survivors journal ``peer_lost`` and exit 76 so torchrun's
            elastic restart (or the scheduler) restarts them from the newest committed checkpoint. None:
            ``$PREEMPTIBLE_PEER_TIMEOUT_S``, else 300; 0 turns it off. Set it above your longest stretch without
            a step boundary that some ranks wait out in a collective (evaluation on one rank, a slow save).
        **state: what to checkpoint: modules, optimizers, schedulers, GradScaler, stateful data loaders (anything
            with ``state_dict``/``load_state_dict``) and plain dicts (updated in place on restore). RNG streams
            are added automatically. Names must not start with ``_`` nor be one of `RESERVED` (this class's own
            keywords).

    Raises:
        UnsupportedStateError: a state entry that cannot be checkpointed (checked here, leaf by leaf), naming it.
        ValueError: an option out of its range.

    Examples:
        >>> import tempfile, torch
        >>> from preemptible import Checkpointer, Run
        >>> model = torch.nn.Linear(4, 2)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> root = tempfile.mkdtemp()
        >>> run = Run(root, model=model, optimizer=opt, save_every=2, sources=[], async_save=False)
        >>> for step in run.steps(4):
        ...     loss = model(torch.randn(8, 4)).pow(2).mean()
        ...     opt.zero_grad()
        ...     loss.backward()
        ...     opt.step()
        >>> Checkpointer(root).latest()
        4
        >>> [step for step in Run(root, model=model, optimizer=opt, sources=[]).steps(6)]  # resumes after step 4
        [4, 5]
    """

    _peers: dist.PeerWatch | None = None  # multi-node jobs: `_open` starts it
    _prev_excepthook: Any = None

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        save_every: int | None = None,
        save_interval_s: float | None = None,
        save_every_epochs: int | None = None,
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
        peer_timeout_s: float | None = None,
        memory_tier: MemoryTier | bool | None = None,
        **state: Any,
    ) -> None:
        _check_names(state)
        check_state(state)
        self.options = RunOptions.build(
            state,
            RESERVED,
            per_rank=per_rank,
            on_advisory=on_advisory,
            save_every=save_every,
            save_interval_s=save_interval_s,
            save_every_epochs=save_every_epochs,
            keep=keep,
            prestage_every=prestage_every,
            exit_code=exit_code,
            requeue=requeue,
            probe_rtol=probe_rtol,
            peer_timeout_s=peer_timeout_s,
        )
        if save_on_best and keep_best is None:
            raise ValueError(
                "save_on_best=True needs keep_best=(figure, 'min' or 'max'): which figure makes a checkpoint the best"
            )
        self.on_advisory = self.options.on_advisory
        self.requeue = requeue
        self.root = _root(root)
        self.save_every = save_every
        self.save_interval_s = save_interval_s
        self.exit_code = exit_code
        self.exit_on_notice = exit_on_notice
        self.async_save = async_save
        self.prestage_every = prestage_every
        self.save_on_best = save_on_best
        self.allow_fresh_start = allow_fresh_start
        self._clock = clock
        self._monotonic = monotonic
        self.rank = dist.rank()
        self.journal: Journal | None = None
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
        self.guard = guard if guard is not None else Guard(sources, grace=grace, clock=clock)
        self.trackers = Trackers(trackers)
        """What a notice flushes and marks (`preemptible.trackers`); integrations add the framework's writers."""
        self.position = LoopPosition(inexact=self._inexact)  # where `epochs`/`batches` are (`preemptible.loaders`)
        meta: dict[str, Any] = {}
        self.state: dict[str, Any] = {**state, _RNG: RNGState(), _RUN: meta, _LOOP: self.position.entry}
        flatten(capture(self.state))  # every leaf storable now: a clear error here, not at the first save
        self.schedule = SaveSchedule(
            save_every=save_every,
            save_interval_s=save_interval_s,
            save_every_epochs=save_every_epochs,
            prestage_every=prestage_every,
            save_on_best=save_on_best,
        )  # when a boundary saves (`preemptible.schedule`)
        self.timer = StepTimer()
        self.saves = Saves(
            self.checkpointer,
            self.state,
            meta,
            schedule=self.schedule,
            timer=self.timer,
            platform=self.guard.platform,
            monotonic=monotonic,
            rank=self.rank,
        )  # every save this run makes goes through it (`preemptible.saves`)
        self.emergency = Emergency(
            self.checkpointer,
            self.guard,
            saves=self.saves,
            trackers=self.trackers,
            policy=self.options.exit_policy,
            exit_process=exit_on_notice,
            prestage_every=prestage_every,
            clock=clock,
            rank=self.rank,
            memory=Tier.of(MemoryTier.of(memory_tier), self.checkpointer),
        )  # the notice-to-exit sequence (`preemptible.emergency`)
        self.step: int = 0
        """Completed steps so far (the step a checkpoint taken now would carry)."""
        self.attempt: int | None = None
        """This process start's attempt number (1-based, the same on every rank of one launch), once begun."""
        self.resumed_from: int | None = None
        """The step restored at start, or None for a fresh start."""
        self.preempted = False
        """True once an emergency save has ended the loop."""
        self._finished = False  # the last step ran and its final checkpoint committed
        self._entered = False
        self._advisory_done = False
        self._optimizer_steps: OptimizerSteps | None = None  # from the start of the loop to `close`
        self._waited = 0  # boundaries a notice's stop waited for an accumulation to end (`_waits_for_optimizer`)
        self._aim: MidEpochAim | None = None  # under ``preemptible drill``: the boundary to hold at (`_hold`)
        self._start: int | None = None
        self._auto_close = False
        self._interval: dist.IntervalAgreement | None = None  # save_interval_s under several ranks
        self._inexact_seen: set[str] = set()

    @property
    def memory(self) -> Tier | None:
        """The memory tier (`preemptible.checkpoint.memtier`), when ``memory_tier`` turned it on."""
        return self.emergency.memory

    @property
    def last_save(self) -> SaveResult | None:
        """The last save this process committed (or skipped), or None."""
        return self.saves.last

    @property
    def step_time(self) -> float | None:
        """Seconds per step (moving average), once steps have run."""
        return self.timer.step_time

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
        lost = exc is not None and self._peers is not None and self._collective_failed(exc)
        self.close()
        if lost:
            raise SystemExit(EXIT_PEER_NODE) from exc

    def _collective_failed(self, exc: BaseException) -> bool:
        """A collective (or the store) failed because a peer is gone: a rank whose neighbour exited after its own
        peer watch found a node lost sees the connection close before its own watch fires. Journal it as the
        loss it is (``peer_lost``, with the error), so every rank of the job ends the same way: exit 76."""
        what = dist.peer_failure(exc)
        if what is None or self._peers is None:
            return False
        self._peer_lost(
            {
                "missing": [],
                "how": f"a collective failed: {what}",
                "timeout_s": self._peers.timeout_s,
                "stalled_s": round(self._peers.stalled(), 3),
            }
        )
        return True

    def _excepthook(self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        """The loop's body raised out of the script (``for step in run.steps(...)`` without ``with``): a lost
        peer still ends with ``peer_lost`` and exit 76 (the traceback is printed first, as always)."""
        lost = self._peers is not None and self._collective_failed(exc)
        self._prev_excepthook(kind, exc, tb)
        if lost:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_PEER_NODE)

    def _open(self) -> None:
        if self._entered:
            return
        _ensure_log_handler()
        continue_wandb(self.root)
        journal = Journal(self.checkpointer.storage, rank=self.rank, clock=self._clock)
        self.journal = journal
        self.checkpointer.journal = journal
        self.saves.attach(journal)
        self.emergency.attach(journal)
        if self.memory is not None:
            self.memory.events = journal
        if self.rank == 0:
            journal.report = ReportFile.from_env(root=self.root, journal=journal.path)
            if journal.report is not None and os.environ.get(AIM_ENV, "").strip() == MID_EPOCH:
                self._aim = MidEpochAim()
        self._warn_if_ephemeral(journal)
        budget.mtbf_from_env()  # a bad $PREEMPTIBLE_MTBF_HOURS is an error here, not after the first step
        coord = self.checkpointer.coordinator
        if coord is not None:
            if self.prestage_every is not None:
                raise PreemptibleError(
                    f"prestage_every needs one process; this job has {coord.world} ranks, whose clocks would flush "
                    "different steps on a notice. Use save_every, save_interval_s or save_every_epochs"
                )
            dist.check_shared_root(self.checkpointer.storage, coord)
            if self.save_interval_s is not None and self._interval is None:
                self._interval = dist.IntervalAgreement(coord)
                self.schedule.agreed = self._interval.due
        self.guard.start()
        if coord is not None and dist.node() is not None and self.options.peer_timeout > 0:
            self._peers = dist.PeerWatch(
                coord, timeout_s=self.options.peer_timeout, on_lost=self._peer_lost, exit_code=EXIT_PEER_NODE
            )
            self.guard.beat = self._peers.beat
            self._prev_excepthook = sys.excepthook
            sys.excepthook = self._excepthook
        self.emergency.start()
        self._entered = True

    def _peer_lost(self, found: dict[str, Any]) -> None:
        """The peer watch found a rank or the store gone (`dist.PeerWatch`): say so; the watch then ends the
        process with `EXIT_PEER_NODE`."""
        log.error(
            "[rank=%d] %s: %s after %.0f s without a step boundary (peer timeout %.0f s); exiting %d so the job "
            "restarts with the nodes that remain (torchrun's elastic restart or the scheduler) from the newest "
            "committed checkpoint",
            self.rank,
            tag(Event.PEER_LOST),
            found["how"],
            found["stalled_s"],
            found["timeout_s"],
            EXIT_PEER_NODE,
        )
        if self.journal is not None:
            self.journal.event(
                Event.PEER_LOST,
                self.step,
                missing=found["missing"],
                how=found["how"],
                timeout_s=found["timeout_s"],
                stalled_s=found["stalled_s"],
                node=dist.node(),
                code=EXIT_PEER_NODE,
            )
            self.journal.sync()
        sys.stdout.flush()
        sys.stderr.flush()

    def _warn_if_ephemeral(self, journal: Journal) -> None:
        reason = ephemeral_reason(self.checkpointer.storage)
        if reason is not None and self.rank == 0:
            log.warning(
                "[rank=%d] checkpoints will not survive the machine: %s. Use storage that outlives it: a network "
                "or persistent volume, or an object store (s3://, gs://, az://)",
                self.rank,
                reason,
            )
            journal.event(Event.EPHEMERAL_ROOT, None, why=reason)

    def close(self) -> None:
        """Finish a background save, remove signal handlers, stop pollers, flush the journal. Idempotent."""
        self.emergency.stop()
        if self.saves.pending is not None:
            self.saves.reap(block=True)
        if self.memory is not None:  # its collectives need every rank: a job that ended in error may not have them
            self.memory.wait(timeout=MEMORY_WAIT_S)
        if self._optimizer_steps is not None:
            self._optimizer_steps.close()
            self._optimizer_steps = None
        if self._peers is not None:
            self._peers.close()
            self._peers = None
            self.guard.beat = None
            if sys.excepthook == self._excepthook:
                sys.excepthook = self._prev_excepthook
        self.guard.close()
        if self._interval is not None:
            self._interval.close()
            self._interval = None
            self.schedule.agreed = None
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

    def _begin(self, total: int | None, resume: Callable[[], int] | None = None) -> int:
        """Open the run, journal its start, and resume: from preemptible's checkpoint, or through ``resume`` (an
        integration whose framework resumes from its own files instead: it journals that and returns the step)."""
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
            node=dist.node(),
            sources=[s.name for s in self.guard.sources],
            argv=sys.argv,
        )
        start = self._resume() if resume is None else resume()
        self.step = start
        self._start = start
        self.schedule.saved(self._monotonic())
        self.timer.start(self._monotonic())
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
        self.schedule.total = total
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
            self.journal.event(Event.EXIT, step, code=None, reason=ExitReason.LEFT_LOOP, saved=False)

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
        if self._aim is not None:  # a loop not built of run.epochs/run.batches: no epoch to stop in the middle of
            self._aim = None
            assert self.journal is not None
            self.journal.event(Event.PROGRESS, completed, held=False)
        return self._boundary(completed)

    def _boundary(self, completed: int) -> bool:
        if self._start is None:
            self._begin(None)
        self.step = completed
        self.timer.boundary(self._monotonic())
        stepped = self._optimizer_steps.boundary(completed) if self._optimizer_steps is not None else True
        if self.guard.should_stop(completed):
            return self._stop_after_optimizer(completed, stepped)
        if self.guard.advisory is not None and not self._advisory_done and self.schedule.before_end(completed):
            if self._advisory(completed):
                return True
        elif self._scheduled(completed, stepped):
            return True
        self._after_boundary(completed)
        return False

    def _stop_after_optimizer(self, completed: int, stepped: bool) -> bool:
        """A notice: stop here, unless the stop waits for the optimizer step that ends an accumulation."""
        if self._waits_for_optimizer(completed, stepped):
            return False
        self._stop(completed)
        return True

    def _scheduled(self, completed: int, stepped: bool) -> bool:
        """Do what the save schedule says is due at this boundary. True when a notice that came during a save ends
        the loop."""
        steps = self._optimizer_steps
        due = self.schedule.due(
            completed,
            self._monotonic(),
            accumulating=(lambda: steps.accumulating(stepped)) if steps is not None else None,
            limit=steps.limit if steps is not None else 0,
            new_best=self.saves.new_best,
        )
        if due is Due.SAVE:
            self.saves.save(completed, SaveReason.PERIODIC, blocking=not self.async_save)
            # a notice that came during the save
            if self.guard.should_stop(completed) and not self._waits_for_optimizer(completed, stepped):
                self._stop(completed)
                return True
        elif due is Due.PRESTAGE:
            self.checkpointer.prestage(self.state, completed)
        elif due is Due.BEST:
            self.saves.save(completed, SaveReason.BEST, blocking=not self.async_save)
        elif due is Due.PREPARE:
            self._prepare()
        if self.memory is not None and self.memory.due(completed):
            if self.async_save:
                self.memory.save_background(self.state, completed, reason=SaveReason.PERIODIC)
            else:
                self.memory.save(self.state, completed, reason=SaveReason.PERIODIC)
        return False

    def _after_boundary(self, completed: int) -> None:
        """Collect a background save that has finished; journal progress after a quiet while."""
        if self.saves.pending is not None:
            self.saves.reap()
        journal = self.journal
        if journal is not None and journal.last_at is not None and self._clock() - journal.last_at >= PROGRESS_QUIET_S:
            journal.event(Event.PROGRESS, completed)  # a process killed without a word still shows what it ran

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
        if self._waited >= steps.limit or (dist.world_size() == 1 and not wait_fits(need, left)):
            log.warning(
                "[rank=%d] stopping at step %d in the middle of a gradient accumulation (no optimizer step for %d "
                "steps, %s left): the batches since the last optimizer step are in the checkpoint's data position "
                "but not their gradients, so the resume will not be exact",
                self.rank,
                completed,
                self._waited,
                f"{left:.1f} s" if left is not None else "unknown time",
            )
            if self.journal is not None:
                self.journal.event(
                    Event.INEXACT_RESUME,
                    completed,
                    what="gradient accumulation",
                    why=f"stopped {self._waited} boundaries into a gradient accumulation: the checkpoint's data "
                    "position is past batches whose gradients it does not hold",
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
        self.saves.advise_cadence(self.step, steps_per_epoch=self.position.length)
        t = self._monotonic()
        self.saves.stamp(self.step)  # as a save sets it: the same shape
        try:
            staged = (self.async_save and self.schedule.periodic) or self.prestage_every is not None  # an arena
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
            if self._aim is not None:
                self._aim.epochs = total
            if self.position.epoch >= total:
                assert self.journal is not None
                self.journal.event(Event.DONE, start, total=start, already=True)
                return
            if not self._ready(start, None):
                return
            while self.position.epoch < total:
                try:
                    yield self.position.epoch
                except GeneratorExit:
                    self._left(self.step)
                    raise
                if self.preempted:
                    return  # exit_on_notice=False: batches() ended the epoch early
                if self._aim is not None:
                    self._aim.ended(self.position.epoch, self.position.done)
                self.position.next_epoch()
                if self.schedule.epoch_due(self.position.epoch, last=self.position.epoch >= total):
                    self.saves.save(self.step, SaveReason.PERIODIC, blocking=not self.async_save)
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
        stateful = any(loader is obj for obj in self.state.values())
        batches = length(loader) if self._aim is not None else None
        for batch in self.position.iterate(loader, stateful=stateful):
            try:
                yield batch
            except GeneratorExit:
                self._left_batches()
                raise
            self.position.batch_done()
            if self._aim is not None:
                self._hold(self.step + 1, batches)
            if self._boundary(self.step + 1):
                return

    @property
    def batches_done(self) -> int:
        """The batches of the current epoch done so far, those before a resume included: the index of the next batch
        `batches` yields. ``enumerate(run.batches(loader))`` counts from 0 again after a resume mid-epoch; code keyed
        on the index (every-N-batches logging, sampling, evaluation) takes ``enumerate(run.batches(loader),
        run.batches_done)`` to count on from where the interrupted run was."""
        return self.position.done

    def _left_batches(self) -> None:
        """A ``break`` out of `batches` (a ``--dry-run`` after one batch, a step limit). When an optimizer stepped
        since the last boundary, the batch was trained: it is counted (the step and the epoch's position), so the
        checkpoints that follow carry the steps really taken. No save happens here (the loop may be unwinding an
        error); the next boundary or the final save carries it."""
        steps = self._optimizer_steps
        if steps is None or not steps.pending or self.preempted:
            return
        self.position.batch_done()
        self.step += 1
        steps.boundary(self.step)

    def _hold(self, completed: int, batches: int | None) -> None:
        """Under ``preemptible drill``: at the boundary in the middle of an epoch it aims at (`MidEpochAim`), say so
        in the journal (and so in the drill's report file) and wait there for the drill's notice (or kill)."""
        aim, position = self._aim, self.position
        if aim is None or not aim.due(position.epoch, position.done, batches):
            return
        self._aim = None
        assert self.journal is not None
        self.journal.event(
            Event.PROGRESS,
            completed,
            held=True,
            epoch=position.epoch,
            batches_done=position.done,
            epoch_batches=aim.length(position.epoch, batches),
        )
        if not self.guard.wait_for_notice(AIM_HOLD_S):
            log.warning(
                "[rank=%d] held at step %d (the middle of epoch %d) for preemptible drill's notice; none came in %g s: "
                "training on",
                self.rank,
                completed,
                position.epoch,
                AIM_HOLD_S,
            )

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
        self._log_figures(self.step, figures)

    def _log_figures(self, step: int, figures: Mapping[str, Any]) -> None:
        """Journal ``figures`` as logged during ``step`` (0-based: the step `steps` yielded). The framework callbacks
        call it with the step before their boundary's count of completed steps."""
        assert self.journal is not None
        kept = user_fields({k: _figure(v) for k, v in figures.items()})
        self.journal.event(Event.LOG, step, **kept)
        self.saves.figures.update(kept)

    def save(self, reason: str = SaveReason.MANUAL) -> SaveResult:
        """Save a checkpoint of the current step now (blocking)."""
        self._open()
        return self.saves.save(self.step, reason, raise_errors=True)  # type: ignore[return-value]

    # internals ---------------------------------------------------------------------------------------------
    def _resume(self) -> int:
        assert self.journal is not None
        t0 = self._monotonic()
        self.checkpointer.cleanup()
        if self.memory is not None:
            restored = self._resume_from_memory()
            if restored is not None:
                return restored
            self.memory.discard_newer(0)  # restored from elsewhere: memory's steps are of a timeline left behind
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
        if restored is None and self.memory is not None and self.memory.touched is not None:
            raise CheckpointCorruptError(  # even with allow_fresh_start: a fresh start on these objects is none
                f"the memory tier's step {self.memory.touched} was loaded and then failed its checks (see the "
                f"journal's tier_fallback), and {self.root} holds no checkpoint to load over it: the live objects "
                "may hold part of it, so this process does not train on them. Start the job again: a new process "
                "builds its objects afresh, and the rejected step has been removed from the memory tier",
                path=self.memory.dir,
                step=self.memory.touched,
            )
        if restored is None:
            self.journal.event(Event.FRESH, 0)
            log.info("[rank=%d] no checkpoint under %s: starting at step 0", self.rank, self.root)
            return 0
        self._restored(restored)
        if self.rank == 0:
            self.checkpointer.rotate()  # the restored checkpoint has just validated: older ones may go now
        seconds = self._monotonic() - t0
        tier = {"tier": "durable"} if self.memory is not None else {}
        self.journal.event(Event.RESUME, restored, seconds=round(seconds, 6), **tier)
        log.info("[rank=%d] resumed from the checkpoint of step %d (%.2f s)", self.rank, restored, seconds)
        return restored

    def _restored(self, step: int) -> None:
        """What follows a restore from either tier: where the loop resumes, and why it is not exact, if it is not."""
        self.resumed_from = step
        self.position.restored()
        for why in self.state[_RNG].unrestored:
            self._inexact("random streams", why)
        if self.checkpointer.moments_dtype is not None:
            self._inexact("optimizer moments", "bf16_moments=True stores the optimizer's moments rounded to bfloat16")

    def _resume_from_memory(self) -> int | None:
        """The newest step complete in the memory tier, when it is not older than the newest durable one; None
        (journaled: ``tier_fallback``) to restore from the durable root instead."""
        assert self.memory is not None
        assert self.journal is not None
        durable = [c.step for c in self.checkpointer.checkpoints() if c.invalid is None]
        restored, why = self.memory.restore(self.state, durable=durable[-1] if durable else None)
        if restored is None:
            self.journal.event(Event.TIER_FALLBACK, 0, tier="durable", why=why)
            log.info("[rank=%d] memory tier: restoring from the durable root (%s)", self.rank, why)
            return None
        self._restored(restored)
        log.info("[rank=%d] resumed from the memory tier's step %d", self.rank, restored)
        return restored

    def _inexact(self, what: str, why: str) -> None:
        """A resume that cannot be bit-identical with a run never stopped: warned once per kind, and journaled
        (``inexact_resume``: `preemptible report` and `diagnose` show it)."""
        if what in self._inexact_seen:
            return
        self._inexact_seen.add(what)
        log.warning("[rank=%d] this resume is not exact (%s): %s", self.rank, what, why)
        if self.journal is not None:
            self.journal.event(Event.INEXACT_RESUME, self.step, what=what, why=why)

    def _finish(self, total: int) -> None:
        """The last step ran: the final checkpoint, ``DONE.json``, and the journal's ``done``."""
        assert self.journal is not None
        self.saves.reap(block=True)
        self.saves.save(total, SaveReason.FINAL, raise_errors=True)
        if self.memory is not None:  # the final checkpoint is durable: the node's memory is the next job's
            self.memory.clear()
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
            self.saves.save(completed, SaveReason.ADVISORY)
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

    def _stop(self, completed: int) -> None:
        """A notice ends the loop here: the emergency sequence (`Emergency.respond`), then the exit."""
        code = self.emergency.respond(completed, resumed_from=self.resumed_from, waited=self._waited)
        self.preempted = True
        if self.exit_on_notice:
            _ignore_late_notices()  # before close(): it then leaves these alone (it restores only its own handlers)
            self.close()
            if self.emergency.role is NodeRole.RECLAIMED:
                dist.leave_rendezvous()  # this node goes: its agent must not close the rendezvous behind it
            # Interpreter teardown with torch loaded spends 1-1.5 s in the final garbage collection; freezing
            # the heap skips that walk (atexit handlers and finally blocks still run) and cuts it to ~0.3 s.
            gc.freeze()
            raise SystemExit(code)


MEMORY_WAIT_S = 60.0
"""How long closing a run waits for a background memory-tier save (the thread is left behind after that)."""


def _check_names(state: dict[str, Any]) -> None:
    for name in state:
        if name.startswith("_"):
            raise UnsupportedStateError(
                f"state name {name!r} starts with '_', which preemptible reserves for its own entries; rename it",
                key=name,
            )


def _root(root: str | os.PathLike[str]) -> str:
    """The root given in code, unless ``$PREEMPTIBLE_ROOT`` overrides it."""
    override = os.environ.get(ROOT_ENV, "").strip()
    if override:
        log.info("checkpoint root %s from $%s (the code asked for %s)", override, ROOT_ENV, os.fspath(root))
    return override or os.fspath(root)


def _figure(value: Any) -> Any:
    """A value given to `Run.log` as the journal keeps it: a one-element tensor (``loss``, as the step left it) or a
    NumPy scalar as its Python number, so that `report` and the checkpoint's figures see a number, not its text."""
    if isinstance(value, numpy.generic) or (isinstance(value, torch.Tensor) and value.numel() == 1):
        value = value.item()
    return clean(value)  # a NaN or 10**400 as the journal keeps it: keep_best compares only finite numbers


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
