"""``preemptible drill``: rehearse a preemption of your own training command, end to end, and grade it.

1. (``--reference``) run the command uninterrupted to the end, on a root of its own, for comparison.
2. Start the command (for a cloud source, beside that cloud's metadata emulator, with the endpoint set).
3. Once its `Run` has restored and entered the loop, pick the moment: ``--at`` seconds into the loop, or (``--at
   mid-epoch``, the default under ``--reference``) the middle of an epoch: the run, told so through
   ``$PREEMPTIBLE_DRILL_AIM``, holds at the boundary after half the batches of its second epoch (or of its only one)
   and says so in its report file, so the stop lands there whatever the machine's speed; a loop not built of
   ``run.epochs``/``run.batches`` falls back to 3 s. A stop at an epoch's end would never try the replay of an
   epoch's order and random streams, where a script's draw outside ``run.batches`` shows.
4. Deliver the notice: a signal to the command's process, or the cloud's notice through the emulator. Measure
   notice -> step boundary -> commit -> exit against the window; check a checkpoint committed. With ``--kill``
   instead, a crash rehearsal: SIGKILL the process group (no notice, no emergency save, no window), and expect the
   restart to resume from the newest committed checkpoint (a periodic one; none: it starts over), counting the
   steps lost (completed when killed, less the step resumed at).
5. Restart the command and confirm from its journal that it resumed from that step.
6. Stop it with a second notice (or, with ``--reference``, let it finish and compare with the reference run: the
   figures logged at each step with ``run.log``, the first start's before the resume and the restart's after it,
   naming the first step, figure and both values that differ (exact equality, as journaled); and the final
   checkpoints' tensor checksums and JSON state: a bit-exact resume). Without logged figures only the final states
   are compared, and the report says that naming a step needs ``run.log(...)``.

The drill follows the command's `Run` through ``$PREEMPTIBLE_REPORT_FILE`` (which `Run` honours); ``--root`` only
adds a check of the checkpoint on storage. ``$PREEMPTIBLE_ROOT`` gives the reference run its own root.

With ``nodes`` (``--nodes N``, 2-4, ``--source aws``, as root) the drill rehearses scenario 1 of a multi-node job
instead: N simulated nodes in network namespaces of its own (`preemptible.testing.nodes`, the tests' harness), an
emulator and a torchrun agent per node running the command, the notice to the last node only once the first
checkpoint commits, its replacement, the resume from the emergency step, then a second notice (`_nodes` says how).

The parts, each a private module: `_drill` (the drill's steps), `_child` (one start of the command, followed
through its report file), `_report` (the checks and timings), `_compare` (the figures step by step, the final
states, and why they differ) and `_nodes` (the multi-node drill).
"""

from preemptible.drill._child import SLACK_S
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
