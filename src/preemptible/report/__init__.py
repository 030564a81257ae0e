"""``preemptible report ROOT``: what preemptions cost a run, from the journals of all its attempts.

Wall time runs from the first attempt's start to the last event of the last one, the gaps between attempts
included. It is split into:

- **goodput**: training time of the steps that were kept (the steps each attempt ran up to the checkpoint the next
  attempt resumed from, or to the end);
- **saves**: time training stood still for a save (a blocking save's seconds, an asynchronous save's stall);
- **restore and start-up**: from an attempt's start to its first step (finding, verifying and loading the
  checkpoint);
- **redone**: training time of steps an attempt ran past the checkpoint the next one resumed from (lost, done
  again). What an attempt ran is what its journal shows: a `Run` journals a ``progress`` event at a step boundary
  after `run.PROGRESS_QUIET_S` seconds without any other event, so a process killed without a word (SIGKILL, the
  machine gone) is known to have run its steps to within those seconds;
- **waiting for the stop step**: from a notice to its emergency save's start (finishing the step, agreeing the
  stop step across ranks);
- **between attempts**: from an attempt's last event to the next one's start (the machine's end, scheduling, a
  new machine, Python and torch starting).

Per-step times are an attempt's mean. The times and steps are rank 0's (every rank stops at the same step); every
rank's journal says which ranks and nodes ran in each attempt and how each ended (`_ranks`): an attempt is one
launch of the whole job, never one per node or rank.

The parts, each a private module: `_attempts` (the journal's records folded into attempts, every value bounded),
`_ranks` (every rank's journal file: the ranks, nodes and exits of each attempt),
`_summary` (the figures of ``report --json``), `_text` (the text, and the labels the page shares) and `_picture`
(``--html`` and ``--png``).
"""

from preemptible.report._attempts import MAX_FIGURES, MAX_POINTS, MAX_SPANS, Attempt
from preemptible.report._picture import (
    ATTEMPT_COLORS,
    COLORS,
    KILLED,
    PNG_CLIP,
    figure_svg,
    html,
    log_scale,
    png,
    timeline_svg,
)
from preemptible.report._summary import report, summarize
from preemptible.report._text import BADPUT_LABELS, SKIPPED_LABELS, commit_and_window, notes, render, to_json

__all__ = [
    "ATTEMPT_COLORS",
    "BADPUT_LABELS",
    "COLORS",
    "KILLED",
    "MAX_FIGURES",
    "MAX_POINTS",
    "MAX_SPANS",
    "PNG_CLIP",
    "SKIPPED_LABELS",
    "Attempt",
    "commit_and_window",
    "figure_svg",
    "html",
    "log_scale",
    "notes",
    "png",
    "render",
    "report",
    "summarize",
    "timeline_svg",
    "to_json",
]
