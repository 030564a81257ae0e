"""The one owner of the deadline: what a notice does to saves in flight, the pre-staged flush and its watcher.

Every decision against the time left uses the same `SAFETY_MARGIN` of it and the same bandwidth estimate
(`Checkpointer.bandwidth`, measured by earlier saves, else `ASSUMED_BANDWIDTH`). The clock is injected: the
tests of a 30 s window run in milliseconds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from preemptible.errors import PreemptibleError
from preemptible.events import Event, SaveReason

if TYPE_CHECKING:
    from preemptible.checkpoint import Checkpointer, SaveHandle, SaveResult
    from preemptible.guard import Guard
    from preemptible.writer import Progress

log = logging.getLogger("preemptible")

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


class Emergency:
    """The deadline decisions of one `Run`.

    Args:
        checkpointer, guard: the run's.
        events: the run's journal (an events sink), read when needed (it exists once the run has started).
        state_bytes: bytes of the state an emergency save would write now.
        prestage_every: the run's pre-staging period, or None (no watcher, no flush).
        clock: epoch seconds.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        guard: Guard,
        *,
        events: Callable[[], Any],
        state_bytes: Callable[[], int],
        prestage_every: int | None,
        clock: Callable[[], float],
        rank: int = 0,
    ) -> None:
        self.checkpointer = checkpointer
        self.guard = guard
        self._events = events
        self._state_bytes = state_bytes
        self.prestage_every = prestage_every
        self._clock = clock
        self.rank = rank
        self.watcher: PrestageWatcher | None = None

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

    def at_boundary(self) -> None:
        if self.watcher is not None:
            self.watcher.at_boundary()

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
            emergency_bytes=self._state_bytes(),
            bandwidth=bandwidth,
        )
        self._events().event(
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
        staged = self.checkpointer.staging.current
        why = "the watcher started it before the step in progress ended"
        if handle is None:
            remaining = self.guard.remaining()
            if staged is None or staged.step is None or remaining is None or staged.step >= completed:
                return None, False
            current_s = self._state_bytes() / self.bandwidth
            if current_s <= SAFETY_MARGIN * remaining:
                return None, False
            why = f"the current step needs about {current_s:.1f} s, {remaining:.1f} s are left"
            handle = self.checkpointer.flush_staged(reason=SaveReason.PRESTAGED, deadline=self._clock() + remaining)
            if handle is None:
                return None, False
        try:
            result = handle.wait()
        except (OSError, PreemptibleError) as e:
            log.error("[rank=%d] flushing the pre-staged step %d failed: %s", self.rank, handle.step, e)
            return None, False
        self._events().event(
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
        return result, remaining is None or self._state_bytes() / self.bandwidth > SAFETY_MARGIN * remaining


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
                self.handle = em.checkpointer.flush_staged(
                    reason=SaveReason.PRESTAGED, deadline=em._clock() + remaining
                )
                return
            self._boundary.wait(0.02)
