"""What the framework integrations share: their options (those of `preemptible.Run` that apply to a framework's
trainer) and the settings every ``PreemptibleCallback`` keeps. Imports no framework."""

from __future__ import annotations

import os
from typing import Any

from preemptible.run import Run

OPTIONS = frozenset(
    {
        *("keep", "sources", "grace", "exit_code", "on_advisory", "requeue", "async_save", "bf16_moments"),
        *("probe", "probe_rtol", "verify_after_save", "compress", "allow_fresh_start", "storage_options", "guard"),
        *("clock", "monotonic", "trackers"),
    }
)
"""`preemptible.Run`'s options that a framework callback passes on."""

NOT_PASSED = {
    "save_every": "the callback's own argument (counted in the framework's optimizer steps)",
    "exit_on_notice": "the callback's own argument",
    "save_interval_s": "the framework owns the loop: its own time-based checkpoints apply",
    "prestage_every": "the framework owns the loop",
    "save_every_epochs": "the framework owns the epochs: use its own per-epoch checkpoints",
    "keep_best": "the framework's metrics are not reported to the run",
    "save_on_best": "the framework's metrics are not reported to the run",
    "per_rank": "the callback names the framework's per-rank state itself",
}
"""`preemptible.Run`'s other options, and why a callback does not take them (a test holds the two to Run's
signature: an option added to Run must be placed in one or the other)."""


class Settings:
    """A callback's settings and the state every integration keeps (see the frameworks' ``PreemptibleCallback``)."""

    def __init__(
        self, root: str | os.PathLike[str], save_every: int | None, exit_on_notice: bool, options: dict[str, Any]
    ) -> None:
        unsupported = sorted(set(options) - OPTIONS)
        if unsupported:
            why = "".join(f"; {k}: {NOT_PASSED[k]}" for k in unsupported if k in NOT_PASSED)
            raise TypeError(
                f"PreemptibleCallback got options {unsupported}; expected those of preemptible.Run that apply to a "
                f"Trainer: {sorted(OPTIONS)}{why}"
            )
        self.root = os.fspath(root)
        self.save_every = save_every
        self.exit_on_notice = exit_on_notice
        self.options = options
        self.preempted = False
        """True once a notice stopped training (only seen with ``exit_on_notice=False``: otherwise the process ends)."""
        self.run: Run | None = None
        """The `preemptible.Run` underneath (journal, guard, checkpointer), once training or the resume began."""
        self._trainer: Any = None
