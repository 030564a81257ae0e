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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from preemptible import journal
from preemptible.store.io import Storage

_STEP_EVENTS = frozenset(
    {"log", "progress", "save_started", "save_committed", "notice", "exit", "done", "resume", "fresh"}
)


BADPUT_LABELS = {
    "saves_s": "saves (training stood still)",
    "restore_and_startup_s": "restore and start-up",
    "redone_s": "steps redone",
    "waiting_for_stop_step_s": "waiting for the stop step",
    "between_attempts_s": "between attempts",
    "other_s": "other",
}
"""``badput_s``'s keys, in the order shown, and how the text and the page name them."""


def _t(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


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
    figures: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    @property
    def restore_s(self) -> float:
        return (self.ready - self.start) if self.ready is not None else self.end - self.start

    @property
    def train_s(self) -> float:
        return max(0.0, self.end - (self.ready if self.ready is not None else self.end) - self.save_s - self.wait_s)

    @property
    def wait_s(self) -> float:
        return sum(n.get("wait_s") or 0.0 for n in self.notices)

    @property
    def step_s(self) -> float | None:
        run = self.reached - self.from_step
        return self.train_s / run if run > 0 else None


_RESERVED = frozenset({"t", "event", "step", "rank", "file", "pid", "host"})
"""A ``log`` event's fields that are not figures logged with ``run.log``."""


def _span(e: Mapping[str, Any], seconds: float, *, background: bool, start: float | None = None) -> dict[str, Any]:
    return {
        "start": _t(e["t"]) if start is None else start,
        "seconds": seconds,
        "step": e.get("step"),
        "reason": e.get("reason"),
        "background": background,
    }


def _attempts(events: Iterable[Mapping[str, Any]]) -> list[Attempt]:
    by_file: dict[str, list[Mapping[str, Any]]] = {}
    for e in events:
        if e.get("rank", 0) == 0 and isinstance(e.get("t"), str):
            by_file.setdefault(str(e.get("file")), []).append(e)
    out = []
    for name, evs in by_file.items():
        times = [_t(e["t"]) for e in evs]
        first = min(range(len(evs)), key=times.__getitem__)
        a = Attempt(file=name, start=times[first], end=max(times), start_iso=str(evs[first]["t"]))
        pending: dict[str, Any] | None = None
        background = {e.get("step") for e in evs if e.get("event") == "save_started" and e.get("asynchronous")}
        for e in evs:
            kind, step = e.get("event"), e.get("step")
            if kind in ("fresh", "resume") and a.ready is None:
                a.ready = _t(e["t"])
                a.from_step = a.reached = int(step or 0)
            if kind in _STEP_EVENTS and isinstance(step, int):
                # a figure logged during step k: step k ran (its work is lost unless a later checkpoint holds it);
                # the other events are at a boundary: k steps done
                a.reached = max(a.reached, step + 1 if kind == "log" else step)
            if kind == "log" and isinstance(step, int):
                values = {
                    k: float(v)
                    for k, v in e.items()
                    if k not in _RESERVED and isinstance(v, (int, float)) and not isinstance(v, bool)
                }
                if values:
                    a.figures.append((step, values))
            if kind == "save_started" and e.get("asynchronous"):
                a.save_s += float(e.get("stall_s") or 0.0)
                a.saves += 1
                a.save_spans.append(_span(e, float(e.get("stall_s") or 0.0), background=True))
            elif kind == "save_started" and pending is not None and e.get("reason") == "emergency":
                pending["wait_s"] = max(0.0, _t(e["t"]) - pending["received"])
            elif kind == "save_committed" and step not in background:  # a background save: its stall counted
                a.save_s += float(e.get("seconds") or 0.0)
                a.saves += 1
                seconds = float(e.get("seconds") or 0.0)
                a.save_spans.append(_span(e, seconds, background=False, start=_t(e["t"]) - seconds))
                if pending is not None and e.get("reason") == "emergency":
                    pending["commit_s"] = _t(e["t"]) - pending["received"]
            elif kind == "notice":
                received = _t(e["received_at"]) if isinstance(e.get("received_at"), str) else _t(e["t"])
                deadline = _t(e["deadline"]) if isinstance(e.get("deadline"), str) else None
                pending = {
                    "at": e["t"],
                    "deadline": deadline,
                    "step": step,
                    "source": e.get("source"),
                    "detail": e.get("detail"),
                    "received": received,
                    "window_s": round(deadline - received, 3) if deadline is not None else None,
                    "wait_s": None,
                    "commit_s": None,
                }
                a.notices.append(pending)
            if kind == "save_committed" and isinstance(step, int):
                a.committed_at.setdefault(step, _t(e["t"]))
            if kind == "exit":
                a.exit = {"code": e.get("code"), "reason": e.get("reason")}
            elif kind == "done":
                a.done = True
        out.append(a)
    return sorted(out, key=lambda a: a.start)


def summarize(events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The report's figures (``report --json``) from a root's journal events."""
    attempts = _attempts(events)
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
        "figures": _figures(attempts),
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


def _figures(attempts: list[Attempt]) -> dict[str, list[list[float]]]:
    """Every figure logged with ``run.log``: ``name -> [[step, value, attempt], ...]`` across restarts (steps
    redone after a preemption appear once per attempt that ran them)."""
    out: dict[str, list[list[float]]] = {}
    for i, a in enumerate(attempts):
        for step, values in a.figures:
            for name, value in values.items():
                out.setdefault(name, []).append([step, value, i + 1])
    return out


def report(storage: Storage) -> dict[str, Any]:
    """`summarize` over every journal under the root of ``storage``."""
    return summarize(journal.read(storage))


def commit_and_window(p: Mapping[str, Any]) -> tuple[str, str]:
    """A preemption's notice-to-commit time and the share of its window it used, as the text and the page show
    them."""
    used = f"{100 * p['window_used']:.1f}% of {p['window_s']:.0f} s" if p["window_used"] is not None else "-"
    commit = f"{p['notice_to_commit_s']:.2f} s" if p["notice_to_commit_s"] is not None else "no commit"
    return commit, used


def render(doc: Mapping[str, Any]) -> str:
    if not doc["attempts"]:
        return "no journal: nothing to report (a Run writes one under <root>/journal)"
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
    return "\n".join(lines)


def to_json(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=1)
