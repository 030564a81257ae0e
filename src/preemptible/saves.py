"""The saves one `Run` makes: each save's figures, the background save in flight, what each save reports.

`Saves` is the only part of a run that calls `Checkpointer.save`; `Run.boundary` decides when (`schedule`), the
emergency sequence decides what a notice saves (`emergency`), and both go through here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch

from preemptible._version import __version__
from preemptible.checkpoint import Checkpointer, SaveHandle, SaveResult
from preemptible.errors import PreemptibleError, SaveCancelled, StateDivergenceError, UnsupportedStateError
from preemptible.events import Event, SaveReason
from preemptible.journal import Journal
from preemptible.schedule import SaveSchedule, StepTimer
from preemptible.sources.detect import Platform
from preemptible.state import capture, flatten
from preemptible.store import retention

log = logging.getLogger("preemptible")


class Best:
    """The best value so far of the ``keep_best`` figure, for ``save_on_best``: read once per process from the
    checkpoints on storage, then kept up to date by each save."""

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer
        self.value: float | None = None
        self.known = False

    def beaten_by(self, figures: dict[str, Any]) -> bool:
        """Whether the keep_best figure among ``figures`` beats every checkpoint's so far."""
        best = self.checkpointer.keep_best
        value = recordable(figures).get(best[0]) if best else None
        if best is None or value is None:
            return False
        if not self.known:  # once per process: what the checkpoints already on storage record
            self.known = True
            infos = self.checkpointer.checkpoints()
            step = retention.best_step(infos, best)
            self.value = next((retention.figure_of(c, best[0]) for c in infos if c.step == step), None)
        return self._better(value, best[1])

    def saved(self, figures: dict[str, Any]) -> None:
        best = self.checkpointer.keep_best
        value = figures.get(best[0]) if best else None
        if best is None or value is None or not self.known:
            return
        if self._better(value, best[1]):
            self.value = value

    def _better(self, value: float, mode: str) -> bool:
        return self.value is None or (value < self.value if mode == "min" else value > self.value)


class Saves:
    """A run's saves through its `Checkpointer`.

    Args:
        checkpointer: the run's.
        state: the run's state (every entry, its own included).
        meta: the run's own entry of the state (``_run``): each save stamps the step and the version in it.
        schedule: told the time of each save.
        timer: the step time, for the advice after the first save.
        platform: where the run is, for the advice after the first save.
        monotonic: the run's monotonic clock.
        rank: this process's rank.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        state: dict[str, Any],
        meta: dict[str, Any],
        *,
        schedule: SaveSchedule,
        timer: StepTimer,
        platform: Platform,
        monotonic: Callable[[], float],
        rank: int,
    ) -> None:
        self.checkpointer = checkpointer
        self.state = state
        self.meta = meta
        self.schedule = schedule
        self.timer = timer
        self.platform = platform
        self.monotonic = monotonic
        self.rank = rank
        self.journal: Journal | None = None
        """The run's journal, once the run has started (`attach`)."""
        self.figures: dict[str, Any] = {}
        """Figures logged since the last save: the next checkpoint records them (``figures`` in COMMIT.json)."""
        self.best = Best(checkpointer)
        self.last: SaveResult | None = None
        self.pending: SaveHandle | None = None
        """A background save in flight, until reaped."""
        self.advised = False  # the advice after the first save is given once

    def attach(self, journal: Journal) -> None:
        self.journal = journal

    def stamp(self, step: int) -> None:
        """The run's own entry of the checkpoint: the step and the version that saved it."""
        self.meta.clear()
        self.meta.update({"step": step, "saved_by": __version__})

    def new_best(self) -> bool:
        return self.best.beaten_by(self.figures)

    def save(
        self,
        step: int,
        reason: str,
        *,
        raise_errors: bool = False,
        deadline: float | None = None,
        blocking: bool = True,
    ) -> SaveResult | None:
        """Save ``step``. A failure is logged and training goes on, unless ``raise_errors`` (or the state itself
        cannot be saved). Returns the result, or None when it failed or goes on in the background."""
        if self.pending is not None:  # the checkpointer waits for it anyway: its result is reported, not dropped
            self.reap(block=True)
        self.stamp(step)
        figures = recordable(self.figures)
        try:
            handle = self.checkpointer.save(
                self.state,
                step,
                reason=reason,
                deadline=deadline,
                blocking=blocking,
                extra={"figures": figures} if figures else None,
            )
            self.schedule.saved(self.monotonic())
            self.figures.clear()  # they belong to this checkpoint
            self.best.saved(figures)
            if not handle.done():
                self.pending = handle
                return None
            result = handle.wait()
        except (UnsupportedStateError, StateDivergenceError):
            raise  # the state itself cannot be saved: retrying at the next save would fail the same way
        except (OSError, PreemptibleError) as e:
            if raise_errors:
                raise
            log.warning("[rank=%d] %s save of step %d failed, training continues: %s", self.rank, reason, step, e)
            return None
        self.report(result, reason)
        return result

    def reap(self, *, block: bool = False) -> None:
        """Collect a finished background save: log it, or warn if it failed (training goes on)."""
        handle = self.pending
        if handle is None or (not block and not handle.done()):
            return
        self.pending = None
        try:
            result = handle.wait()
        except SaveCancelled:
            return
        except (OSError, PreemptibleError) as e:
            log.warning(
                "[rank=%d] background save of step %d failed, training continues: %s", self.rank, handle.step, e
            )
            return
        self.report(result, SaveReason.BACKGROUND)

    def report(self, result: SaveResult, reason: str) -> None:
        self.last = result
        if not result.skipped and not self.advised and reason != SaveReason.EMERGENCY:  # advice for what comes
            self._advise(result)
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

    def state_bytes(self) -> int:
        """Bytes of the state a save would write now."""
        if self.last is not None and self.last.bytes:
            return self.last.bytes
        return flatten(capture(self.state)).tensor_bytes

    def advise_cadence(self, step: int, *, steps_per_epoch: int | None) -> None:
        """Once, after the first step (rank 0): when the run has no periodic saves, or a cadence more than 2x off the
        Young/Daly interval for this state (`budget.cadence_advice`), log the advice and journal it. A crash without
        a notice (SIGKILL, OOM, a lost node) loses the steps since the last save: the cadence bounds that."""
        if self.rank != 0 or self.journal is None:
            return
        from preemptible import budget

        s = self.schedule
        step_time = self.timer.step_time
        cadences = [s.save_interval_s] if s.save_interval_s is not None else []
        if step_time:
            if s.save_every is not None:
                cadences.append(s.save_every * step_time)
            if s.save_every_epochs is not None and steps_per_epoch:
                cadences.append(s.save_every_epochs * steps_per_epoch * step_time)
        if s.periodic and not cadences:
            return  # a cadence in steps or epochs whose seconds are not known yet: nothing to compare
        nbytes = self.last.bytes if self.last is not None and self.last.bytes else tensor_bytes(self.state)
        advice = budget.cadence_advice(
            state_bytes=nbytes,
            bandwidth=self.checkpointer.bandwidth,
            fixed_s=self.checkpointer.fixed_s,
            cadence_s=min(cadences) if cadences else None,
        )
        if not advice.off:
            return
        log.log(
            logging.WARNING if advice.cadence_s is None else logging.INFO, "[rank=%d] save cadence: %s", self.rank,
            advice.line(),
        )  # fmt: skip
        self.journal.event(Event.SAVE_ADVICE, step, state_bytes=nbytes, **advice.to_json())

    def _advise(self, result: SaveResult) -> None:
        """After the first save: will the emergency save fit this platform's window? (`budget.advise`)"""
        assert self.journal is not None
        self.advised = True
        bandwidth = self.checkpointer.bandwidth
        if bandwidth:
            from preemptible import budget

            budget.advise(
                result.step,
                state_bytes=result.bytes,
                bandwidth=bandwidth,
                platform=self.platform,
                step_time=self.timer.step_time or 0.0,
                journal=self.journal,
                rank=self.rank,
            )


def tensor_bytes(state: dict[str, Any]) -> int:
    """The bytes of the modules' parameters and buffers and the optimizers' state tensors, read without calling any
    ``state_dict()``: some have side effects (the HF Trainer's parts gather FLOPs across ranks, a collective that one
    rank alone must never start). An estimate for advice, not what a save writes."""
    total = 0
    for obj in state.values():
        if isinstance(obj, torch.nn.Module):
            total += sum(t.nbytes for t in (*obj.parameters(), *obj.buffers()))
        elif isinstance(obj, torch.optim.Optimizer):
            total += sum(v.nbytes for s in obj.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return total


def recordable(figures: dict[str, Any]) -> dict[str, Any]:
    """The logged figures a checkpoint can record: finite numbers, by name."""
    out: dict[str, Any] = {}
    for k, v in figures.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = v
    return out
