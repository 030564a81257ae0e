"""What a drill found: its checks, its timings, as text and as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class DrillReport:
    source: str
    window_s: float
    command: list[str]
    checks: list[Check] = field(default_factory=list)
    timings: dict[str, float | None] = field(default_factory=dict)
    checkpoint_step: int | None = None
    resumed_step: int | None = None
    root: str | None = None
    mode: str = "notice"
    """``notice``, or ``kill`` for a crash rehearsal (SIGKILL, no notice: no emergency save, no window)."""
    moment: dict[str, Any] = field(default_factory=dict)
    """When the stop came: ``{"aim": "mid-epoch", "step", "epoch", "batches_done", "epoch_batches"}`` or
    ``{"aim": "seconds", "at_s"}`` (with ``why`` when the mid-epoch aim fell back to seconds)."""
    steps_lost: int | None = None
    """A crash rehearsal's steps redone after the restart: completed when killed, less the step resumed at."""
    first_differing_step: dict[str, Any] | None = None
    """With ``--reference``: the first step whose logged figures differ (`preemptible.drill.Divergence`)."""
    node_count: int | None = None
    """With ``--nodes``: how many simulated nodes; the notice went to the last one."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """With ``--nodes``: each node's exits at the notice: ``node``, ``addr``, ``hosts_store``, ``role``
    (``reclaimed``/``survivor``), ``ranks`` (``rank``, ``code``), ``agent_exit`` (the reclaimed node's agent),
    ``replaced``, ``detail``."""

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def notice_to_exit_s(self) -> float | None:
        return self.timings.get("notice_to_exit_s")

    def check(self, name: str, passed: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, passed, detail))
        return passed

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "mode": self.mode,
            "source": self.source,
            "window_s": self.window_s,
            "notice_to_exit_s": self.notice_to_exit_s,
            "checkpoint_step": self.checkpoint_step,
            "resumed_step": self.resumed_step,
            "root": self.root,
            "moment": self.moment,
            "steps_lost": self.steps_lost,
            "first_differing_step": self.first_differing_step,
            "node_count": self.node_count,
            "nodes": self.nodes,
            "timings": self.timings,
            "checks": [asdict(c) for c in self.checks],
            "command": self.command,
        }

    def render(self) -> str:
        width = max((len(c.name) for c in self.checks), default=10)
        if self.mode == "kill":
            lines = ["preemptible drill: crash rehearsal (SIGKILL, no notice, no emergency save)"]
        elif self.node_count is not None:
            lines = [
                f"preemptible drill: {self.source} notice to node {self.node_count} of {self.node_count} simulated "
                f"nodes, {self.window_s:g} s window"
            ]
        else:
            lines = [f"preemptible drill: {self.source} notice, {self.window_s:g} s window"]
        if self.moment:
            lines.append(f"  stop: {self.describe_moment()}")
        lines.append("")
        for c in self.checks:
            lines.append(f"  {'PASS' if c.passed else 'FAIL'}  {c.name.ljust(width)}  {c.detail}")
        lines.append("")
        names = {
            "notice_to_boundary_s": "notice -> step boundary",
            "notice_to_commit_s": "notice -> checkpoint committed",
            "notice_to_exit_s": "notice -> process exited",
            "restart_to_resumed_s": "restart -> training again",
        }
        for key, label in names.items():
            value = self.timings.get(key)
            if value is not None:
                share = f"  ({100 * value / self.window_s:.0f}% of the window)" if key != "restart_to_resumed_s" else ""
                lines.append(f"  {label:32s} {value:8.2f} s{share}")
        if self.steps_lost is not None:
            lines.append(f"  {'steps lost (redone)':32s} {self.steps_lost:8d}")
        if self.nodes:
            lines += ["", "  exit codes at the notice, node by node:"]
            for n in self.nodes:
                store = "store host" if n.get("hosts_store") else ""
                lines.append(
                    f"    node {n['node']}  {n['addr']:10s}  {store:10s}  {n.get('role') or '?':9s}  {n['detail']}"
                )
        lines += [
            "",
            f"{'PASSED' if self.passed else 'FAILED'}: {sum(c.passed for c in self.checks)}/{len(self.checks)} checks",
        ]
        return "\n".join(lines)

    def describe_moment(self) -> str:
        m = self.moment
        if m.get("aim") == "mid-epoch":
            return (
                f"mid-epoch: epoch {m.get('epoch')} (0-based, as run.epochs counts), after {m.get('batches_done')} "
                f"of {m.get('epoch_batches')} batches (step {m.get('step')})"
            )
        if m.get("aim") == "first-save":
            return f"once the first checkpoint committed (step {m.get('step')})"
        why = f" ({m['why']})" if m.get("why") else ""
        return f"{m.get('at_s', 0):g} s into the loop{why}"
