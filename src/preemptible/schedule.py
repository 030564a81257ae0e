"""What a step boundary does when no notice stops the loop: a pure decision, tested with a fake clock.

`SaveSchedule.due` is asked once per boundary, after the stop and advisory checks (`Run.boundary`), and answers
with one `Due`. It holds no objects of the run: the time comes in as an argument, and whether the loop is in the
middle of a gradient accumulation (`preemptible.accumulation`) as a function asked only when it matters (it walks
the parameters).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum


class Due(str, Enum):
    """What a boundary does, at most one of these."""

    NOTHING = "nothing"
    SAVE = "save"  # a periodic save (every ``save_every`` steps or ``save_interval_s`` seconds)
    PRESTAGE = "prestage"  # refresh the staging buffer (``prestage_every``)
    BEST = "best"  # a save after a new best of the ``keep_best`` figure (``save_on_best``)
    PREPARE = "prepare"  # make the plan of a save ahead of any notice (once, after the first step)


@dataclass
class SaveSchedule:
    """The save schedule of one run (see `Run` for each option).

    A save or pre-stage that falls due in the middle of a gradient accumulation is owed, not skipped: it happens at
    the boundary where the accumulation ends (a checkpoint there holds the gradients' batches), or once the save has
    waited ``limit`` boundaries.
    """

    save_every: int | None = None
    save_interval_s: float | None = None
    save_every_epochs: int | None = None
    prestage_every: int | None = None
    save_on_best: bool = False
    total: int | None = None
    """The step count the loop ends at, when known: the final save covers a save due there."""
    last_save_at: float = 0.0
    """Monotonic time of the last save (`saved`)."""
    owed: int | None = None
    """The step a periodic save fell due at, mid-accumulation."""
    prestage_owed: bool = False
    prepared: bool = False
    agreed: Callable[[int, bool], bool] | None = None
    """Under several ranks: ``agreed(completed, elapsed)`` says whether the timed save is due at this boundary, the
    same on every rank, from rank 0's clock (`preemptible.dist.IntervalAgreement`). None: this process's clock."""
    _never: Callable[[], bool] = field(default=lambda: False, repr=False)

    @property
    def periodic(self) -> bool:
        return self.save_every is not None or self.save_interval_s is not None or self.save_every_epochs is not None

    def before_end(self, completed: int) -> bool:
        return self.total is None or completed < self.total

    def periodic_due(self, completed: int, now: float) -> bool:
        if not self.before_end(completed):
            return False  # the final save covers it
        timed = False
        if self.save_interval_s is not None:  # asked at every boundary: under several ranks it is a protocol
            elapsed = now - self.last_save_at >= self.save_interval_s
            timed = self.agreed(completed, elapsed) if self.agreed is not None else elapsed
        return timed or (self.save_every is not None and completed % self.save_every == 0)

    def epoch_due(self, epochs_done: int, *, last: bool) -> bool:
        """After an epoch's end work (``epochs_done`` epochs complete): is the every-N-epochs save due? Not after
        the last epoch: the final save covers it."""
        return not last and self.save_every_epochs is not None and epochs_done % self.save_every_epochs == 0

    def saved(self, now: float) -> None:
        """A save was made (of any reason): the interval counts from here."""
        self.last_save_at = now

    def due(
        self,
        completed: int,
        now: float,
        *,
        accumulating: Callable[[], bool] | None = None,
        limit: int = 0,
        new_best: Callable[[], bool] | None = None,
    ) -> Due:
        """What the boundary after ``completed`` steps does, at monotonic time ``now``.

        Args:
            accumulating: whether gradients of batches since the last optimizer step are held (asked only when a
                save or pre-stage falls due). None: never.
            limit: boundaries a save owed to an accumulation waits at most.
            new_best: whether the figure logged since the last save is a new best (asked only with
                ``save_on_best``).
        """
        accumulating = accumulating or self._never
        if self.periodic_due(completed, now) or (self.owed is not None and self.before_end(completed)):
            return self._periodic(completed, accumulating, limit)
        if self.prestage_every is not None and (completed % self.prestage_every == 0 or self.prestage_owed):
            # staged mid-accumulation, a flush would land a state without the accumulated gradients: at its end
            self.prestage_owed = accumulating()
            return Due.NOTHING if self.prestage_owed else Due.PRESTAGE
        if self.save_on_best and new_best is not None and new_best():
            return Due.BEST
        if not self.prepared:
            self.prepared = True
            return Due.PREPARE
        return Due.NOTHING

    def _periodic(self, completed: int, accumulating: Callable[[], bool], limit: int) -> Due:
        if self.owed is None:
            self.owed = completed
        if completed - self.owed < limit and accumulating():
            return Due.NOTHING  # owed: saved at the optimizer step that ends this accumulation
        self.owed = None
        return Due.SAVE


@dataclass
class StepTimer:
    """Seconds per step, a moving average of the time between boundaries (monotonic clock)."""

    last_at: float = 0.0
    step_time: float | None = None

    def start(self, now: float) -> None:
        self.last_at = now

    def boundary(self, now: float) -> None:
        spent = now - self.last_at
        self.last_at = now
        self.step_time = spent if self.step_time is None else 0.9 * self.step_time + 0.1 * spent
