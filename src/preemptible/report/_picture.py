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
from typing import Any

from preemptible.report._text import BADPUT_LABELS, commit_and_window, notes

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


_TEMPLATES = {
    "svg.html": """\
{%- macro timeline(t) -%}
<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{{ t.width }}" height="{{ t.height }}">
{%- for row in t.rows -%}
<g class="attempt" data-attempt="{{ row.attempt }}">
<text x="{{ row.label_x }}" y="{{ row.label_y }}" text-anchor="end">attempt {{ row.attempt }}</text>
{%- for r in row.rects -%}
<rect class="{{ r.cls }}" x="{{ r.x }}" y="{{ r.y }}" width="{{ r.w }}" height="{{ r.h }}" fill="{{ r.fill }}"
{%- if r.opacity %} fill-opacity="{{ r.opacity }}"{% endif %}><title>{{ r.title }}</title></rect>
{%- endfor -%}
{%- for n in row.lines -%}
<line class="notice" x1="{{ n.x }}" x2="{{ n.x }}" y1="{{ n.y1 }}" y2="{{ n.y2 }}" stroke="{{ n.color }}" \
stroke-width="3"><title>{{ n.title }}</title></line>
{%- endfor -%}
{%- if row.killed -%}
<path class="killed" d="{{ row.killed }}" stroke="#000" stroke-width="2.5"><title>ended without an exit event \
(killed, or the machine went)</title></path>
{%- endif -%}
</g>
{%- endfor -%}
<line x1="{{ t.left }}" x2="{{ t.axis_end }}" y1="{{ t.axis_y }}" y2="{{ t.axis_y }}" stroke="#555"/>
{%- for tick in t.ticks -%}
<line x1="{{ tick.x }}" x2="{{ tick.x }}" y1="{{ t.axis_y }}" y2="{{ t.axis_y + 5 }}" stroke="#555"/>
<text x="{{ tick.x }}" y="{{ t.axis_y + 18 }}" text-anchor="middle">{{ tick.label }}</text>
{%- endfor -%}
<text x="{{ t.axis_end }}" y="{{ t.axis_y + 34 }}" text-anchor="end">seconds since the first start</text>
</svg>
{%- endmacro -%}
{%- macro figure(f) -%}
<svg class="figure" data-name="{{ f.name }}" xmlns="http://www.w3.org/2000/svg" width="{{ f.width }}" \
height="{{ f.height }}">
<text x="{{ f.left }}" y="16" font-weight="bold">{{ f.name }}{{ " (log scale)" if f.log else "" }}</text>
<line x1="{{ f.left }}" x2="{{ f.right }}" y1="{{ f.bottom }}" y2="{{ f.bottom }}" stroke="#555"/>
<line x1="{{ f.left }}" x2="{{ f.left }}" y1="{{ f.top }}" y2="{{ f.bottom }}" stroke="#555"/>
{%- for tick in f.y_ticks -%}
<text x="{{ f.left - 6 }}" y="{{ tick.y }}" text-anchor="end">{{ tick.label }}</text>
{%- endfor -%}
{%- for tick in f.x_ticks -%}
<text x="{{ tick.x }}" y="{{ f.bottom + 16 }}" text-anchor="middle">{{ tick.label }}</text>
{%- endfor -%}
<text x="{{ f.right }}" y="{{ f.height - 2 }}" text-anchor="end">step</text>
{%- for m in f.marks -%}
<line class="preempted-at" x1="{{ m.x }}" x2="{{ m.x }}" y1="{{ f.top }}" y2="{{ f.bottom }}" stroke="{{ f.notice }}" \
stroke-dasharray="4 3" stroke-width="2"><title>preemption notice at step {{ m.step }}</title></line>
{%- endfor -%}
{%- for line in f.lines -%}
<polyline class="series" data-attempt="{{ line.attempt }}" fill="none" stroke="{{ line.color }}" stroke-width="2" \
points="{{ line.points }}"><title>attempt {{ line.attempt }}</title></polyline>
{%- if line.dot %}<circle cx="{{ line.dot[0] }}" cy="{{ line.dot[1] }}" r="3" fill="{{ line.color }}"/>{% endif -%}
{%- endfor -%}
</svg>
{%- endmacro -%}
""",
    "timeline.html": '{%- from "svg.html" import timeline -%}{{ timeline(t) }}',
    "figure.html": '{%- from "svg.html" import figure -%}{{ figure(f) }}',
    "page.html": """\
{%- from "svg.html" import timeline, figure -%}
<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>preemptible report</title><style>
body{font:14px system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px;margin:0}
h2{font-size:16px;margin-top:28px}.root{color:#666}table{border-collapse:collapse}
td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #eee}svg text{font:12px sans-serif}
.legend span{margin-right:16px}.legend i{display:inline-block;width:12px;height:12px;margin-right:5px;
vertical-align:-1px}.notes{color:#666}</style></head><body>
<h1>preemptible report</h1><p class=root>{{ root }}{% if started %} &middot; first start {{ started }}{% endif %}</p>
<table class=summary>
<tr><th>attempts</th><td id="attempts">{{ attempts }}</td><td id="finished">{{ finished }}</td></tr>
<tr><th>wall time</th><td id="wall">{{ wall }}</td><td>first start to last event</td></tr>
{%- if goodput %}
<tr><th>goodput</th><td id="goodput" data-value="{{ goodput.value }}">{{ goodput.percent }}</td>\
<td>{{ goodput.seconds }} in steps that were kept</td></tr>
{%- for b in badput %}
<tr class="badput" data-key="{{ b.key }}"><th>{{ b.label }}</th><td>{{ b.seconds }}</td><td>{{ b.percent }}</td></tr>
{%- endfor %}
{%- endif %}
</table>
{%- if notes %}<p class=notes>
{%- for n in notes %}{{ n }}{% if not loop.last %}<br>{% endif %}{% endfor -%}
</p>{% endif %}
{%- if t %}
<h2>Timeline</h2><div class=legend>
{%- for w, c in legend %}<span><i style="background:{{ c }}"></i>{{ w }}</span>{% endfor -%}
<span>{{ killed }}</span></div>
{{ timeline(t) }}
{%- endif %}
{%- if figures %}
<h2>Figures logged with run.log</h2><div class=legend>
{%- for k, c in figure_keys %}<span><i style="background:{{ c }}"></i>attempt {{ k }}</span>{% endfor -%}
<span><i style="background:{{ notice }}"></i>a preemption notice (dashed)</span></div>
{%- for f in figures %}{{ figure(f) }}{% endfor %}
{%- endif %}
{%- if preemptions %}
<h2>Preemptions</h2><table class=list><tr><th>attempt</th><th>at</th><th>source</th><th>step</th>\
<th>notice to commit</th><th>window used</th><th>steps lost</th><th>resumed from</th></tr>
{%- for p in preemptions %}
<tr class="preemption"><td>{{ p.attempt }}</td><td>{{ p.at }}</td><td>{{ p.source }}</td><td>{{ p.step }}</td>\
<td>{{ p.commit }}</td><td>{{ p.used }}</td><td>{{ p.steps_lost }}</td><td>{{ p.resumed_from }}</td></tr>
{%- endfor %}
</table>
{%- endif %}
{%- if runs %}
<h2>Runs of steps</h2><table class=list><tr><th>attempt</th><th>steps</th><th>time</th><th>kept</th>\
<th>redone</th><th>saves</th><th>ended</th></tr>
{%- for r in runs %}
<tr class="run"><td>{{ r.attempt }}</td><td>{{ r.steps }}</td><td>{{ r.seconds }}</td><td>{{ r.kept }}</td>\
<td>{{ r.redone }}</td><td>{{ r.saves }}</td><td>{{ r.ended }}</td></tr>
{%- endfor %}
</table>
{%- endif %}
</body></html>
""",
}


def _environment() -> Any:
    import jinja2

    # IMPORTANT: autoescape on, and no |safe or Markup anywhere: every journal value reaches the page as text
    return jinja2.Environment(loader=jinja2.DictLoader(_TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined)


def _ticks(lo: float, hi: float, want: int = 8) -> list[float]:
    """Round tick positions covering [lo, hi] (the ends alone where the span is not a finite positive number)."""
    span = hi / 2 - lo / 2  # halves: a span of -1e308..1e308 does not overflow
    if not span > 0 or not math.isfinite(span):
        return [lo] if lo == hi else [lo, hi]
    raw = 2 * span / want
    if not 0 < raw < math.inf:
        return [lo, hi]
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    try:
        first = math.ceil(lo / step) * step
        count = int((hi - first) / step + 1e-9) + 1
    except (OverflowError, ValueError):
        return [lo, hi]
    return [first + i * step for i in range(min(max(count, 0), 4 * want))]


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    return f"{v:.0f}" if abs(v) < 1e15 and (abs(v) >= 100 or v == int(v)) else f"{v:.3g}"


def _n(v: float) -> str:
    """A coordinate."""
    return f"{v:.1f}" if math.isfinite(v) else "0"


def _rect(x: float, y: float, w: float, h: float, *, cls: str, title: str, fill: str, opacity: str = "") -> Any:
    return {
        "cls": cls,
        "x": _n(x),
        "y": _n(y),
        "w": _n(max(w, 1.5)),
        "h": _n(h),
        "title": title,
        "fill": fill,
        "opacity": opacity,
    }


def _timeline(doc: Mapping[str, Any], width: int = 1000) -> dict[str, Any]:
    rows: Sequence[Mapping[str, Any]] = doc["timeline"]
    left, right, row_h, top = 90, 20, 30, 10
    wall = max(float(doc["wall_s"]), 1e-3)  # a notice's window is drawn up to here (it may reach past the last event)
    scale = (width - left - right) / wall

    def x(t: float) -> float:
        return left + t * scale

    out_rows = []
    for i, a in enumerate(rows):
        y = top + i * row_h
        ready = a["ready_s"] if a["ready_s"] is not None else a["end_s"]
        rects = [
            _rect(
                x(a["start_s"]),
                y + 5,
                (ready - a["start_s"]) * scale,
                20,
                cls="startup",
                title=f"start-up and restore: {ready - a['start_s']:.2f} s",
                fill=COLORS["startup"],
            )
        ]
        if a["ready_s"] is not None:
            rects.append(
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
            rects.append(
                _rect(
                    x(r["start_s"]),
                    y + 5,
                    (r["end_s"] - r["start_s"]) * scale,
                    20,
                    cls="redone",
                    title=f"{r['steps']} step(s) lost, done again by the next attempt",
                    fill=COLORS["redone"],
                    opacity="0.6",
                )
            )
        for sp in a["saves"]:
            what = "background save (stall)" if sp["background"] else f"{sp['reason'] or 'save'}"
            rects.append(
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
        lines = []
        for n in a["notices"]:
            if n["deadline_s"] is not None:
                rects.append(
                    _rect(
                        x(n["at_s"]),
                        y + 1,
                        (_window_end(n, a) - n["at_s"]) * scale,
                        28,
                        cls="window",
                        title=f"the notice's window: {n['deadline_s'] - n['at_s']:.0f} s",
                        fill=COLORS["notice"],
                        opacity="0.18",
                    )
                )
            commit = f", committed after {n['commit_s'] - n['at_s']:.2f} s" if n["commit_s"] is not None else ""
            lines.append(
                {
                    "x": _n(x(n["at_s"])),
                    "y1": y,
                    "y2": y + row_h,
                    "color": COLORS["notice"],
                    "title": f"{n['source']} notice at step {n['step']}{commit}",
                }
            )
        killed = None
        if a["ended"] is None:  # no exit event: the process was killed (or its machine went) without a word
            ex, ey = x(a["end_s"]), y + 15
            killed = f"M{_n(ex - 6)},{ey - 6} L{_n(ex + 6)},{ey + 6} M{_n(ex - 6)},{ey + 6} L{_n(ex + 6)},{ey - 6}"
        out_rows.append(
            {
                "attempt": a["attempt"],
                "label_x": left - 8,
                "label_y": y + 19,
                "rects": rects,
                "lines": lines,
                "killed": killed,
            }
        )
    axis_y = top + row_h * len(rows) + 4
    return {
        "width": width,
        "height": top + row_h * len(rows) + 40,
        "rows": out_rows,
        "left": left,
        "axis_end": width - right,
        "axis_y": axis_y,
        "ticks": [{"x": _n(x(t)), "label": _fmt(t)} for t in _ticks(0.0, wall)],
    }


def _window_end(notice: Mapping[str, Any], attempt: Mapping[str, Any]) -> float:
    """Where a notice's window is drawn to: its deadline, or its attempt's end if that came first (the process was
    gone 0.3 s after the notice: the window is drawn over that attempt, not over the ones after it)."""
    return float(max(notice["at_s"], min(notice["deadline_s"], attempt["end_s"])))


def _drawable(figures: Mapping[str, Sequence[Sequence[float]]]) -> list[tuple[str, Sequence[Sequence[float]]]]:
    """The figures with at least one finite value: a figure with none would be an empty panel."""
    return [(name, pts) for name, pts in figures.items() if any(math.isfinite(p[1]) for p in pts)]


def timeline_svg(doc: Mapping[str, Any], width: int = 1000) -> str:
    """The timeline of the attempts as SVG (one row per attempt)."""
    return str(_environment().get_template("timeline.html").render(t=_timeline(doc, width)))


def _figure(name: str, points: Sequence[Sequence[float]], marks: Sequence[int], width: int = 1000) -> dict[str, Any]:
    left, right, top, bottom, height = 90, 20, 24, 30, 200
    finite = [(p[0], p[1], int(p[2])) for p in points if math.isfinite(p[1])]
    steps = [p[0] for p in finite] + list(marks)
    values = [p[1] for p in finite]
    log = log_scale(values)
    shown = [math.log10(v) for v in values] if log else values
    s_lo, s_hi = (min(steps), max(steps)) if steps else (0.0, 1.0)
    v_lo, v_hi = (min(shown), max(shown)) if shown else (0.0, 1.0)
    if v_hi == v_lo:
        v_lo, v_hi = v_lo - max(1.0, abs(v_lo) / 2), v_hi + max(1.0, abs(v_hi) / 2)
    if s_hi == s_lo:
        s_hi = s_lo + 1
    v_span = v_hi / 2 - v_lo / 2  # halves: values of -1e308 and 1e308 stay finite

    def x(s: float) -> float:
        return left + (s - s_lo) / (s_hi - s_lo) * (width - left - right)

    def y(v: float) -> float:
        u = math.log10(v) if log else v
        return top + (v_hi / 2 - u / 2) / v_span * (height - top - bottom)

    if log:  # a tick at each power of ten
        y_ticks = [{"y": _n(y(10.0**k) + 4), "label": f"1e{k}"} for k in range(math.ceil(v_lo), math.floor(v_hi) + 1)]
    else:
        y_ticks = [{"y": _n(y(v) + 4), "label": _fmt(v)} for v in _ticks(v_lo, v_hi, 4)]
    lines = []
    for k in sorted({p[2] for p in finite}):
        mine = sorted((p[0], p[1]) for p in finite if p[2] == k)
        lines.append(
            {
                "attempt": k,
                "color": ATTEMPT_COLORS[(k - 1) % len(ATTEMPT_COLORS)],
                "points": " ".join(f"{_n(x(s))},{_n(y(v))}" for s, v in mine),
                "dot": (_n(x(mine[0][0])), _n(y(mine[0][1]))) if len(mine) == 1 else None,
            }
        )
    return {
        "name": name,
        "log": log,
        "width": width,
        "height": height,
        "left": left,
        "right": width - right,
        "top": top,
        "bottom": height - bottom,
        "y_ticks": y_ticks,
        "x_ticks": [{"x": _n(x(s)), "label": _fmt(s)} for s in _ticks(s_lo, s_hi, 8)],
        "marks": [{"x": _n(x(s)), "step": s} for s in marks],
        "notice": COLORS["notice"],
        "lines": lines,
    }


def figure_svg(name: str, points: Sequence[Sequence[float]], marks: Sequence[int], width: int = 1000) -> str:
    """One figure over steps: a line per attempt, a dashed line at each step a preemption came at."""
    return str(_environment().get_template("figure.html").render(f=_figure(name, points, marks, width)))


def log_scale(values: Sequence[float]) -> bool:
    """A figure that is positive and spans more than two decades (a loss falling from 1 to 0.001) is drawn on a
    log scale, where its later values stay visible."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > 100


def _marks(doc: Mapping[str, Any]) -> list[int]:
    return sorted({p["step"] for p in doc["preemptions"] if isinstance(p["step"], int)})


def html(doc: Mapping[str, Any], root: str) -> str:
    """The report as one self-contained HTML page, from a template that escapes every value it is given."""
    wall = doc["wall_s"] or 1.0
    goodput = None
    badput = []
    if doc["attempts"]:
        goodput = {
            "value": doc["goodput"],
            "percent": f"{100 * (doc['goodput'] or 0):.1f}%",
            "seconds": f"{doc['goodput_s']:.1f} s",
        }
        for key, label in BADPUT_LABELS.items():
            v = doc["badput_s"][key]
            badput.append({"key": key, "label": label, "seconds": f"{v:.1f} s", "percent": f"{100 * v / wall:.1f}%"})
    preemptions = []
    for p in doc["preemptions"]:
        commit, used = commit_and_window(p)
        preemptions.append(
            {
                "attempt": p["attempt"],
                "at": p["at"],
                "source": f"{p['source']} {p['detail'] or ''}",
                "step": p["step"],
                "commit": commit,
                "used": used,
                "steps_lost": p["steps_lost"],
                "resumed_from": p["resumed_from"],
            }
        )
    runs = [
        {
            "attempt": r["attempt"],
            "steps": f"{r['from_step']}..{r['to_step']}",
            "seconds": f"{r['seconds']:.1f} s",
            "kept": r["kept_steps"],
            "redone": r["redone_steps"],
            "saves": r["saves"],
            "ended": r["ended"],
        }
        for r in doc["runs"]
    ]
    figures = _drawable(doc["figures"])[:MAX_FIGURES]
    attempts = sorted({int(p[2]) for _, pts in figures for p in pts})
    marks = _marks(doc)
    return str(
        _environment()
        .get_template("page.html")
        .render(
            root=root,
            started=doc.get("started"),
            attempts=doc["attempts"],
            finished="finished" if doc.get("finished") else "not finished",
            wall=f"{doc['wall_s']:.1f} s",
            goodput=goodput,
            badput=badput,
            notes=notes(doc),
            t=_timeline(doc) if doc["attempts"] else None,
            legend=_LEGEND,
            killed=KILLED,
            figures=[_figure(name, pts, marks) for name, pts in figures],
            figure_keys=[(k, ATTEMPT_COLORS[(k - 1) % len(ATTEMPT_COLORS)]) for k in attempts],
            notice=COLORS["notice"],
            preemptions=preemptions,
            runs=runs,
        )
    )


PNG_CLIP = 1e100
"""``--png`` draws figure values beyond +-this at +-this (matplotlib's transforms overflow near 1e308) and says so in
the axis label."""


def png(doc: Mapping[str, Any], path: str, fmt: str = "png") -> None:
    """The timeline and the figures as a picture (matplotlib, without pyplot's global state), written at ``path``
    exactly, in ``fmt`` (one of matplotlib's formats: ``png``, ``svg``, ``pdf``, ...).

    Raises:
        ImportError: matplotlib is not installed (``pip install 'preemptible[plot]'``).
    """
    picture(doc).savefig(path, format=fmt)  # the format named: matplotlib never appends a suffix to the path


def picture(doc: Mapping[str, Any]) -> Any:
    """The matplotlib ``Figure`` `png` writes: the timeline, its legend beside it (never over an axis label), and one
    panel per figure that has a value to draw."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figures = _drawable(doc["figures"])[: MAX_FIGURES // 2]
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
                end = _window_end(n, a)
                ax.broken_barh([(n["at_s"], end - n["at_s"])], (y - 0.45, 0.9), color=COLORS["notice"], alpha=0.18)
            ax.vlines(n["at_s"], y - 0.45, y + 0.45, color=COLORS["notice"], linewidth=2.5)
        if a["ended"] is None:
            ax.plot([a["end_s"]], [y], marker="x", color="#000", markersize=10, markeredgewidth=2.5)
    ax.set_yticks(range(len(rows)), [f"attempt {a['attempt']}" for a in reversed(rows)])
    from matplotlib.patches import Patch

    ax.legend(
        handles=[Patch(color=c, label=w) for w, c in _LEGEND] + [Patch(color="none", label=KILLED)],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),  # beside the timeline: below it, it covered the axis label
        ncol=1,
        fontsize=8,
        frameon=False,
    )
    ax.set_xlabel("seconds since the first start")
    good = 100 * (doc["goodput"] or 0)
    ax.set_title(f"{doc['attempts']} attempt(s), {len(doc['preemptions'])} preemption(s), goodput {good:.1f}%")
    marks = _marks(doc)
    for ax, (name, given) in zip(axes[1:], figures, strict=True):
        points = [(p[0], max(-PNG_CLIP, min(PNG_CLIP, p[1])), p[2]) for p in given if math.isfinite(p[1])]
        clipped = any(abs(p[1]) > PNG_CLIP for p in given if math.isfinite(p[1]))
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
        label = f"{name} (clipped to ±{PNG_CLIP:.0e})" if clipped else name
        ax.set_ylabel(label, parse_math=False)  # a name's "$" is text, not a formula to parse
        ax.set_xlabel("step")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
