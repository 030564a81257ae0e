"""Pre-staging: keep a copy of the state in the reused staging buffer (`preemptible.checkpoint.arena`), so a
notice only has to flush it. The deadline decisions about when to flush are `preemptible.emergency`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from preemptible import dist
from preemptible.checkpoint.arena import Arena
from preemptible.checkpoint.commit import Job
from preemptible.checkpoint.handle import SaveHandle
from preemptible.checkpoint.listing import Listing
from preemptible.checkpoint.planner import Planner
from preemptible.checkpoint.saver import Saver
from preemptible.events import Event, EventSink, SaveReason
from preemptible.store import layout


class Prestager:
    """Copies the state into the arena ahead of a notice (`prestage`) and writes it when one comes
    (`flush_staged`), through the ``saver``'s background writer."""

    def __init__(
        self,
        *,
        arena: Arena,
        planner: Planner,
        listing: Listing,
        saver: Saver,
        coordinator: Callable[[], dist.Coordinator | None],
        events: EventSink,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
    ) -> None:
        self.arena = arena
        self.planner = planner
        self.listing = listing
        self.saver = saver
        self._coordinator = coordinator
        self.events = events
        self._clock = clock
        self._monotonic = monotonic

    def _round(self, name: str) -> str:
        coord = self._coordinator()
        return coord.round(name) if coord is not None else f"{name}/0"

    def prestage(self, state: Mapping[str, Any], step: int) -> bool:
        """See `Checkpointer.prestage`."""
        staging = self.arena.staging
        if not staging.busy.acquire(blocking=False):
            return False
        try:
            key = self._round("prestage")
            staging.stage(self.planner.plan(state, key=key, reason=SaveReason.PRESTAGED), step=step)
        finally:
            staging.busy.release()
        return True

    def flush_staged(self, *, reason: str = SaveReason.PRESTAGED, deadline: float | None = None) -> SaveHandle | None:
        """See `Checkpointer.flush_staged`."""
        staging = self.arena.staging
        staged = staging.current
        if staged is None or staged.step is None or self.listing.is_committed(staged.step):
            return None
        inflight = self.saver.inflight
        if inflight is not None and inflight.step == staged.step:
            return inflight
        staging.busy.acquire()
        staged = staging.current
        assert staged is not None
        assert staged.step is not None
        budget = deadline - self._clock() if deadline is not None else None
        job = Job(
            step=staged.step,
            path=self.listing.path_of(staged.step),
            reason=str(reason),
            start=self._monotonic(),
            extra={},
            budget=budget,
            deadline=deadline,
            progress=self.saver.progress(staged.nbytes),
            key=self._round("save"),
        )
        self.events.event(
            Event.SAVE_STARTED,
            staged.step,
            reason=str(reason),
            budget_s=budget,
            bytes=staged.nbytes,
            asynchronous=True,
            staged_at=layout.now_iso(staged.staged_at),
        )
        return self.saver.spawn(job, staged)
