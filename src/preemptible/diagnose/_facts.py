"""What the run's journal says about one attempt: the notice, the exit, the newest committed step."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from preemptible import journal
from preemptible.diagnose._evidence import Evidence
from preemptible.diagnose._scan import TimeWindow
from preemptible.events import Event, ExitReason
from preemptible.journal import Record


@dataclass
class JournalFacts:
    """What one process start (an attempt) of a run wrote in its journal (rank 0)."""

    file: str | None = None
    notice: dict[str, Any] | None = None
    exit: dict[str, Any] | None = None
    done: bool = False
    last_step: int | None = None
    committed_after_notice: int | None = None
    last_committed: int | None = None
    last_memory: int | None = None
    """The newest step this attempt's memory tier protected (``save_committed`` with ``tier: memory``)."""
    events: list[Mapping[str, Any]] = field(default_factory=list)
    attempt: int | None = None
    attempts: int = 0
    chosen_by: str = ""
    fallback: str | None = None
    """The framework's own checkpoint this attempt resumed from (``framework_fallback``), described."""
    inexact: list[str] = field(default_factory=list)
    """Why this attempt's resume (or the next one's, for a stop mid-accumulation) is not exact (``inexact_resume``)."""


def _attempts(records: Iterable[Record]) -> list[tuple[int, str, list[Record]]]:
    """Rank 0's journal files in start order, each one attempt (`journal.attempts`): (number, file, records)."""
    out = []
    for start in journal.attempts(records):
        mine = list(start.records)
        out.append((journal.attempt_number(start, mine), start.file, mine))
    return out


def _span(records: list[Record]) -> tuple[float, float] | None:
    times = [r.time for r in records if r.time is not None]
    return (min(times), max(times)) if times else None


def _choose(
    attempts: list[tuple[int, str, list[Record]]], attempt: int | str | None, window: TimeWindow | None
) -> tuple[int, str]:
    """Which attempt to judge (its index in ``attempts``) and why."""
    if isinstance(attempt, int):
        for i, (number, _, _) in enumerate(attempts):
            if number == attempt:
                return i, f"--attempt {attempt}"
        raise ValueError(
            f"expected --attempt between 1 and {len(attempts)} (the run's process starts in its journal); "
            f"found {attempt}"
        )
    last = len(attempts) - 1
    if attempt == "last":
        return last, "--attempt last"
    if window is None:
        return last, "the last: no logs given to match by time"
    if window.first is None or window.last is None:
        return _placed_by_own_lines(attempts, window) or (last, "the last: the logs carry no timestamps")
    spans = [_span(events) for _, _, events in attempts]
    best, overlap = None, -1.0
    for i, span in enumerate(spans):
        if span is None:
            continue
        # an attempt lasts from its first event until a minute after its last (a killed process journals no end),
        # but not into the next attempt; log timestamps have whole seconds
        following = next((x[0] for x in spans[i + 1 :] if x is not None), None)
        end = span[1] + 60.0 if following is None else min(span[1] + 60.0, following)
        lo, hi = max(span[0], window.first), min(end, window.last + 1.0)
        if hi > lo and hi - lo >= overlap:
            best, overlap = i, hi - lo
    if best is None:
        return last, "the last: the logs' times match no attempt"
    return best, "the logs' time range"


def _placed_by_own_lines(attempts: list[tuple[int, str, list[Record]]], window: TimeWindow) -> tuple[int, str] | None:
    """The one attempt whose journal has the notice step or the resume step preemptible's own lines in the logs
    name (`TimeWindow.stops`, ``.resumes``), or None when they name none or several."""
    if not window.stops and not window.resumes:
        return None
    matches = []
    for i, (_, _, events) in enumerate(attempts):
        notices = {r.step for r in events if r.event == Event.NOTICE}
        resumes = {r.step for r in events if r.event == Event.RESUME}
        if window.stops & notices or window.resumes & resumes:
            matches.append(i)
    if len(matches) != 1:
        return None
    said = [f"a notice at step {s}" for s in sorted(window.stops)] + [
        f"a resume at step {s}" for s in sorted(window.resumes)
    ]
    return matches[0], f"preemptible's own lines in the logs ({', '.join(said[:3])})"


def journal_facts(root: str, *, attempt: int | str | None = None, window: TimeWindow | None = None) -> JournalFacts:
    """The facts of one attempt of the run under ``root``: ``attempt`` (a number, or "last"), else the one whose
    time range the logs' timestamps fall in, else the last.

    Raises:
        ValueError: ``attempt`` names no attempt in the journal.
    """
    from preemptible.checkpoint import Checkpointer
    from preemptible.store.io import storage_for

    storage = storage_for(root)
    attempts = _attempts(journal.records(storage))
    facts = JournalFacts()
    ck = Checkpointer(root, storage=storage)
    committed = [c.step for c in ck.checkpoints()]
    facts.last_committed = max(committed) if committed else None
    if not attempts:
        if isinstance(attempt, int):
            raise ValueError(f"expected --attempt {attempt} in the journal under {root}; found no journal")
        return facts
    index, facts.chosen_by = _choose(attempts, attempt, window)
    facts.attempt, facts.file, events = attempts[index]
    facts.attempts = len(attempts)
    facts.events = [r.fields for r in events]
    steps = [r.step for r in events if r.step is not None]
    facts.last_step = max(steps) if steps else None
    mine: list[int] = []
    for r in events:
        memory = r.event == Event.SAVE_COMMITTED and r.get("tier") == "memory"
        if memory and r.step is not None:
            facts.last_memory = max(r.step, facts.last_memory or 0)
        elif r.event in (Event.RESUME, Event.SAVE_COMMITTED) and r.step is not None:
            mine.append(r.step)
        if r.event == Event.NOTICE and facts.notice is None:
            facts.notice = dict(r.fields)
        elif r.event == Event.SAVE_COMMITTED and facts.notice is not None:
            facts.committed_after_notice = r.step
        elif r.event == Event.EXIT:
            facts.exit = dict(r.fields)
        elif r.event == Event.DONE:
            facts.done = True
        elif r.event == Event.INEXACT_RESUME and len(facts.inexact) < 20:
            facts.inexact.append(f"{r.get('what')}: {r.get('why')}")
        elif r.event == Event.FRAMEWORK_FALLBACK:
            facts.fallback = (
                f"{r.get('framework')}'s own checkpoint {r.get('path')} (step {r.get('framework_step')}; preemptible's "
                f"newest: {r.get('preemptible_step')}), which preemptible neither wrote nor verified"
            )
    if index != len(attempts) - 1:  # an earlier attempt: what it had saved by its end, not what later ones did
        facts.last_committed = max(mine) if mine else None
    return facts


def journal_evidence(facts: JournalFacts) -> list[Evidence]:
    out: list[Evidence] = []
    where = f"journal {facts.file}"
    if facts.notice is not None:
        n = facts.notice
        source = str(n.get("source"))
        detail = n.get("detail") or "no detail"
        text = f"{source} notice ({n.get('kind')}, {detail}) at step {n.get('step')}, t={n.get('t')}"
        if source in ("aws", "gcp", "azure"):
            out.append(
                Evidence(
                    "preempted",
                    "strong",
                    f"the {source} metadata service announced the reclaim",
                    where,
                    None,
                    text,
                    source,
                )
            )
        else:
            out.append(
                Evidence(
                    "terminated",
                    "strong",
                    f"a {n.get('detail') or source} reached the run; who sent it is not recorded",
                    where,
                    None,
                    text,
                    "preemptible",
                )
            )
    if facts.done:
        out.append(
            Evidence("completed", "strong", "the run finished all its steps (DONE)", where, None, "done", "preemptible")
        )
    if facts.exit is not None and facts.exit.get("reason") == ExitReason.NOTICE:
        saved = facts.exit.get("saved")
        out.append(
            Evidence(
                "terminated",
                "weak",
                "the run exited on purpose after the notice",
                where,
                None,
                f"exit at step {facts.exit.get('step')} with code {facts.exit.get('code')}, "
                f"{'checkpoint saved' if saved else 'no checkpoint saved'}, t={facts.exit.get('t')}",
                "preemptible",
            )
        )
    return out
