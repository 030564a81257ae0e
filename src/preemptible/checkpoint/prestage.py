"""Pre-staging: keep a copy of the state in the reused staging buffer, so a notice only has to flush it.

Mixed into `Checkpointer`; the deadline decisions about when to flush are `preemptible.emergency`'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from preemptible.checkpoint.commit import Job
from preemptible.events import Event, SaveReason
from preemptible.store import layout
from preemptible.writer import Progress, SavePlan, Staged, Staging

if TYPE_CHECKING:
    from preemptible import dist
    from preemptible.checkpoint.handle import SaveHandle
    from preemptible.events import EventSink


class Prestaging:
    """Mixed into `Checkpointer` (which provides the attributes declared here)."""

    _staging: Staging | None
    _clock: Callable[[], float]
    _monotonic: Callable[[], float]
    events: EventSink

    @property
    def coordinator(self) -> dist.Coordinator | None:
        raise NotImplementedError

    @property
    def inflight(self) -> SaveHandle | None:
        raise NotImplementedError

    def is_committed(self, step: int) -> bool:
        raise NotImplementedError

    def path_of(self, step: int) -> str:
        raise NotImplementedError

    def _plan(self, state: Mapping[str, Any], *, key: str, reason: str) -> SavePlan:
        raise NotImplementedError

    def _spawn(self, job: Job, staged: Staged, *, go: threading.Event | None = None) -> SaveHandle:
        raise NotImplementedError

    def _progress(self, total: int, deadline: float | None = None) -> Progress:
        raise NotImplementedError

    # staging and pre-staging ----------------------------------------------------------------------------------
    @property
    def staging(self) -> Staging:
        if self._staging is None:
            self._staging = Staging(clock=self._clock, monotonic=self._monotonic)
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
            key = self.coordinator.round("prestage") if self.coordinator is not None else "prestage/0"
            staging.stage(self._plan(state, key=key, reason=SaveReason.PRESTAGED), step=step)
        finally:
            staging.busy.release()
        return True

    def flush_staged(self, *, reason: str = SaveReason.PRESTAGED, deadline: float | None = None) -> SaveHandle | None:
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
        job = Job(
            step=staged.step,
            path=self.path_of(staged.step),
            reason=str(reason),
            start=self._monotonic(),
            extra={},
            budget=budget,
            deadline=deadline,
            progress=self._progress(staged.nbytes),
            key=self.coordinator.round("save") if self.coordinator is not None else "save/0",
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
        return self._spawn(job, staged)
