"""The staging arena: the reused buffers background saves copy the state into, laid out at first use, and the
choice of when a blocking save goes through them."""

from __future__ import annotations

from collections.abc import Callable

from preemptible.store import format as tensor_format
from preemptible.store.threads import PlanChanged
from preemptible.writer import ArenaFill, SavePlan, Staged, Staging


class Arena:
    """The reused staging buffers of background saves, laid out at first use."""

    def __init__(self, *, clock: Callable[[], float], monotonic: Callable[[], float]) -> None:
        self._clock = clock
        self._monotonic = monotonic
        self.laid_out: Staging | None = None
        """The buffers, or None before anything asked for them."""
        self._small_layout: tuple[object, bool] | None = None  # `mostly_small`, for the last steady layout

    @property
    def staging(self) -> Staging:
        if self.laid_out is None:
            self.laid_out = Staging(clock=self._clock, monotonic=self._monotonic)
        return self.laid_out

    def stage_blocking(
        self, plan: SavePlan, step: int, *, lazily: bool
    ) -> tuple[Staged, dict[str, ArenaFill] | None] | None:
        """For a blocking save, when the staging arena is laid out for its tensors already (background saves of
        this state came before) and is free: copy them into it and write its page-aligned regions, where that
        beats writing each tensor from its own memory:

        - GPU tensors: device-to-host at the bus's speed, on side streams, instead of one pageable ``.cpu()`` copy
          per tensor (about 40x slower on an H200); all of them before the writes;
        - CPU tensors, most of whose bytes are in small ones (`mostly_small`): the writers would copy those
          anyway, gathering them one memmove at a time under the GIL (threads that write take turns at it); the
          arena copy is one ``_foreach_copy_`` per piece, which lets it go. With ``lazily`` (an uncompressed
          save), each writer copies a piece just before writing it (`Staging.stage_lazily`, returned ``fills``).

        The plan's deferred check (`SavePlan.check`) is left to the writes of the staged bytes, as on the unstaged
        path: made during a copy before them, it took a core from it (10,000 tensors: 7 ms of checking, the copy
        16 ms alone and 23 ms beside it). A copy that fails (a tensor that changed shape) is checked at once:
        `PlanChanged`. Never allocates an arena here: an emergency is no time to take the state's size in host
        memory (pinned, for GPU tensors). Returns the staged state and its fills (``staging.busy`` held), or
        None."""
        staging = self.laid_out
        if staging is None or not staging.fits(plan.specs, plan.layout_token):
            return None
        on_cpu = plan.all_cpu()
        if on_cpu and not self.mostly_small(plan):
            return None
        if not staging.busy.acquire(blocking=False):  # a background save is writing from it
            return None
        try:
            if on_cpu and lazily:
                return staging.stage_lazily(plan, step=step)
            try:
                return staging.stage(plan, step=step), None
            except RuntimeError:
                if plan.check is not None and not plan.check():
                    raise PlanChanged from None
                raise
        except BaseException:
            staging.busy.release()
            raise

    def mostly_small(self, plan: SavePlan) -> bool:
        """Whether at least half the plan's bytes are in tensors under `tensor_format.SMALL_TENSOR_BYTES` (asked
        once per steady-state layout: 10,000s of tensors)."""
        token = plan.layout_token
        known = self._small_layout
        if token is not None and known is not None and known[0] is token:
            return known[1]
        sizes = [t.nbytes for spec in plan.specs for _, t in spec.items]
        small = sum(n for n in sizes if n < tensor_format.SMALL_TENSOR_BYTES)
        verdict = 2 * small >= sum(sizes) > 0
        self._small_layout = (token, verdict) if token is not None else None
        return verdict
