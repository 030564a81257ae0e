"""Gradient accumulation: where a notice may stop a loop.

A loop that accumulates gradients over several batches before each optimizer step (``accelerator.accumulate``,
``if (i + 1) % k == 0: optimizer.step()``) has boundaries where the gradients of the batches since the last
optimizer step live only in the parameters' ``.grad``. A checkpoint taken there holds the data position after those
batches but not their gradients: the resumed run steps the optimizer without them, silently not the run that was
stopped. So a stop waits for the optimizer step that ends the accumulation, as the frameworks' own loops stop only
after an optimizer step.

`OptimizerSteps` sees each optimizer step through a post-hook on every real optimizer of the state (under the
wrappers that hold one as ``.optimizer``, as Accelerate's does), so it needs nothing from the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

MAX_DEFER = 64
"""Boundaries a stop waits at most for an optimizer step before two have been seen (then: `OptimizerSteps.limit`)."""


def real_optimizers(state: Mapping[str, Any]) -> list[torch.optim.Optimizer]:
    """The torch optimizers among a state's entries, each unwrapped down to the one that steps (a wrapper that
    holds one as ``.optimizer`` steps it only when it really steps: Accelerate's skips it while accumulating)."""
    found: list[torch.optim.Optimizer] = []
    for obj in state.values():
        if not isinstance(obj, torch.optim.Optimizer):
            continue
        inner: Any = obj
        while isinstance(getattr(inner, "optimizer", None), torch.optim.Optimizer) and inner.optimizer is not inner:
            inner = inner.optimizer
        if all(inner is not o for o in found):
            found.append(inner)
    return found


class OptimizerSteps:
    """Counts the optimizer steps of a state's optimizers and tells, at a boundary, whether the loop is in the
    middle of accumulating gradients: no optimizer step since the last boundary, and a parameter holds a gradient.

    ``period``: the largest number of boundaries seen between two optimizer steps (the accumulation's length), once
    two steps have been seen.
    """

    def __init__(self, state: Mapping[str, Any]) -> None:
        self.optimizers = [o for o in real_optimizers(state) if hasattr(o, "register_step_post_hook")]
        self.count = 0
        self.period: int | None = None
        self._seen = 0
        self._last_stepped: int | None = None
        self._handles = [o.register_step_post_hook(self._stepped) for o in self.optimizers]

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.count += 1

    def boundary(self, completed: int) -> bool:
        """Record a boundary after ``completed`` steps; True when an optimizer stepped since the last one."""
        stepped = self.count != self._seen
        self._seen = self.count
        if stepped:
            if self._last_stepped is not None and completed > self._last_stepped:
                self.period = max(self.period or 1, completed - self._last_stepped)
            self._last_stepped = completed
        return stepped

    @property
    def pending(self) -> bool:
        """Whether an optimizer stepped since the last boundary."""
        return self.count != self._seen

    def accumulating(self, stepped: bool) -> bool:
        """Whether gradients of batches since the last optimizer step are held in ``.grad`` (``stepped``: what
        `boundary` returned for this boundary). Walks the parameters: asked only when a notice stops the loop."""
        if stepped or not self.optimizers:
            return False
        return any(p.grad is not None for o in self.optimizers for g in o.param_groups for p in g["params"])

    @property
    def limit(self) -> int:
        """Boundaries a stop waits at most for the optimizer step that ends an accumulation: twice the longest gap
        seen (an epoch's last batches, fewer than an accumulation, join the next epoch's first: with 20 batches an
        epoch and 3 per step, a gap of 5), else `MAX_DEFER`."""
        return 2 * self.period if self.period is not None else MAX_DEFER

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
