"""A run's attempts (rank 0's journal files) as the report reads them: each value from a journal bounded, each
attempt's saves, notices and figures kept in memory that does not grow with the journal; the other ranks' files
are folded by `_ranks`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from preemptible.events import Event, SaveReason
from preemptible.journal import RESERVED, Record, parse_step, parse_time
from preemptible.report._ranks import Ranks

_STEP_EVENTS = frozenset(
    {
        Event.LOG,
        Event.PROGRESS,
        Event.SAVE_STARTED,
        Event.SAVE_COMMITTED,
        Event.NOTICE,
        Event.EXIT,
        Event.PEER_LOST,  # the steps this rank had done when its peer watch found a peer gone
        Event.DONE,
        Event.RESUME,
        Event.FRESH,
        Event.FRAMEWORK_FALLBACK,
    }
)

MAX_POINTS = 2000
"""Points kept per figure (``run.log`` name) for ``--html``, ``--png`` and ``--json``: a longer series is evenly
thinned to at most this many (``figures_downsampled`` says which, and how many points each had)."""
MAX_FIGURES = 64
"""Figure names kept (the first ones seen); more are counted in ``skipped``."""
MAX_SPANS = 1000
"""Saves and notices kept per attempt for the timeline and the list of preemptions (the totals count them all)."""
MAX_FIGURE_NAME = 200
_MAX_TEXT = 300
_MAX_SECONDS = 1e9  # 30 years: a duration beyond this in a journal is not one
_MAX_WARNINGS = 20
_KEEP_COMMITS = 1024  # commit times kept per attempt: where its redone steps began (the newest checkpoints)


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
    warnings: list[str] = field(default_factory=list)
    """What this attempt's journal says made a resume inexact (``inexact_resume``), at most `_MAX_WARNINGS`."""
    fallback: dict[str, Any] | None = None
    """The framework's own checkpoint this attempt resumed from (a ``framework_fallback`` event), or None."""
    tiers: dict[str, int] = field(default_factory=dict)
    """Committed saves by tier (``memory`` or ``durable``), when a memory tier was on."""
    restored: dict[str, Any] | None = None
    """Where this attempt restored from, when a memory tier was on: the tier and why not memory (``tier_fallback``)."""
    number: int | None = None
    """The attempt number rank 0's ``start`` event recorded (every rank of the launch records the same)."""

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


class Reader:
    """Aggregates a stream of events into attempts (rank 0's journal files), keeping per-attempt figures only."""

    def __init__(self, skipped: dict[str, int]) -> None:
        self.by_file: dict[str, Attempt] = {}
        self.series: dict[str, _Series] = {}
        self.skipped = skipped
        self.not_drawn = {"saves": 0, "notices": 0}
        self.ranks = Ranks(skipped)
        """Every rank's journal files (rank 0's too): the ranks and nodes of each attempt (`_ranks`)."""

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def add(self, r: Record) -> None:
        """One of rank 0's records (`journal.attempts`)."""
        a = self._locate(r)
        if a is None:
            return
        t, kind, step = r.time, r.event, r.step
        assert t is not None
        _progress(a, kind, step, t)
        if kind == Event.LOG:
            if step is not None:
                self._figures(r, step, a.index)
        elif kind == Event.SAVE_STARTED:
            self._save_started(a, r, t)
        elif kind == Event.SAVE_COMMITTED and (step is None or step not in a.background):  # a background save:
            self._save_committed(a, r, t)  # counted when it started
        elif kind == Event.NOTICE:
            self._notice(a, r, t)
        elif kind == Event.INEXACT_RESUME and len(a.warnings) < _MAX_WARNINGS:
            a.warnings.append(f"resume not exact ({_text(r.get('what'))}): {_text(r.get('why'))}")
        elif kind == Event.FRAMEWORK_FALLBACK:
            a.fallback = {"framework": _text(r.get("framework")), "path": _text(r.get("path")), "step": step}
        elif kind == Event.START and a.number is None:
            a.number = parse_step(r.get("attempt"))
        if kind == Event.SAVE_COMMITTED and step is not None:
            _committed(a, step, t)
        _tiers(a, r, kind, step)
        if kind == Event.EXIT:
            code = r.get("code")
            a.exit = {"code": code if parse_step(code) is not None else _text(code), "reason": _text(r.get("reason"))}
        elif kind == Event.DONE:
            a.done = True

    def _locate(self, r: Record) -> Attempt | None:
        """The attempt of a record, its span grown to it; None for a record of unknown shape (counted)."""
        t = r.time
        if t is None:
            self.skip("events")
            return None
        a = self.by_file.get(r.file)
        if a is None:
            a = self.by_file[r.file] = Attempt(
                file=r.file, start=t, end=t, start_iso=str(r["t"]), index=len(self.by_file)
            )
        elif t < a.start:
            a.start, a.start_iso = t, str(r["t"])
        a.end = max(a.end, t)
        if r.name is None:
            self.skip("events")
            return None
        return a

    def _save_started(self, a: Attempt, r: Record, t: float) -> None:
        step = r.step
        if r.get("asynchronous"):
            stall = _seconds(r.get("stall_s"))
            a.save_s += stall
            a.saves += 1
            if step is not None and len(a.background) < _KEEP_COMMITS:
                a.background.add(step)
            self._span(a, _span(r, t, stall, background=True))
        elif a.pending is not None and r.get("reason") == SaveReason.EMERGENCY:
            wait = max(0.0, t - a.pending["received"])
            a.wait_s += wait - (a.pending["wait_s"] or 0.0)
            a.pending["wait_s"] = wait

    def _save_committed(self, a: Attempt, r: Record, t: float) -> None:
        seconds = _seconds(r.get("seconds"))
        a.save_s += seconds
        a.saves += 1
        self._span(a, _span(r, t - seconds, seconds, background=False))
        if a.pending is not None and r.get("reason") == SaveReason.EMERGENCY:
            a.pending["commit_s"] = t - a.pending["received"]

    def _notice(self, a: Attempt, r: Record, t: float) -> None:
        received = parse_time(r.get("received_at"))
        received = t if received is None else received
        deadline = parse_time(r.get("deadline"))
        a.pending = {
            "at": str(r["t"]),
            "deadline": deadline,
            "step": r.step,
            "source": _text(r.get("source")),
            "detail": _text(r.get("detail")),
            "received": received,
            "window_s": round(deadline - received, 3) if deadline is not None else None,
            "wait_s": None,
            "commit_s": None,
        }
        if len(a.notices) < MAX_SPANS:
            a.notices.append(a.pending)
        else:
            self.not_drawn["notices"] += 1

    def _span(self, a: Attempt, span: dict[str, Any]) -> None:
        if len(a.save_spans) < MAX_SPANS:
            a.save_spans.append(span)
        else:
            self.not_drawn["saves"] += 1

    def _figures(self, r: Record, step: int, attempt: int) -> None:
        for k, v in r.fields.items():
            if k in RESERVED:
                continue
            value = _figure_value(v)
            if value is None:
                continue
            series = self.series.get(k)
            if series is None:
                if len(self.series) >= MAX_FIGURES or len(k) > MAX_FIGURE_NAME:
                    self.skip("figure_names")
                    continue
                series = self.series[k] = _Series()
            series.add(step, value, attempt)


def _span(r: Record, start: float, seconds: float, *, background: bool) -> dict[str, Any]:
    return {
        "start": start,
        "seconds": seconds,
        "step": r.step,
        "reason": _text(r.get("reason")),
        "background": background,
    }


def _progress(a: Attempt, kind: Event | None, step: int | None, t: float) -> None:
    """Where an attempt started training (its fresh start or resume) and how far its events say it ran."""
    if kind in (Event.FRESH, Event.RESUME, Event.FRAMEWORK_FALLBACK) and a.ready is None:
        a.ready = t
        a.from_step = a.reached = step or 0
    if kind in _STEP_EVENTS and step is not None:
        # a figure logged during step k: step k ran (its work is lost unless a later checkpoint holds it);
        # the other events are at a boundary: k steps done
        a.reached = max(a.reached, step + 1 if kind == Event.LOG else step)


def _tiers(a: Attempt, r: Record, kind: Event | None, step: int | None) -> None:
    """Which tier each save went to and the restore came from (a run with a memory tier)."""
    if kind == Event.SAVE_COMMITTED and step is not None:
        tier = _text(r.get("tier") or "durable") or "durable"
        if tier in a.tiers or len(a.tiers) < 2:  # two tiers: a journal cannot grow the table
            a.tiers[tier] = a.tiers.get(tier, 0) + 1
    elif kind == Event.TIER_FALLBACK:
        a.restored = {"tier": "durable", "step": None, "why": _text(r.get("why"))}
    elif kind == Event.RESUME and r.get("tier") is not None:
        a.restored = {**(a.restored or {}), "tier": _text(r.get("tier")), "step": step}


def _committed(a: Attempt, step: int, t: float) -> None:
    """A commit of ``step``: no longer a background save in flight; when it was first committed (bounded)."""
    a.background.discard(step)
    if step not in a.committed_at:
        a.committed_at[step] = t
        if len(a.committed_at) > _KEEP_COMMITS:
            del a.committed_at[next(iter(a.committed_at))]
