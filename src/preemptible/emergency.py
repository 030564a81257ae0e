"""The notice-to-exit sequence of a `Run`, and the one owner of the deadline.

`Emergency.respond` is what a notice does at the boundary where the loop stops: journal it, settle a background
save in flight, flush the pre-staged state when the current step cannot land in time, write the emergency
checkpoint, requeue under Slurm, flush the trackers, and decide the exit code (`ExitPolicy`). Every decision
against the time left uses the same `SAFETY_MARGIN` of it and the same bandwidth estimate
(`Checkpointer.bandwidth`, measured by earlier saves, else `ASSUMED_BANDWIDTH`). The clock is injected: the
tests of a 30 s window run in milliseconds.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from preemptible import dist
from preemptible.errors import PreemptibleError
from preemptible.events import Event, ExitReason, SaveReason, tag
from preemptible.sources import slurm

if TYPE_CHECKING:  # annotations only: `budget` and the CLI import this module without torch
    from preemptible.checkpoint import Checkpointer, SaveHandle, SaveResult
    from preemptible.checkpoint.memtier import Tier
    from preemptible.guard import Guard
    from preemptible.journal import Journal
    from preemptible.writer import Progress

log = logging.getLogger("preemptible")

EXIT_PREEMPTED = 0
"""Default exit code after a successful emergency save: a clean, intentional stop."""
EXIT_SAVE_FAILED = 75
"""Exit code when the emergency save failed (EX_TEMPFAIL): nothing new committed, the previous checkpoint is
intact, restart the job."""
EXIT_CODE_ENV = "PREEMPTIBLE_EXIT_CODE"
EXIT_PEER_NODE = 76
"""Exit code of the ranks of a multi-node job whose node did not get the notice, after the committed save: another
node is going away, so this one must start again with the nodes that remain or replace it. Torchrun's elastic
restart (``--max-restarts``) and a scheduler's restart policy act on a nonzero code; the reclaimed node's own
ranks exit with the platform's code and leave the rendezvous (`preemptible.dist.leave_rendezvous`)."""


class NodeRole(str, Enum):
    """What a notice means for this rank's node in a multi-node torchrun job (journaled with the exit)."""

    RECLAIMED = "reclaimed"  # this node got the notice: it goes; its agent leaves the rendezvous
    SURVIVOR = "survivor"  # another node got it: this one restarts (`EXIT_PEER_NODE`)


def node_role(announcement: dict[str, Any] | None, node: int | None, *, own_notice: bool = False) -> NodeRole | None:
    """This node's role once a notice has stopped a multi-node job; None outside one (``node`` None) or when
    the announcement does not say which node saw it. A rank that saw a notice of its own (not only relayed
    through the store) is on a node that goes too, whichever node announced first: a preemption of the whole job
    (Slurm, a Kubernetes job deleted) signals every node."""
    if node is None or announcement is None or announcement.get("node") is None:
        return None
    return NodeRole.RECLAIMED if own_notice or announcement.get("node") == node else NodeRole.SURVIVOR


SAFETY_MARGIN = 0.8
"""Plan to use at most this share of the time left: bandwidth drifts, and steps vary."""
ASSUMED_BANDWIDTH = 100e6
"""Bytes per second assumed for deadline arithmetic before the first save has measured the storage."""
MIN_RATE_BYTES = 16 << 20
"""An in-flight save's own rate counts only once it has written this much (or half its bytes): before that it
measures start-up (opening files, a multipart upload's first round trip, a header of a few KB), not the storage."""


def inflight_bandwidth(measured: float | None, progress: Progress) -> float:
    """The bandwidth to settle an in-flight save with: what completed saves measured; else the save's own rate
    once it has written enough to mean something; else `ASSUMED_BANDWIDTH`."""
    if measured:
        return measured
    rate = progress.rate()
    if rate and progress.done >= min(MIN_RATE_BYTES, max(1, progress.total // 2)):
        return rate
    return ASSUMED_BANDWIDTH


class InflightChoice(str, Enum):
    FINISH = "finish"
    ABANDON = "abandon"

    def __str__(self) -> str:
        return self.value


def wait_fits(need_s: float, remaining_s: float | None) -> bool:
    """Whether a stop may wait ``need_s`` more seconds for the optimizer step that ends a gradient accumulation
    (`Run`): at most half the time left, the rest kept for the emergency save. Without a deadline, yes."""
    return remaining_s is None or need_s <= 0.5 * remaining_s


def deadline_choice(
    *,
    remaining_s: float | None,
    inflight_left_bytes: int,
    emergency_bytes: int,
    bandwidth: float | None,
    margin: float = SAFETY_MARGIN,
) -> InflightChoice:
    """What to do with an asynchronous save in flight when a notice arrives: finish or abandon it.

    Finish it when it and the emergency save of the current step both fit in ``margin`` of the time left (an
    extra committed checkpoint is a fallback if the emergency save is cut short); otherwise abandon it, so the
    whole window goes to the checkpoint that matters. Without a deadline, finish; without a bandwidth estimate,
    abandon (the emergency save is what must land).
    """
    if remaining_s is None:
        return InflightChoice.FINISH
    if bandwidth is None or bandwidth <= 0:
        return InflightChoice.ABANDON
    needed = (inflight_left_bytes + emergency_bytes) / bandwidth
    return InflightChoice.FINISH if needed <= margin * remaining_s else InflightChoice.ABANDON


@dataclass(frozen=True)
class ExitPolicy:
    """How a process ends after a notice: its exit code and, under Slurm, whether the job is requeued.

    Args:
        exit_code: the code after an emergency save; None: ``$PREEMPTIBLE_EXIT_CODE``, else the platform's
            default (143 on Kubernetes, 0 elsewhere). A failed emergency save always exits `EXIT_SAVE_FAILED`.
        requeue: SLURM: ``scontrol requeue`` after a successful emergency save; None: the environment, else the
            job's own state (`slurm.decide`).
    """

    exit_code: int | None = None
    requeue: bool | None = None

    def code_after_notice(self, platform_default: int) -> int:
        """``exit_code``, else ``$PREEMPTIBLE_EXIT_CODE``, else the platform's default."""
        if self.exit_code is not None:
            return self.exit_code
        env = os.environ.get(EXIT_CODE_ENV, "").strip()
        if env:
            try:
                return int(env)
            except ValueError:
                log.warning("ignoring %s=%r: expected an integer exit code", EXIT_CODE_ENV, env)
        return platform_default

    def requeue_wanted(self) -> bool | None:
        """``requeue``, else the environment, else None (decided from the job's own state, `slurm.decide`)."""
        return self.requeue if self.requeue is not None else slurm.requeue_wanted()


class SaveSink(Protocol):
    """What the emergency sequence needs of a run's saves (`preemptible.saves.Saves`)."""

    pending: SaveHandle | None
    state: dict[str, Any]

    def save(
        self, step: int, reason: str, *, raise_errors: bool = ..., deadline: float | None = ..., blocking: bool = ...
    ) -> SaveResult | None: ...

    def reap(self, *, block: bool = ...) -> None: ...

    def report(self, result: SaveResult, reason: str) -> None: ...

    def state_bytes(self) -> int: ...


class Trackers(Protocol):
    def on_notice(self) -> dict[str, Any]: ...


class Emergency:
    """The notice-to-exit sequence and the deadline decisions of one `Run`.

    Args:
        checkpointer, guard: the run's.
        saves: the run's saves (`preemptible.saves.Saves`): the emergency save and the in-flight one go through it.
        trackers: what a notice flushes (`preemptible.trackers.Trackers`).
        policy: the exit code and Slurm requeue (`ExitPolicy`).
        exit_process: whether the run ends the process after the sequence (journaled with the exit).
        prestage_every: the run's pre-staging period, or None (no watcher, no flush).
        clock: epoch seconds.
        rank: this process's rank.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        guard: Guard,
        *,
        saves: SaveSink,
        trackers: Trackers,
        policy: ExitPolicy,
        exit_process: bool,
        prestage_every: int | None,
        clock: Callable[[], float],
        rank: int = 0,
        memory: Tier | None = None,
    ) -> None:
        self.checkpointer = checkpointer
        self.memory: Tier | None = memory  # the memory tier (`preemptible.checkpoint.memtier.Tier`): saved to first
        self.guard = guard
        self.saves = saves
        self.trackers = trackers
        self.policy = policy
        self.exit_process = exit_process
        self.prestage_every = prestage_every
        self.clock = clock
        self.rank = rank
        self.journal: Journal | None = None
        self.watcher: PrestageWatcher | None = None
        self.role: NodeRole | None = None  # in a multi-node job, once a notice has stopped it

    def attach(self, journal: Journal) -> None:
        """The run's journal, once the run has started."""
        self.journal = journal

    @property
    def events(self) -> Journal:
        assert self.journal is not None, "Emergency.attach(journal) comes before any notice is handled"
        return self.journal

    @property
    def bandwidth(self) -> float:
        return self.checkpointer.bandwidth or ASSUMED_BANDWIDTH

    def start(self) -> None:
        if self.prestage_every is not None and self.watcher is None:
            self.watcher = PrestageWatcher(self)
            self.watcher.start()

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None

    # the sequence -----------------------------------------------------------------------------------------------
    def respond(self, completed: int, *, resumed_from: int | None, waited: int = 0) -> int:
        """A notice stops the loop at the boundary after ``completed`` steps: run the whole sequence, journal the
        exit, and return the exit code (the caller ends the process, or the loop).

        Args:
            resumed_from: the step this process restored (a save of it would add nothing).
            waited: boundaries the stop waited for the optimizer step that ends a gradient accumulation.
        """
        notice = self.guard.notice
        assert notice is not None
        self._journal_notice(completed, waited)
        code = self.policy.code_after_notice(self.guard.platform.exit_code)
        # the notices this rank had when it stopped: one that arrives during the save is no evidence that this
        # node goes (a torchrun agent whose rendezvous store went with the reclaimed node SIGTERMs its workers)
        known = list(self.guard.notices)
        saved = self._save_what_can_land(completed, resumed_from)
        own = any(not dist.relayed(n.detail) for n in known if not n.kind.advisory)
        self.role = node_role(getattr(self.guard, "announcement", None), dist.node(), own_notice=own)
        extra: dict[str, Any] = {}
        if self.role is not None:
            # agent_pid: the reclaimed node's torchrun agent, signalled once the run has closed (`Run._stop`)
            leaving = self.role is NodeRole.RECLAIMED and self.exit_process
            extra = {"node": dist.node(), "role": self.role.value, "agent_pid": dist.agent_pid() if leaving else None}
            if self.role is NodeRole.SURVIVOR:
                code = EXIT_PEER_NODE
        if not saved:
            code = EXIT_SAVE_FAILED
        if saved and self.rank == 0 and self.guard.platform.scheduler == "slurm":
            self._requeue(completed)
        tracked = self.trackers.on_notice()
        if tracked["flushed"] or "wandb" in tracked:
            self.events.event(Event.TRACKERS, completed, **tracked)
        self.events.event(
            Event.EXIT,
            completed,
            code=code,
            reason=ExitReason.NOTICE,
            saved=saved,
            later_notices=len(self.guard.notices) - 1,
            remaining_s=self.guard.remaining(),
            exit_process=self.exit_process,
            **extra,
        )
        self.events.sync()
        return code

    def _journal_notice(self, completed: int, waited: int) -> None:
        notice = self.guard.notice
        assert notice is not None
        remaining = self.guard.remaining()
        extra = {"waited_for_optimizer_steps": waited} if waited else {}
        self.events.event(Event.NOTICE, completed, **notice.to_json(), remaining_s=remaining, **extra)
        log.warning(
            "[rank=%d] %s: %s notice (%s) received; stopping at step %d with %s left",
            self.rank,
            tag(Event.NOTICE, source=notice.source),
            notice.source,
            notice.detail or notice.kind.value,
            completed,
            f"{remaining:.1f} s" if remaining is not None else "unknown time",
        )

    def _save_what_can_land(self, completed: int, resumed_from: int | None) -> bool:
        """Settle the save in flight, flush the pre-staged state if the current step cannot land, then save the
        current step unless there is nothing new. False when the emergency save failed."""
        if self.watcher is not None:
            self.watcher.at_boundary()
        handle = self.settle(completed, self.saves.pending)
        if handle is not None:
            self.saves.pending = handle
            self.saves.reap(block=True)
        landed, stop_with_it = self.flush_prestaged(completed)
        if landed is not None:
            self.saves.report(landed, SaveReason.PRESTAGED)
        if stop_with_it:
            return True  # the journal says which step landed and why
        if completed in (0, resumed_from):
            self.events.event(
                Event.SAVE_SKIPPED, completed, reason=SaveReason.EMERGENCY, why="nothing new since the last checkpoint"
            )
            return True
        return self._emergency_save(completed)

    def _emergency_save(self, completed: int) -> bool:
        notice = self.guard.notice
        assert notice is not None
        deadline = notice.deadline.timestamp() if notice.deadline is not None else None
        in_memory = False
        if self.memory is not None:  # first: the fast tier protects the step; the durable root as time allows
            try:
                in_memory = self.memory.save(self.saves.state, completed, reason=SaveReason.EMERGENCY)
            except Exception as e:
                log.error("[rank=%d] emergency save of step %d to the memory tier failed: %s", self.rank, completed, e)
            if in_memory and self._no_time_for_durable(completed):
                self.guard.acknowledge(notice)
                return True
        try:
            self.saves.save(completed, SaveReason.EMERGENCY, raise_errors=True, deadline=deadline)
            self.guard.acknowledge(notice)
        except BaseException as e:
            log.error("[rank=%d] emergency save of step %d failed: %s", self.rank, completed, e)
            if not isinstance(e, Exception):
                raise
            if in_memory:
                log.warning(
                    "[rank=%d] step %d is protected in the memory tier (this node and its replicas) only",
                    self.rank,
                    completed,
                )
            return in_memory
        return True

    def _no_time_for_durable(self, completed: int) -> bool:
        """After the memory tier protected the step: whether the durable save is left out because it would not land
        in the time left (any rank's view decides for all: they save together or not at all). Journaled."""
        assert self.memory is not None
        remaining = self.guard.remaining()
        need = self.saves.state_bytes() / self.bandwidth
        short = remaining is not None and need > SAFETY_MARGIN * remaining
        if not self.memory.agree_any(short):
            return False
        why = f"the memory tier holds it; the durable save needs about {need:.1f} s"
        why += f" and {remaining:.1f} s are left" if remaining is not None else " and another rank has no time for it"
        self.events.event(Event.SAVE_SKIPPED, completed, reason=SaveReason.EMERGENCY, why=why)
        log.warning("[rank=%d] step %d: no durable save: %s", self.rank, completed, why)
        return True

    def _requeue(self, completed: int) -> None:
        wanted = self.policy.requeue_wanted()
        requeue, why = slurm.decide(wanted, slurm.job_info() if wanted is None else None)
        log.info("[rank=%d] SLURM: %s", self.rank, why)
        self.events.event(Event.REQUEUE, completed, ok=slurm.requeue() if requeue else False, why=why)

    # the deadline -----------------------------------------------------------------------------------------------
    def settle(self, completed: int, pending: SaveHandle | None) -> SaveHandle | None:
        """A background save may be writing when the notice comes: finish it or abandon it (cancelled), by the
        deadline arithmetic above. Returns the handle the caller must reap (wait for), or None."""
        handle = pending or self.checkpointer.inflight
        if handle is not None and self.watcher is not None and handle is self.watcher.handle:
            return None  # the pre-staged flush the watcher started: `flush_prestaged` waits for it
        if handle is None or handle.done():
            return handle
        remaining = self.guard.remaining()
        bandwidth = inflight_bandwidth(self.checkpointer.bandwidth, handle.progress)
        choice = deadline_choice(
            remaining_s=remaining,
            inflight_left_bytes=handle.bytes_left,
            emergency_bytes=self.saves.state_bytes(),
            bandwidth=bandwidth,
        )
        self.events.event(
            Event.INFLIGHT,
            completed,
            saving=handle.step,
            choice=choice,
            bytes_left=handle.bytes_left,
            remaining_s=remaining,
            bandwidth_mb_s=round(bandwidth / 1e6, 3),
        )
        if choice is InflightChoice.ABANDON:
            handle.cancel()
        return handle

    def flush_prestaged(self, completed: int) -> tuple[SaveResult | None, bool]:
        """Land the pre-staged state instead of the current step when the current step cannot land in time.

        Returns what landed (or None) and whether to stop with it (True) or to save the current step too.
        """
        if self.prestage_every is None:
            return None, False
        handle = self.watcher.handle if self.watcher is not None else None
        why = "the watcher started it before the step in progress ended"
        if handle is None:
            handle, why = self._start_flush(completed)
            if handle is None:
                return None, False
        try:
            result = handle.wait()
        except (OSError, PreemptibleError) as e:
            log.error("[rank=%d] flushing the pre-staged step %d failed: %s", self.rank, handle.step, e)
            return None, False
        self.events.event(
            Event.PRESTAGED_FLUSH,
            completed,
            landed=result.step,
            instead_of=completed,
            why=why,
            steps_lost=completed - result.step,
        )
        log.warning(
            "[rank=%d] flushed the pre-staged step %d instead of step %d (%s)", self.rank, result.step, completed, why
        )
        remaining = self.guard.remaining()
        # Time left after all: land the current step too; else stop with the pre-staged one.
        return result, remaining is None or self.saves.state_bytes() / self.bandwidth > SAFETY_MARGIN * remaining

    def _start_flush(self, completed: int) -> tuple[SaveHandle | None, str]:
        """Start the flush of the pre-staged state when the current step would not land in time."""
        staged = self.checkpointer.staging.current
        remaining = self.guard.remaining()
        if staged is None or staged.step is None or remaining is None or staged.step >= completed:
            return None, ""
        current_s = self.saves.state_bytes() / self.bandwidth
        if current_s <= SAFETY_MARGIN * remaining:
            return None, ""
        why = f"the current step needs about {current_s:.1f} s, {remaining:.1f} s are left"
        return self.checkpointer.flush_staged(reason=SaveReason.PRESTAGED, deadline=self.clock() + remaining), why


class PrestageWatcher:
    """Flushes the pre-staged state when a notice leaves no time to wait for the step in progress.

    Runs in ``preemptible-prestage-watch`` (daemonic: it only ever starts a save, which runs in its own
    non-daemonic writer thread). After a notice it waits for the main thread to reach the boundary; once
    waiting longer would leave less time than the flush needs, it starts the flush itself.
    """

    def __init__(self, emergency: Emergency) -> None:
        self._em = emergency
        self._stop = threading.Event()
        self._boundary = threading.Event()
        self.handle: SaveHandle | None = None
        self._thread = threading.Thread(target=self._watch, name="preemptible-prestage-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def at_boundary(self) -> None:
        """The main thread reached the boundary: from here it decides. Waits for a decision in flight."""
        self._boundary.set()
        self._thread.join(5)

    def stop(self) -> None:
        self._stop.set()
        self._boundary.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5)

    def _watch(self) -> None:
        em = self._em
        while not self._stop.is_set() and not self._boundary.is_set():
            if em.guard.wait_for_notice(0.1):
                break
        while not self._stop.is_set() and not self._boundary.is_set():
            staged = em.checkpointer.staging.current
            remaining = em.guard.remaining()
            if staged is None or staged.step is None or remaining is None:
                return
            if staged.nbytes / em.bandwidth >= SAFETY_MARGIN * remaining:
                self.handle = em.checkpointer.flush_staged(reason=SaveReason.PRESTAGED, deadline=em.clock() + remaining)
                return
            self._boundary.wait(0.02)
