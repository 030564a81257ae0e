"""Named phases of a save, made visible to a rehearsal: the multi-node harness and ``drill`` act at them.

A multi-node test must cut a node off in the middle of a save, or take the store's host away right after a
commit, at that point and no other, whatever the machine's speed: a sleep would land anywhere. With
``$PREEMPTIBLE_PHASE_DIR`` set, each rank writes ``rank<r>.<phase>`` there (its content: the step and the save's
reason) when it reaches a phase, and, if ``hold.<phase>`` (every rank) or ``hold.rank<r>.<phase>`` (that rank)
exists in that directory, empty or naming the save's reason (e.g. ``emergency``), waits there until the file is
removed (at most `HOLD_MAX_S`), so the harness can act while the process stands still. Unset (always, outside
rehearsals), `reached` is one environment lookup.

Phases (`PHASES`): ``written``, this rank's files of the save are durable and it is about to report them to the
commit barrier; ``committed``, rank 0 has made ``COMMIT.json`` durable and has not yet told the other ranks.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger("preemptible")

PHASE_DIR_ENV = "PREEMPTIBLE_PHASE_DIR"
PHASES = ("written", "committed")
HOLD_MAX_S = 300.0
"""A hold never outlasts this: a rehearsal that forgot to release it still ends."""


def reached(phase: str, step: int, rank: int, reason: str = "") -> None:
    """Say that ``rank`` reached ``phase`` of the save of ``step`` (made for ``reason``: ``periodic``,
    ``emergency``, ...); hold while a hold file of it exists whose content is empty or that reason."""
    where = os.environ.get(PHASE_DIR_ENV, "").strip()
    if not where:
        return
    assert phase in PHASES, phase
    directory = Path(where)
    try:
        tmp = directory / f".rank{rank}.{phase}.tmp"
        tmp.write_text(f"{step} {reason}".strip())
        tmp.replace(directory / f"rank{rank}.{phase}")
    except OSError as e:
        log.warning("could not mark the phase %s in %s=%s: %s", phase, PHASE_DIR_ENV, where, e)
        return
    holds = (directory / f"hold.{phase}", directory / f"hold.rank{rank}.{phase}")
    deadline = time.monotonic() + HOLD_MAX_S
    while any(_holds(h, reason) for h in holds) and time.monotonic() < deadline:
        time.sleep(0.01)


def _holds(hold: Path, reason: str) -> bool:
    try:
        wanted = hold.read_text().strip()
    except OSError:  # absent (or removed meanwhile): no hold
        return False
    return not wanted or wanted == reason
