"""The report's figures (``report --json``): goodput and badput, preemptions, runs of steps, the timeline."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from preemptible import journal
from preemptible.report._attempts import Attempt, Reader
from preemptible.report._ranks import RankEnd, ended, notice_of
from preemptible.store.io import Storage

MAX_RANKS_LISTED = 1024
"""Ranks listed per attempt in ``runs`` (``ranks_total`` counts them all)."""


def summarize(events: Iterable[Mapping[str, Any]], *, skipped: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The report's figures (``report --json``) from a root's journal events, read once, in memory that does not
    grow with their number.

    Args:
        events: the journal's events, each with ``file`` (the attempt it belongs to), as `journal.read` gives them.
        skipped: what the reader left out (`journal.read`'s counts), shown with what this leaves out.
    """
    counts: dict[str, int] = {"unparsable_lines": 0, "long_lines": 0, "events": 0}
    reader = Reader(counts)
    for start in journal.attempts(_records(events, reader), skipped=counts):
        for r in start.records:
            reader.add(r)
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
    ranks = reader.ranks.assign([a.file for a in attempts], [a.number for a in attempts], [a.start for a in attempts])
    preemptions = []
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        for n in a.notices:
            preemptions.append(_preemption(i + 1, a, n, ranks[i], nxt))
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
            "ended": _ended(a, ranks[i]) or "unknown (no exit event: killed?)",
            "warnings": list(a.warnings),
            "framework_fallback": a.fallback,
            "saves_by_tier": dict(a.tiers) if "memory" in a.tiers or a.restored else None,
            "restored": a.restored,
            "ranks": [e.to_json() for e in ranks[i][:MAX_RANKS_LISTED]],
            "ranks_total": len(ranks[i]),
            "nodes": sorted({e.node for e in ranks[i] if e.node is not None}),
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
        "timeline": _timeline(attempts, ranks),
        "figures": figures,
        "figures_downsampled": downsampled,
        "not_drawn": {k: v for k, v in reader.not_drawn.items() if v},
        "skipped": shown_skipped,
    }


def _records(events: Iterable[Mapping[str, Any]], reader: Reader) -> Iterator[journal.Record]:
    """The events as records, every rank's seen by `Reader.ranks` on the way; anything that is not an event's
    object is counted and left out."""
    for e in events:
        if isinstance(e, Mapping):
            record = journal.Record.of(e)
            reader.ranks.add(record)
            yield record
        else:
            reader.skip("events")


def _ended(a: Attempt, ranks: list[RankEnd]) -> str | None:
    """How an attempt ended: across its ranks when it had several (`_ranks.ended`), else as rank 0 journaled it;
    None when nothing says (killed without a word)."""
    if len(ranks) > 1:
        return "finished" if a.done else ended(ranks)
    return "finished" if a.done else (a.exit or {}).get("reason")


def _preemption(
    number: int, a: Attempt, n: dict[str, Any], ranks: list[RankEnd], nxt: Attempt | None
) -> dict[str, Any]:
    """One notice of an attempt: what rank 0 journaled; with several ranks, the node (and rank) that got it, its
    own detail, and the emergency commit as another rank journaled it when rank 0 did not (its node went)."""
    commit, commit_rank = n["commit_s"], 0 if n["commit_s"] is not None else None
    got: dict[str, Any] = {}
    if len(ranks) > 1:
        got = notice_of(ranks)
        if commit is None:
            later = [(e.committed, e.rank) for e in ranks if e.committed is not None and e.committed >= n["received"]]
            if later:
                at, commit_rank = min(later)
                commit = at - n["received"]
    window = n["window_s"]
    by = got.get("by")
    return {
        "attempt": number,
        "at": n["at"],
        "step": n["step"],
        "source": n["source"],
        "detail": got.get("detail") or n["detail"],
        "rank": by,
        "node": next((e.node for e in ranks if e.rank == by and e.node is not None), None),
        "notice_to_commit_s": round(commit, 3) if commit is not None else None,
        "commit_journaled_by": commit_rank,
        "window_s": window,
        "window_used": round(commit / window, 4) if commit and window else None,
        "steps_lost": a.redone_steps,
        "resumed_from": nxt.from_step if nxt is not None else None,
    }


def _timeline(attempts: list[Attempt], ranks: list[list[RankEnd]]) -> list[dict[str, Any]]:
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
                "ended": _ended(a, ranks[i]),
            }
        )
    return out


def report(storage: Storage) -> dict[str, Any]:
    """`summarize` over every journal under the root of ``storage``, streamed (memory does not grow with the
    journal's length)."""
    skipped: dict[str, int] = {}
    return summarize(journal.read(storage, skipped=skipped), skipped=skipped)
