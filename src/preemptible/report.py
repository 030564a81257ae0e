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

Per-step times are an attempt's mean. The journal of rank 0 is used (every rank stops at the same step).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from preemptible import journal
from preemptible.store.io import Storage

_STEP_EVENTS = frozenset(
    {"log", "progress", "save_started", "save_committed", "notice", "exit", "done", "resume", "fresh"}
)

MAX_POINTS = 2000
"""Points kept per figure (``run.log`` name) for ``--html``, ``--png`` and ``--json``: a longer series is evenly
thinned to at most this many (``figures_downsampled`` says which, and how many points each had)."""
MAX_FIGURES = 64
"""Figure names kept (the first ones seen); more are counted in ``skipped``."""
MAX_SPANS = 1000
"""Saves and notices kept per attempt for the timeline and the list of preemptions (the totals count them all)."""
_MAX_NAME = 200
_MAX_TEXT = 300
_MAX_STEP = 1 << 53  # a step beyond this is not a step count (and would not survive float arithmetic)
_MAX_SECONDS = 1e9  # 30 years: a duration beyond this in a journal is not one
_KEEP_COMMITS = 1024  # commit times kept per attempt: where its redone steps began (the newest checkpoints)


BADPUT_LABELS = {
    "saves_s": "saves (training stood still)",
    "restore_and_startup_s": "restore and start-up",
    "redone_s": "steps redone",
    "waiting_for_stop_step_s": "waiting for the stop step",
    "between_attempts_s": "between attempts",
    "other_s": "other",
}
"""``badput_s``'s keys, in the order shown, and how the text and the page name them."""

SKIPPED_LABELS = {
    "unparsable_lines": "unparsable line(s)",
    "long_lines": f"line(s) too long (over {journal.MAX_LINE} bytes)",
    "events": "event(s) of unknown shape",
    "files_cut": f"file(s) cut at {journal.MAX_FILE} bytes",
    "figure_names": f"figure name(s) beyond the first {MAX_FIGURES} or longer than {_MAX_NAME} characters",
}
"""``skipped``'s keys: what the report left out of a journal, and why."""


def _t(value: Any) -> float | None:
    """An event's time (UTC ISO 8601) in epoch seconds, None if it is not one."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def _step(value: Any) -> int | None:
    """A step count, None for anything else (a string, a float, a bool, a number beyond any real run)."""
    if isinstance(value, int) and not isinstance(value, bool) and -_MAX_STEP < value < _MAX_STEP:
        return value
    return None


def _seconds(value: Any) -> float:
    """A duration from a journal, 0.0 for anything that is not a finite, plausible number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            v = float(value)
        except OverflowError:
            return 0.0
        if 0.0 <= v <= _MAX_SECONDS:
            return v
    return 0.0


def _text(value: Any) -> str | None:
    """A journal value shown as text (a source, a reason): None stays None, anything else a bounded string."""
    if value is None:
        return None
    text: str
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value)
        except (ValueError, TypeError, RecursionError):
            text = type(value).__name__
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def _figure_value(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            v = float(value)
        except OverflowError:
            return None
        return v if math.isfinite(v) else None
    return None


@dataclass
class Attempt:
    file: str
    start: float
    end: float
    start_iso: str = ""
    from_step: int = 0
    reached: int = 0
    ready: float | None = None
    save_s: float = 0.0
    saves: int = 0
    notices: list[dict[str, Any]] = field(default_factory=list)
    exit: dict[str, Any] | None = None
    done: bool = False
    kept_steps: int = 0
    redone_steps: int = 0
    save_spans: list[dict[str, Any]] = field(default_factory=list)
    committed_at: dict[int, float] = field(default_factory=dict)
    wait_s: float = 0.0
    index: int = 0
    pending: dict[str, Any] | None = None
    background: set[int] = field(default_factory=set)

    @property
    def restore_s(self) -> float:
        return (self.ready - self.start) if self.ready is not None else self.end - self.start

    @property
    def train_s(self) -> float:
        return max(0.0, self.end - (self.ready if self.ready is not None else self.end) - self.save_s - self.wait_s)

    @property
    def step_s(self) -> float | None:
        run = self.reached - self.from_step
        return self.train_s / run if run > 0 else None


class _Series:
    """One figure's points, thinned evenly to at most `MAX_POINTS` as they come (memory independent of length)."""

    __slots__ = ("points", "seen", "stride")

    def __init__(self) -> None:
        self.points: list[tuple[int, float, int]] = []
        self.seen = 0
        self.stride = 1

    def add(self, step: int, value: float, attempt: int) -> None:
        if self.seen % self.stride == 0:
            self.points.append((step, value, attempt))
            if len(self.points) > MAX_POINTS:
                del self.points[1::2]
                self.stride *= 2
        self.seen += 1


class _Reader:
    """Aggregates a stream of events into attempts (rank 0's journal files), keeping per-attempt figures only."""

    def __init__(self, skipped: dict[str, int]) -> None:
        self.by_file: dict[str, Attempt] = {}
        self.series: dict[str, _Series] = {}
        self.skipped = skipped
        self.not_drawn = {"saves": 0, "notices": 0}

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def add(self, e: Mapping[str, Any]) -> None:
        rank = e.get("rank", 0)
        if not (isinstance(rank, int) and not isinstance(rank, bool)):
            self.skip("events")
            return
        if rank != 0:
            return
        t = _t(e.get("t"))
        if t is None:
            self.skip("events")
            return
        name = str(e.get("file"))
        a = self.by_file.get(name)
        if a is None:
            a = self.by_file[name] = Attempt(file=name, start=t, end=t, start_iso=str(e["t"]), index=len(self.by_file))
        elif t < a.start:
            a.start, a.start_iso = t, str(e["t"])
        a.end = max(a.end, t)
        kind = e.get("event")
        if not isinstance(kind, str):
            self.skip("events")
            return
        step = _step(e.get("step"))
        if kind in ("fresh", "resume") and a.ready is None:
            a.ready = t
            a.from_step = a.reached = step or 0
        if kind in _STEP_EVENTS and step is not None:
            # a figure logged during step k: step k ran (its work is lost unless a later checkpoint holds it);
            # the other events are at a boundary: k steps done
            a.reached = max(a.reached, step + 1 if kind == "log" else step)
        if kind == "log":
            if step is not None:
                self._figures(e, step, a.index)
        elif kind == "save_started" and e.get("asynchronous"):
            stall = _seconds(e.get("stall_s"))
            a.save_s += stall
            a.saves += 1
            if step is not None and len(a.background) < _KEEP_COMMITS:
                a.background.add(step)
            self._span(a, _span(e, t, stall, background=True))
        elif kind == "save_started" and a.pending is not None and e.get("reason") == "emergency":
            wait = max(0.0, t - a.pending["received"])
            a.wait_s += wait - (a.pending["wait_s"] or 0.0)
            a.pending["wait_s"] = wait
        elif kind == "save_committed" and (step is None or step not in a.background):  # a background save: counted
            seconds = _seconds(e.get("seconds"))
            a.save_s += seconds
            a.saves += 1
            self._span(a, _span(e, t - seconds, seconds, background=False))
            if a.pending is not None and e.get("reason") == "emergency":
                a.pending["commit_s"] = t - a.pending["received"]
        elif kind == "notice":
            received = _t(e.get("received_at"))
            received = t if received is None else received
            deadline = _t(e.get("deadline"))
            a.pending = {
                "at": str(e["t"]),
                "deadline": deadline,
                "step": step,
                "source": _text(e.get("source")),
                "detail": _text(e.get("detail")),
                "received": received,
                "window_s": round(deadline - received, 3) if deadline is not None else None,
                "wait_s": None,
                "commit_s": None,
            }
            if len(a.notices) < MAX_SPANS:
                a.notices.append(a.pending)
            else:
                self.not_drawn["notices"] += 1
        if kind == "save_committed" and step is not None:
            a.background.discard(step)
            if step not in a.committed_at:
                a.committed_at[step] = t
                if len(a.committed_at) > _KEEP_COMMITS:
                    del a.committed_at[next(iter(a.committed_at))]
        if kind == "exit":
            code = e.get("code")
            a.exit = {"code": code if _step(code) is not None else _text(code), "reason": _text(e.get("reason"))}
        elif kind == "done":
            a.done = True

    def _span(self, a: Attempt, span: dict[str, Any]) -> None:
        if len(a.save_spans) < MAX_SPANS:
            a.save_spans.append(span)
        else:
            self.not_drawn["saves"] += 1

    def _figures(self, e: Mapping[str, Any], step: int, attempt: int) -> None:
        for k, v in e.items():
            if k in journal.RESERVED:
                continue
            value = _figure_value(v)
            if value is None:
                continue
            series = self.series.get(k)
            if series is None:
                if len(self.series) >= MAX_FIGURES or len(k) > _MAX_NAME:
                    self.skip("figure_names")
                    continue
                series = self.series[k] = _Series()
            series.add(step, value, attempt)


def _span(e: Mapping[str, Any], start: float, seconds: float, *, background: bool) -> dict[str, Any]:
    return {
        "start": start,
        "seconds": seconds,
        "step": _step(e.get("step")),
        "reason": _text(e.get("reason")),
        "background": background,
    }


def summarize(events: Iterable[Mapping[str, Any]], *, skipped: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The report's figures (``report --json``) from a root's journal events, read once, in memory that does not
    grow with their number.

    Args:
        events: the journal's events, each with ``file`` (the attempt it belongs to), as `journal.read` gives them.
        skipped: what the reader left out (`journal.read`'s counts), shown with what this leaves out.
    """
    counts: dict[str, int] = {"unparsable_lines": 0, "long_lines": 0, "events": 0}
    reader = _Reader(counts)
    for e in events:
        if isinstance(e, Mapping):
            reader.add(e)
        else:
            reader.skip("events")
    for k, v in (skipped or {}).items():  # read after the loop: the reader counts as it goes
        counts[k] = counts.get(k, 0) + v
    attempts = sorted(reader.by_file.values(), key=lambda a: a.start)
    shown_skipped = {k: v for k, v in counts.items() if v or k in ("unparsable_lines", "long_lines", "events")}
    if not attempts:
        return {
            "attempts": 0,
            "wall_s": 0.0,
            "started": None,
            "goodput": None,
            "badput_s": {},
            "preemptions": [],
            "runs": [],
            "timeline": [],
            "figures": {},
            "figures_downsampled": {},
            "not_drawn": {},
            "skipped": shown_skipped,
        }
    for a, nxt in zip(attempts, [*attempts[1:], None], strict=True):
        end = nxt.from_step if nxt is not None and nxt.ready is not None else a.reached
        a.kept_steps = max(0, min(a.reached, end) - a.from_step)
        a.redone_steps = max(0, a.reached - max(end, a.from_step))
    wall = attempts[-1].end - attempts[0].start
    good = sum(a.kept_steps * (a.step_s or 0.0) for a in attempts)
    redone = sum(a.redone_steps * (a.step_s or 0.0) for a in attempts)
    gaps = sum(max(0.0, n.start - a.end) for a, n in itertools.pairwise(attempts))
    badput = {
        "saves_s": round(sum(a.save_s for a in attempts), 3),
        "restore_and_startup_s": round(sum(a.restore_s for a in attempts), 3),
        "redone_s": round(redone, 3),
        "waiting_for_stop_step_s": round(sum(a.wait_s for a in attempts), 3),
        "between_attempts_s": round(gaps, 3),
    }
    badput["other_s"] = round(max(0.0, wall - good - sum(badput.values())), 3)
    preemptions = []
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        for n in a.notices:
            window = n["window_s"]
            preemptions.append(
                {
                    "attempt": i + 1,
                    "at": n["at"],
                    "step": n["step"],
                    "source": n["source"],
                    "detail": n["detail"],
                    "notice_to_commit_s": round(n["commit_s"], 3) if n["commit_s"] is not None else None,
                    "window_s": window,
                    "window_used": round(n["commit_s"] / window, 4) if n["commit_s"] and window else None,
                    "steps_lost": a.redone_steps,
                    "resumed_from": nxt.from_step if nxt is not None else None,
                }
            )
    runs = [
        {
            "attempt": i + 1,
            "journal": a.file,
            "from_step": a.from_step,
            "to_step": a.reached,
            "kept_steps": a.kept_steps,
            "redone_steps": a.redone_steps,
            "seconds": round(a.end - a.start, 3),
            "step_s": round(a.step_s, 6) if a.step_s is not None else None,
            "saves": a.saves,
            "ended": "finished" if a.done else (a.exit or {}).get("reason") or "unknown (no exit event: killed?)",
        }
        for i, a in enumerate(attempts)
    ]
    number = {a.index: i + 1 for i, a in enumerate(attempts)}
    figures: dict[str, list[list[float]]] = {}
    downsampled: dict[str, int] = {}
    for name, series in reader.series.items():
        points = sorted(series.points, key=lambda p: number[p[2]])  # by attempt, each in the order it logged
        figures[name] = [[s, v, number[k]] for s, v, k in points]
        if series.seen > len(series.points):
            downsampled[name] = series.seen
    return {
        "attempts": len(attempts),
        "wall_s": round(wall, 3),
        "started": attempts[0].start_iso,
        "goodput_s": round(good, 3),
        "goodput": round(good / wall, 4) if wall > 0 else None,
        "badput_s": badput,
        "preemptions": preemptions,
        "runs": runs,
        "finished": attempts[-1].done,
        "timeline": _timeline(attempts),
        "figures": figures,
        "figures_downsampled": downsampled,
        "not_drawn": {k: v for k, v in reader.not_drawn.items() if v},
        "skipped": shown_skipped,
    }


def _timeline(attempts: list[Attempt]) -> list[dict[str, Any]]:
    """Each attempt's spans in seconds from the first start (what ``--html`` and ``--png`` draw)."""
    t0 = attempts[0].start

    def at(t: float | None) -> float | None:
        return round(t - t0, 3) if t is not None else None

    out = []
    for i, a in enumerate(attempts):
        redone = None
        if a.redone_steps > 0:
            kept_to = a.from_step + a.kept_steps
            lost_from = a.committed_at.get(kept_to)
            if lost_from is None:  # no checkpoint of it in this attempt's journal: by the mean step time
                lost_from = (a.ready or a.start) + a.kept_steps * (a.step_s or 0.0)
            redone = {"start_s": at(lost_from), "end_s": at(a.end), "steps": a.redone_steps}
        out.append(
            {
                "attempt": i + 1,
                "start_s": at(a.start),
                "ready_s": at(a.ready),
                "end_s": at(a.end),
                "saves": [
                    {
                        "start_s": at(sp["start"]),
                        "seconds": round(sp["seconds"], 3),
                        "step": sp["step"],
                        "reason": sp["reason"],
                        "background": sp["background"],
                    }
                    for sp in a.save_spans
                ],
                "notices": [
                    {
                        "at_s": at(n["received"]),
                        "deadline_s": at(n["deadline"]),
                        "commit_s": at(n["received"] + n["commit_s"]) if n["commit_s"] is not None else None,
                        "source": n["source"],
                        "step": n["step"],
                    }
                    for n in a.notices
                ],
                "redone": redone,
                "ended": "finished" if a.done else (a.exit or {}).get("reason"),
            }
        )
    return out


def report(storage: Storage) -> dict[str, Any]:
    """`summarize` over every journal under the root of ``storage``, streamed (memory does not grow with the
    journal's length)."""
    skipped: dict[str, int] = {}
    return summarize(journal.read(storage, skipped=skipped), skipped=skipped)


def commit_and_window(p: Mapping[str, Any]) -> tuple[str, str]:
    """A preemption's notice-to-commit time and the share of its window it used, as the text and the page show
    them."""
    used = f"{100 * p['window_used']:.1f}% of {p['window_s']:.0f} s" if p["window_used"] is not None else "-"
    commit = f"{p['notice_to_commit_s']:.2f} s" if p["notice_to_commit_s"] is not None else "no commit"
    return commit, used


def render(doc: Mapping[str, Any]) -> str:
    if not doc["attempts"]:
        return "\n".join(["no journal: nothing to report (a Run writes one under <root>/journal)", *notes(doc)])
    wall = doc["wall_s"] or 1.0
    lines = [
        f"attempts          {doc['attempts']:>10}    {'finished' if doc['finished'] else 'not finished'}",
        f"wall time         {doc['wall_s']:>10.1f} s  (first start to last event, gaps included)",
        f"goodput           {doc['goodput_s']:>10.1f} s  {100 * (doc['goodput'] or 0):5.1f}%  (steps that were kept)",
        "badput:",
    ]
    for key, label in BADPUT_LABELS.items():
        v = doc["badput_s"][key]
        lines.append(f"  {label:<30}{v:>8.1f} s  {100 * v / wall:5.1f}%")
    if doc["preemptions"]:
        lines += ["", "preemptions:"]
        for p in doc["preemptions"]:
            commit, used = commit_and_window(p)
            lines.append(
                f"  attempt {p['attempt']}: {p['at']}  {p['source']} {p['detail'] or ''} at step {p['step']}: "
                f"notice->commit {commit} ({used}), {p['steps_lost']} step(s) lost, resumed from {p['resumed_from']}"
            )
    lines += ["", "runs of steps:"]
    for r in doc["runs"]:
        lines.append(
            f"  attempt {r['attempt']}: steps {r['from_step']}..{r['to_step']} in {r['seconds']:.1f} s, "
            f"{r['kept_steps']} kept, {r['redone_steps']} redone, {r['saves']} save(s), ended: {r['ended']}"
        )
    return "\n".join(lines + notes(doc))


def notes(doc: Mapping[str, Any]) -> list[str]:
    """What the report left out of the journal or thinned, as the text and the page say it (empty: nothing)."""
    out = []
    skipped = doc.get("skipped") or {}
    if any(skipped.values()):
        parts = [f"{n} {SKIPPED_LABELS.get(k, k)}" for k, n in skipped.items() if n]
        out.append(f"skipped: {', '.join(parts)}")
    if doc.get("figures_downsampled"):
        names = ", ".join(f"{k} ({n} points)" for k, n in doc["figures_downsampled"].items())
        out.append(f"figures drawn from at most {MAX_POINTS} points each, evenly spaced: {names}")
    if doc.get("not_drawn"):
        what = " and ".join(f"{n} {k}" for k, n in doc["not_drawn"].items())
        out.append(f"counted but not drawn or listed: {what} beyond the first {MAX_SPANS} of an attempt")
    return out


def to_json(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=1)
