"""The pictures of ``preemptible report``: ``--html`` (one self-contained file: inline SVG and CSS, no script, no
network) and ``--png`` (matplotlib, the ``plot`` extra).

Both draw the same two things from `preemptible.report.summarize`'s document:

- the timeline: one row per attempt, start-up and restore, training, saves, the steps redone after a preemption
  (shaded), every notice with its window;
- the figures logged with ``run.log`` (a loss) over steps, one line per attempt, with the steps preemptions came at.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from preemptible.report import BADPUT_LABELS, commit_and_window

COLORS = {
    "startup": "#9e9e9e",
    "train": "#43a047",
    "save": "#1e88e5",
    "redone": "#e53935",
    "notice": "#fb8c00",
}
ATTEMPT_COLORS = ["#1e88e5", "#8e24aa", "#00897b", "#f4511e", "#3949ab", "#c0ca33", "#6d4c41", "#d81b60"]
MAX_FIGURES = 6


_LEGEND = [
    ("start-up and restore", COLORS["startup"]),
    ("training", COLORS["train"]),
    ("save", COLORS["save"]),
    ("steps redone", COLORS["redone"]),
    ("notice and its window", COLORS["notice"]),
]
KILLED = "x: ended without an exit event (killed, or the machine went)"


def _ticks(lo: float, hi: float, want: int = 8) -> list[float]:
    """Round tick positions covering [lo, hi]."""
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / want
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 or v == int(v) else f"{v:.3g}"


def _rect(x: float, y: float, w: float, h: float, *, cls: str, title: str, **attrs: Any) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return (
        f'<rect class="{cls}" x="{x:.1f}" y="{y:.1f}" width="{max(w, 1.5):.1f}" height="{h:.1f}"{extra}>'
        f"<title>{escape(title)}</title></rect>"
    )


def timeline_svg(doc: Mapping[str, Any], width: int = 1000) -> str:
    rows: Sequence[Mapping[str, Any]] = doc["timeline"]
    left, right, row_h, top = 90, 20, 30, 10
    wall = max(float(doc["wall_s"]), 1e-3)  # a notice's window is drawn up to here (it may reach past the last event)
    scale = (width - left - right) / wall

    def x(t: float) -> float:
        return left + t * scale

    height = top + row_h * len(rows) + 40
    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for i, a in enumerate(rows):
        y = top + i * row_h
        out.append(f'<g class="attempt" data-attempt="{a["attempt"]}">')
        out.append(f'<text x="{left - 8}" y="{y + 19}" text-anchor="end">attempt {a["attempt"]}</text>')
        ready = a["ready_s"] if a["ready_s"] is not None else a["end_s"]
        out.append(
            _rect(
                x(a["start_s"]),
                y + 5,
                (ready - a["start_s"]) * scale,
                20,
                cls="startup",
                title=f"start-up and restore: {ready - a['start_s']:.2f} s",
                fill=COLORS["startup"],
            )
        )
        if a["ready_s"] is not None:
            out.append(
                _rect(
                    x(ready),
                    y + 5,
                    (a["end_s"] - ready) * scale,
                    20,
                    cls="train",
                    title=f"training from {ready:.1f} s to {a['end_s']:.1f} s",
                    fill=COLORS["train"],
                )
            )
        if a["redone"] is not None:
            r = a["redone"]
            out.append(
                _rect(
                    x(r["start_s"]),
                    y + 5,
                    (r["end_s"] - r["start_s"]) * scale,
                    20,
                    cls="redone",
                    title=f"{r['steps']} step(s) lost, done again by the next attempt",
                    fill=COLORS["redone"],
                    fill_opacity="0.6",
                )
            )
        for sp in a["saves"]:
            what = "background save (stall)" if sp["background"] else f"{sp['reason'] or 'save'}"
            out.append(
                _rect(
                    x(sp["start_s"]),
                    y + 3,
                    sp["seconds"] * scale,
                    24,
                    cls="save",
                    title=f"{what} of step {sp['step']}: {sp['seconds']:.2f} s",
                    fill=COLORS["save"],
                )
            )
        for n in a["notices"]:
            if n["deadline_s"] is not None:
                out.append(
                    _rect(
                        x(n["at_s"]),
                        y + 1,
                        (min(n["deadline_s"], wall) - n["at_s"]) * scale,
                        28,
                        cls="window",
                        title=f"the notice's window: {n['deadline_s'] - n['at_s']:.0f} s",
                        fill=COLORS["notice"],
                        fill_opacity="0.18",
                    )
                )
            commit = f", committed after {n['commit_s'] - n['at_s']:.2f} s" if n["commit_s"] is not None else ""
            out.append(
                f'<line class="notice" x1="{x(n["at_s"]):.1f}" x2="{x(n["at_s"]):.1f}" y1="{y}" y2="{y + row_h}" '
                f'stroke="{COLORS["notice"]}" stroke-width="3"><title>{escape(str(n["source"]))} notice at step '
                f"{n['step']}{commit}</title></line>"
            )
        if a["ended"] is None:  # no exit event: the process was killed (or its machine went) without a word
            ex, ey = x(a["end_s"]), y + 15
            out.append(
                f'<path class="killed" d="M{ex - 6:.1f},{ey - 6} L{ex + 6:.1f},{ey + 6} M{ex - 6:.1f},{ey + 6} '
                f'L{ex + 6:.1f},{ey - 6}" stroke="#000" stroke-width="2.5"><title>ended without an exit event '
                "(killed, or the machine went)</title></path>"
            )
        out.append("</g>")
    axis_y = top + row_h * len(rows) + 4
    out.append(f'<line x1="{left}" x2="{width - right}" y1="{axis_y}" y2="{axis_y}" stroke="#555"/>')
    for t in _ticks(0.0, wall):
        out.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{axis_y}" y2="{axis_y + 5}" stroke="#555"/>')
        out.append(f'<text x="{x(t):.1f}" y="{axis_y + 18}" text-anchor="middle">{_fmt(t)}</text>')
    out.append(f'<text x="{width - right}" y="{axis_y + 34}" text-anchor="end">seconds since the first start</text>')
    out.append("</svg>")
    return "".join(out)


def figure_svg(name: str, points: Sequence[Sequence[float]], marks: Sequence[int], width: int = 1000) -> str:
    """One figure over steps: a line per attempt, a dashed line at each step a preemption came at."""
    left, right, top, bottom, height = 90, 20, 24, 30, 200
    steps = [p[0] for p in points] + list(marks)
    values = [p[1] for p in points if math.isfinite(p[1])]
    log = log_scale(values)
    shown = [math.log10(v) for v in values] if log else values
    s_lo, s_hi = min(steps), max(steps)
    v_lo, v_hi = (min(shown), max(shown)) if shown else (0.0, 1.0)
    if v_hi == v_lo:
        v_lo, v_hi = v_lo - 1, v_hi + 1
    if s_hi == s_lo:
        s_hi = s_lo + 1

    def x(s: float) -> float:
        return left + (s - s_lo) / (s_hi - s_lo) * (width - left - right)

    def y(v: float) -> float:
        u = math.log10(v) if log else v
        return top + (v_hi - u) / (v_hi - v_lo) * (height - top - bottom)

    out = [
        f'<svg class="figure" data-name="{escape(name)}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}">',
        f'<text x="{left}" y="16" font-weight="bold">{escape(name)}{" (log scale)" if log else ""}</text>',
        f'<line x1="{left}" x2="{width - right}" y1="{height - bottom}" y2="{height - bottom}" stroke="#555"/>',
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{height - bottom}" stroke="#555"/>',
    ]
    if log:  # a tick at each power of ten
        for k in range(math.ceil(v_lo), math.floor(v_hi) + 1):
            out.append(f'<text x="{left - 6}" y="{y(10.0**k) + 4:.1f}" text-anchor="end">1e{k}</text>')
    else:
        for v in _ticks(v_lo, v_hi, 4):
            out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    for s in _ticks(s_lo, s_hi, 8):
        out.append(f'<text x="{x(s):.1f}" y="{height - bottom + 16}" text-anchor="middle">{_fmt(s)}</text>')
    out.append(f'<text x="{width - right}" y="{height - 2}" text-anchor="end">step</text>')
    for s in marks:
        out.append(
            f'<line class="preempted-at" x1="{x(s):.1f}" x2="{x(s):.1f}" y1="{top}" y2="{height - bottom}" '
            f'stroke="{COLORS["notice"]}" stroke-dasharray="4 3" stroke-width="2"><title>preemption notice at step '
            f"{s}</title></line>"
        )
    attempts = sorted({int(p[2]) for p in points})
    for k in attempts:
        mine = sorted((p[0], p[1]) for p in points if int(p[2]) == k and math.isfinite(p[1]))
        color = ATTEMPT_COLORS[(k - 1) % len(ATTEMPT_COLORS)]
        coords = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in mine)
        out.append(
            f'<polyline class="series" data-attempt="{k}" fill="none" stroke="{color}" stroke-width="2" '
            f'points="{coords}"><title>attempt {k}</title></polyline>'
        )
        if len(mine) == 1:
            out.append(f'<circle cx="{x(mine[0][0]):.1f}" cy="{y(mine[0][1]):.1f}" r="3" fill="{color}"/>')
    out.append("</svg>")
    return "".join(out)


def log_scale(values: Sequence[float]) -> bool:
    """A figure that is positive and spans more than two decades (a loss falling from 1 to 0.001) is drawn on a
    log scale, where its later values stay visible."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > 100


def _marks(doc: Mapping[str, Any]) -> list[int]:
    return sorted({p["step"] for p in doc["preemptions"] if isinstance(p["step"], int)})


def html(doc: Mapping[str, Any], root: str) -> str:
    """The report as one self-contained HTML page."""
    wall = doc["wall_s"] or 1.0
    summary = [
        f'<tr><th>attempts</th><td id="attempts">{doc["attempts"]}</td>'
        f'<td id="finished">{"finished" if doc.get("finished") else "not finished"}</td></tr>',
        f'<tr><th>wall time</th><td id="wall">{doc["wall_s"]:.1f} s</td><td>first start to last event</td></tr>',
    ]
    if doc["attempts"]:
        summary.append(
            f'<tr><th>goodput</th><td id="goodput" data-value="{doc["goodput"]}">{100 * (doc["goodput"] or 0):.1f}%'
            f"</td><td>{doc['goodput_s']:.1f} s in steps that were kept</td></tr>"
        )
        for key, label in BADPUT_LABELS.items():
            v = doc["badput_s"][key]
            summary.append(
                f'<tr class="badput" data-key="{key}"><th>{escape(label)}</th><td>{v:.1f} s</td>'
                f"<td>{100 * v / wall:.1f}%</td></tr>"
            )
    rows = []
    for p in doc["preemptions"]:
        commit, used = commit_and_window(p)
        rows.append(
            f'<tr class="preemption"><td>{p["attempt"]}</td><td>{escape(str(p["at"]))}</td>'
            f"<td>{escape(str(p['source']))} {escape(str(p['detail'] or ''))}</td><td>{p['step']}</td>"
            f"<td>{commit}</td><td>{used}</td><td>{p['steps_lost']}</td><td>{p['resumed_from']}</td></tr>"
        )
    runs = [
        f'<tr class="run"><td>{r["attempt"]}</td><td>{r["from_step"]}..{r["to_step"]}</td><td>{r["seconds"]:.1f} s'
        f"</td><td>{r['kept_steps']}</td><td>{r['redone_steps']}</td><td>{r['saves']}</td>"
        f"<td>{escape(str(r['ended']))}</td></tr>"
        for r in doc["runs"]
    ]
    figures = list(doc["figures"].items())[:MAX_FIGURES]
    legend = "".join(f'<span><i style="background:{c}"></i>{w}</span>' for w, c in _LEGEND) + f"<span>{KILLED}</span>"
    body = [
        f"<h1>preemptible report</h1><p class=root>{escape(root)}"
        + (f" &middot; first start {escape(str(doc['started']))}" if doc.get("started") else "")
        + "</p>",
        f"<table class=summary>{''.join(summary)}</table>",
    ]
    if doc["attempts"]:
        body += ["<h2>Timeline</h2>", f"<div class=legend>{legend}</div>", timeline_svg(doc)]
    if figures:
        attempts = sorted({int(p[2]) for _, pts in figures for p in pts})
        keys = "".join(
            f'<span><i style="background:{ATTEMPT_COLORS[(k - 1) % len(ATTEMPT_COLORS)]}"></i>attempt {k}</span>'
            for k in attempts
        )
        body.append(
            "<h2>Figures logged with run.log</h2><div class=legend>"
            f'{keys}<span><i style="background:{COLORS["notice"]}"></i>a preemption notice (dashed)</span></div>'
        )
        body += [figure_svg(name, pts, _marks(doc)) for name, pts in figures]
    if rows:
        body.append(
            "<h2>Preemptions</h2><table class=list><tr><th>attempt</th><th>at</th><th>source</th><th>step</th>"
            f"<th>notice to commit</th><th>window used</th><th>steps lost</th><th>resumed from</th></tr>{''.join(rows)}"
            "</table>"
        )
    if runs:
        body.append(
            "<h2>Runs of steps</h2><table class=list><tr><th>attempt</th><th>steps</th><th>time</th><th>kept</th>"
            f"<th>redone</th><th>saves</th><th>ended</th></tr>{''.join(runs)}</table>"
        )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>preemptible report</title><style>'
        "body{font:14px system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px;margin:0}"
        "h2{font-size:16px;margin-top:28px}.root{color:#666}table{border-collapse:collapse}"
        "td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #eee}svg text{font:12px sans-serif}"
        ".legend span{margin-right:16px}.legend i{display:inline-block;width:12px;height:12px;margin-right:5px;"
        "vertical-align:-1px}</style></head><body>" + "".join(body) + "</body></html>\n"
    )


def png(doc: Mapping[str, Any], path: str) -> None:
    """The timeline and the figures as a PNG (matplotlib, without pyplot's global state).

    Raises:
        ImportError: matplotlib is not installed (``pip install 'preemptible[plot]'``).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figures = list(doc["figures"].items())[: MAX_FIGURES // 2]
    rows = doc["timeline"]
    fig = Figure(figsize=(11, 1.2 + 0.45 * max(1, len(rows)) + 2.4 * len(figures)), dpi=100)
    FigureCanvasAgg(fig)
    ratios = [0.6 + 0.45 * max(1, len(rows))] + [2.4] * len(figures)
    axes = fig.subplots(1 + len(figures), 1, gridspec_kw={"height_ratios": ratios}, squeeze=False)[:, 0]
    ax = axes[0]
    for i, a in enumerate(rows):
        y = len(rows) - 1 - i
        ready = a["ready_s"] if a["ready_s"] is not None else a["end_s"]
        ax.broken_barh([(a["start_s"], ready - a["start_s"])], (y - 0.3, 0.6), color=COLORS["startup"])
        if a["ready_s"] is not None:
            ax.broken_barh([(ready, a["end_s"] - ready)], (y - 0.3, 0.6), color=COLORS["train"])
        if a["redone"] is not None:
            r = a["redone"]
            ax.broken_barh(
                [(r["start_s"], r["end_s"] - r["start_s"])], (y - 0.3, 0.6), color=COLORS["redone"], alpha=0.6
            )
        spans = [(sp["start_s"], max(sp["seconds"], doc["wall_s"] / 500)) for sp in a["saves"]]
        ax.broken_barh(spans, (y - 0.38, 0.76), color=COLORS["save"])
        for n in a["notices"]:
            if n["deadline_s"] is not None:
                end = min(n["deadline_s"], doc["wall_s"])  # drawn up to the last event, not past it
                ax.broken_barh([(n["at_s"], end - n["at_s"])], (y - 0.45, 0.9), color=COLORS["notice"], alpha=0.18)
            ax.vlines(n["at_s"], y - 0.45, y + 0.45, color=COLORS["notice"], linewidth=2.5)
        if a["ended"] is None:
            ax.plot([a["end_s"]], [y], marker="x", color="#000", markersize=10, markeredgewidth=2.5)
    ax.set_yticks(range(len(rows)), [f"attempt {a['attempt']}" for a in reversed(rows)])
    from matplotlib.patches import Patch

    ax.legend(
        handles=[Patch(color=c, label=w) for w, c in _LEGEND] + [Patch(color="none", label=KILLED)],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.32),
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    ax.set_xlabel("seconds since the first start")
    good = 100 * (doc["goodput"] or 0)
    ax.set_title(f"{doc['attempts']} attempt(s), {len(doc['preemptions'])} preemption(s), goodput {good:.1f}%")
    marks = _marks(doc)
    for ax, (name, points) in zip(axes[1:], figures, strict=True):
        for k in sorted({int(p[2]) for p in points}):
            mine = sorted((p[0], p[1]) for p in points if int(p[2]) == k)
            ax.plot(
                [s for s, _ in mine],
                [v for _, v in mine],
                color=ATTEMPT_COLORS[(k - 1) % len(ATTEMPT_COLORS)],
                label=f"attempt {k}",
                marker="." if len(mine) < 30 else None,
            )
        for s in marks:
            ax.axvline(s, color=COLORS["notice"], linestyle="--", linewidth=1.5)
        if log_scale([p[1] for p in points if math.isfinite(p[1])]):
            ax.set_yscale("log")
        ax.set_ylabel(name)
        ax.set_xlabel("step")
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
