"""What the framework integrations share: their options (those of `preemptible.Run` that apply to a framework's
trainer) and the settings every ``PreemptibleCallback`` keeps. Imports no framework."""

from __future__ import annotations

import os
from typing import Any

from preemptible.run import Run

OPTIONS = frozenset(
    {
        *("keep", "sources", "grace", "exit_code", "on_advisory", "requeue", "async_save", "bf16_moments"),
        *("probe", "probe_rtol", "verify_after_save", "allow_fresh_start", "storage_options", "guard"),
        *("clock", "monotonic", "trackers"),
    }
)
"""`preemptible.Run`'s options that a framework callback passes on (the rest are the callback's own or do not apply:
the framework owns the loop, so there is no ``prestage_every``, ``save_interval_s`` or ``per_rank``)."""


class Settings:
    """A callback's settings and the state every integration keeps (see the frameworks' ``PreemptibleCallback``)."""

    def __init__(
        self, root: str | os.PathLike[str], save_every: int | None, exit_on_notice: bool, options: dict[str, Any]
    ) -> None:
        unsupported = sorted(set(options) - OPTIONS)
        if unsupported:
            raise TypeError(
                f"PreemptibleCallback got options {unsupported}; expected those of preemptible.Run that apply to a "
                f"Trainer: {sorted(OPTIONS)}"
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
