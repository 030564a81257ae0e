"""``preemptible drill``: rehearse a preemption of your own training command, end to end, and grade it.

1. (``--reference``) run the command uninterrupted to the end, on a root of its own, for comparison.
2. Start the command (for a cloud source, beside that cloud's metadata emulator, with the endpoint set).
3. Once its `Run` has restored and entered the loop, wait ``--at`` seconds and deliver the notice: a signal to
   the command's process, or the cloud's notice through the emulator.
4. Measure notice -> step boundary -> commit -> exit against the window; check a checkpoint committed.
5. Restart the command and confirm from its journal that it resumed from that step.
6. Stop it with a second notice (or, with ``--reference``, let it finish and compare the final checkpoints'
   tensor checksums with the reference run's: a bit-exact resume).

The drill follows the command's `Run` through ``$PREEMPTIBLE_REPORT_FILE`` (which `Run` honours); ``--root`` only
adds a check of the checkpoint on storage. ``$PREEMPTIBLE_ROOT`` gives the reference run its own root.

The parts, each a private module: `_drill` (the drill's steps), `_child` (one start of the command, followed
through its report file), `_report` (the checks and timings) and `_compare` (final states, and why they differ).
"""

from preemptible.drill._compare import (
    LIKELY_CAUSES,
    Divergence,
    explain_difference,
    files_written_aside,
    first_divergence,
    logged_figures,
    spliced,
    torch_equal,
)
from preemptible.drill._drill import (
    DEFAULT_AT_S,
    ENDPOINT_ENV,
    MID_EPOCH,
    ROOT_ENV,
    SIGNALS,
    SLACK_S,
    SOURCES,
    Drill,
    default_window,
)
from preemptible.drill._report import Check, DrillReport

__all__ = [
    "DEFAULT_AT_S",
    "ENDPOINT_ENV",
    "LIKELY_CAUSES",
    "MID_EPOCH",
    "ROOT_ENV",
    "SIGNALS",
    "SLACK_S",
    "SOURCES",
    "Check",
    "Divergence",
    "Drill",
    "DrillReport",
    "default_window",
    "explain_difference",
    "files_written_aside",
    "first_divergence",
    "logged_figures",
    "spliced",
    "torch_equal",
]
