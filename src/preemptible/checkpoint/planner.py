"""Which files a save of a state writes on this rank: the steady state's plan refilled, or one made afresh."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch

from preemptible import dist
from preemptible.checkpoint.partition import check_replicated, plan_share
from preemptible.checkpoint.partition import split as split_state
from preemptible.checkpoint.steady import SteadyPlans
from preemptible.events import EventSink, SaveReason
from preemptible.state import capture, flatten
from preemptible.writer import SavePlan


class Planner:
    """Plans this rank's share of a save. ``coordinator``: finds the job's coordinator (None for one process)."""

    def __init__(
        self,
        *,
        per_rank: Collection[str],
        threads: int,
        max_file_bytes: int,
        moments_dtype: torch.dtype | None,
        coordinator: Callable[[], dist.Coordinator | None],
        events: EventSink,
    ) -> None:
        self.per_rank = frozenset(per_rank)
        self.threads = threads
        self.max_file_bytes = max_file_bytes
        self.moments_dtype = moments_dtype
        self._coordinator = coordinator
        self.events = events
        self.steady = SteadyPlans()

    def plan(
        self,
        state: Mapping[str, Any],
        *,
        key: str,
        reason: str,
        early: Callable[[object, list[torch.Tensor]], object] | None = None,
        defer: bool = False,
    ) -> SavePlan:
        """This rank's share of the save, after checking that replicated state is the same on every rank.
        ``early``, ``defer``: see `SteadyPlans.plan`."""
        coord = self._coordinator()
        world = coord.world if coord is not None else 1
        captured = capture(state)

        def general(tree: Mapping[str, Any]) -> SavePlan:
            return self._general(state, tree, coord, key=key, reason=reason)

        # The steady state of one process: the plan of the last save, refilled. Not made for an emergency save:
        # the process stops after it, and making the template costs as much again as the plan it refills
        # (10,000 tensors: 50 of 200 ms).
        if world == 1 and (reason != SaveReason.EMERGENCY or self.steady.remembers):
            config = (self.threads, self.max_file_bytes, self.moments_dtype, [(k, type(v)) for k, v in state.items()])
            plan = self.steady.plan(state, captured, config, general, early, defer=defer)
            if plan is not None:
                return plan
        self.steady.last = "general"
        return general(captured)

    def _general(
        self,
        state: Mapping[str, Any],
        tree: Mapping[str, Any],
        coord: dist.Coordinator | None,
        *,
        key: str,
        reason: str,
    ) -> SavePlan:
        """The plan made afresh from the captured ``tree``: split into per-rank and striped entries (the striped
        ones checked to be replicated, under several ranks), then this rank's share of the files."""
        world, me = (coord.world, coord.rank) if coord is not None else (1, 0)
        flat = flatten(tree)
        split = split_state(flat, state, self.per_rank, world=world, rank=me)
        if coord is not None:
            split = check_replicated(coord, flat, set(state), split, key=key, reason=reason, events=self.events)
        return plan_share(
            state,
            flat,
            split,
            threads=self.threads,
            max_file_bytes=self.max_file_bytes,
            moments_dtype=self.moments_dtype,
        )
