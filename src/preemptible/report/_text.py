"""The report as text (``preemptible report``) and the labels the text and the page share."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from preemptible import journal
from preemptible.report._attempts import MAX_FIGURE_NAME, MAX_FIGURES, MAX_POINTS, MAX_SPANS
from preemptible.report._ranks import MAX_RANK_FILES, summary_of_ranks

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
    "figure_names": f"figure name(s) beyond the first {MAX_FIGURES} or longer than {MAX_FIGURE_NAME} characters",
    "rank_files": f"journal file(s) beyond the first {MAX_RANK_FILES} (not listed among the attempts' ranks)",
}
"""``skipped``'s keys: what the report left out of a journal, and why."""


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
            on = f" on {_where(p['rank'], p['node'])}" if p.get("rank") is not None else ""
            by = p.get("commit_journaled_by")
            seen = f", as rank {by} journaled it" if by else ""
            lines.append(
                f"  attempt {p['attempt']}: {p['at']}  {p['source']} {p['detail'] or ''} at step {p['step']}{on}: "
                f"notice->commit {commit} ({used}{seen}), {p['steps_lost']} step(s) lost, "
                + (f"resumed from {p['resumed_from']}" if p["resumed_from"] is not None else "not resumed (yet)")
            )
    lines += ["", "runs of steps:"]
    for r in doc["runs"]:
        lines.append(
            f"  attempt {r['attempt']}: steps {r['from_step']}..{r['to_step']} in {r['seconds']:.1f} s, "
            f"{r['kept_steps']} kept, {r['redone_steps']} redone, {r['saves']} save(s), ended: {r['ended']}"
        )
        ranks = r.get("ranks") or []
        if len(ranks) > 1:
            nodes = r.get("nodes") or []
            known = all(x.get("node") is not None for x in ranks)
            on = f" on {len(nodes)} node{'s' if len(nodes) > 1 else ''}" if nodes and known else ""
            lines.append(f"    {r.get('ranks_total', len(ranks))} ranks{on}: {summary_of_ranks(ranks)}")
        tiers = r.get("saves_by_tier")
        if tiers:
            lines.append("    saves by tier: " + ", ".join(f"{k} {v}" for k, v in sorted(tiers.items())))
        restored = r.get("restored")
        if restored:
            from_ = f"restored step {restored['step']} from the {restored['tier']} tier"
            why = (
                f" (memory could not: {restored['why']})"
                if restored.get("why") and restored["tier"] != "memory"
                else ""
            )
            lines.append(f"    {from_ if restored.get('step') is not None else 'started fresh'}{why}")
        lines += [f"    ! {w}" for w in r.get("warnings", [])]
        fell = r.get("framework_fallback")
        if fell:
            lines.append(
                f"    resumed from {fell['framework']}'s own checkpoint {fell['path']} (step {fell['step']}), "
                "which preemptible neither wrote nor verified (framework_fallback)"
            )
    return "\n".join(lines + notes(doc))


def _where(rank: int, node: int | None) -> str:
    return f"rank {rank}" if node is None else f"node {node} (rank {rank})"


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
