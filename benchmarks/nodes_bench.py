"""Multi-node recovery, measured: 2 simulated nodes, 1 rank each, gloo on CPU, preemptible against torchrun alone
with the user's own periodic DCP saves (benchmarks/nodes_dcp_train.py). A benchmark, not a test: nothing here
gates CI on time.

    PYTHONPATH=src .venv/bin/python benchmarks/nodes_bench.py            # 3 interleaved rounds, about 16 minutes
    PYTHONPATH=src .venv/bin/python benchmarks/nodes_bench.py --quick    # 1 round, about 5 minutes
    PYTHONPATH=src .venv/bin/python benchmarks/nodes_bench.py --show benchmarks/results/nodes-2026-12-05.json

As root (network namespaces: `preemptible.testing.nodes`, the harness of tests/e2e/test_nodes.py; every packet
stays on loopback or inside the cluster's namespaces, node i at 10.77.0.<i>). The result JSON (machine, date,
command, settings, every run, medians, ratios) goes to benchmarks/results/nodes-<date>.json (``--out`` to change).

Both contenders train examples/train_ddp.py's model (``--hidden 65536``: 1.18M parameters; with AdamW's two
moments a 14 MB checkpoint) under one torchrun agent per node (c10d rendezvous hosted by node 1, ``--max-restarts
3``, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` for both: without it a replacement node never joins), a periodic
save every 40 steps, and the event comes once rank 0 has printed step 100 (20 steps past the save at 80: the mean
loss of a failure at a random time). Scenarios, each run once per round in this order (interleaved):

- **A, a notice to node 2 only** (``--nnodes 2:2``). preemptible: AWS's notice served by node 2's metadata
  emulator; every rank commits an emergency save at one step, node 2's agent leaves, node 1's rank exits 76 and its
  agent restarts. The baseline cannot see AWS's notice: node 2 goes at the end of a 30 s window (AWS gives 120 s;
  scaled down here), and the survivor's collective hangs until gloo's timeout, or until torchrun's agent restarts
  its workers because a new node waits in the rendezvous (once the lost node's keep-alives have lapsed). In both,
  node 2 goes the same way (cut off, then its processes SIGKILLed: no FIN) once its agent has left (preemptible) or
  at the window's end (baseline), and a replacement comes up at once: node 3, a new address as a cloud's new VM
  has (a node at the old address would answer the survivor's retransmissions with a reset and end its hung
  collective at once), joining the same rendezvous endpoint.
- **B, node 2 lost without notice** (``--nnodes 1:2``): cut off, then SIGKILLed. preemptible finds it within
  ``PREEMPTIBLE_PEER_TIMEOUT_S=20`` (its detection bound is that setting); the baseline within gloo's timeout,
  set to 60 s here (``init_process_group("gloo", timeout=timedelta(seconds=60))``; a user who sets nothing waits
  torch's default, 30 minutes). Node 1's agent restarts alone into a 1-node round, which torchrun completes after
  its ``last_call_timeout`` (30 s, its default) for both.

Measured per run, from the notice (A) or the loss (B), on the wall clock of the harness and the ranks (one machine):
commit (preemptible's emergency ``save_committed``; also from the notice as a rank saw it, AWS being polled once a
second: ``preemptible report``'s ``notice_to_commit_s``), detection (``peer_lost``; the baseline's collective error or
the agent's restart), resumed (every rank's restore done: preemptible's ``restored`` events, the baseline's own
line after ``dcp.load``), first step (the harness sees rank 0's first step line after the restart), steps lost
(steps completed before the restart minus the step resumed from), bytes each rank read on resume (preemptible:
its ``restored`` event's ``bytes_read``; the baseline: ``rchar`` across ``dcp.load``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_suite import machine  # the one description of this machine the benchmarks record
from preemptible.testing.nodes import Cluster, Node, NodeEmulator, node_env, torchrun_argv

REPO = Path(__file__).resolve().parents[1]
PREEMPTIBLE_SCRIPT = REPO / "examples" / "train_ddp.py"
BASELINE_SCRIPT = REPO / "benchmarks" / "nodes_dcp_train.py"

HIDDEN = 65536  # examples/train_ddp.py's --hidden: Linear(16, H), Linear(H, 1), AdamW
SAVE_EVERY = 40  # preemptible's --save-every, and the baseline's DCP cadence
TRIGGER_STEP = 100  # the notice (A) or the loss (B) once rank 0 printed this step
WINDOW_S = 30.0  # A, baseline: the node goes this long after the notice (AWS: 120 s)
GLOO_TIMEOUT_S = 60.0  # the baseline's init_process_group(timeout=); torch's default for gloo: 1800 s
GLOO_DEFAULT_S = 1800.0
PEER_TIMEOUT_S = 20.0  # preemptible's PREEMPTIBLE_PEER_TIMEOUT_S
STEPS = 1_000_000  # never reached: each run ends once the job has resumed
CASE_TIMEOUT_S = 300.0  # a run that has not resumed by then is recorded as failed
POLL_S = 0.05
TOOLS = ("preemptible", "baseline")
SCENARIOS = ("A", "B")
_DROP = ("SLURM_", "KUBERNETES_", "PREEMPTIBLE_", "TORCHELASTIC_", "AWS_", "GCE_", "AZURE_", "GOOGLE_")
_STEP = re.compile(r"^step (\d+) ")
_RESTORED = re.compile(r"^restored rank=(\d+) step=(\d+) bytes_read=(\d+) seconds=([\d.]+) t=([\d.]+)")
_FAILED = re.compile(r"^collective_failed t=([\d.]+) (.*)")


class Tail:
    """The lines of a file another process appends to, each with the harness's time when it was first seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[tuple[float, str]] = []
        self._offset = 0
        self._partial = b""

    def poll(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        if not data:
            return
        now = time.time()
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        self.lines += [(now, line.decode("utf-8", "replace")) for line in complete]

    def text(self, n: int = 40) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


class Agent:
    """One node's torchrun agent; its output in files of the run's log directory (a node's scratch dies with it)."""

    def __init__(self, node: Node, argv: list[str], env: dict[str, str], logs: Path, label: str) -> None:
        self.node = node
        self.label = label
        self.out = Tail(logs / f"node{node.index}.{label}.out")
        self.err = Tail(logs / f"node{node.index}.{label}.err")
        with self.out.path.open("w") as out, self.err.path.open("w") as err:
            self.proc = node.popen(argv, env=env, stdout=out, stderr=err)
        self.exited_at: float | None = None

    def poll(self) -> None:
        self.out.poll()
        self.err.poll()
        if self.exited_at is None and self.proc.poll() is not None:
            self.exited_at = time.time()


def base_env() -> dict[str, str]:
    """This process's environment without scheduler, cloud or preemptible settings; ``src`` on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    src = str(REPO / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)])
    env.update(
        PYTHONUNBUFFERED="1",
        LOGLEVEL="INFO",  # the agents' INFO lines say why they restart
        OMP_NUM_THREADS="1",
        PREEMPTIBLE_DMI_DIR="/nonexistent/nodes-bench-dmi",  # no cloud guessed from this machine's DMI
        PREEMPTIBLE_SOURCES="signal",
    )
    return env


class Case:
    """One run of one scenario with one tool, on a cluster of its own (see the module's docstring)."""

    def __init__(self, tool: str, scenario: str, work: Path) -> None:
        self.tool, self.scenario = tool, scenario
        self.base = work
        self.root = work / "ckpt"
        self.logs = work / "logs"
        self.logs.mkdir(parents=True)
        self.agents: dict[str, Agent] = {}
        self.emulators: dict[int, NodeEmulator] = {}
        self.endpoint = ""

    # launching ----------------------------------------------------------------------------------------------
    def launch(self, c: Cluster, index: int, label: str, *, notices: bool) -> Agent:
        node = c.node(index)
        script = PREEMPTIBLE_SCRIPT if self.tool == "preemptible" else BASELINE_SCRIPT
        args = ["--root", str(self.root), "--steps", str(STEPS), "--save-every", str(SAVE_EVERY)]
        args += ["--hidden", str(HIDDEN)]
        extra = {"MASTER_ADDR": c.node(1).addr}
        if self.tool == "baseline":
            args += ["--gloo-timeout", str(GLOO_TIMEOUT_S)]
        else:
            extra["PREEMPTIBLE_PEER_TIMEOUT_S"] = str(PEER_TIMEOUT_S)
            if notices:
                extra["PREEMPTIBLE_SOURCES"] = "signal,aws"
                extra["PREEMPTIBLE_AWS_ENDPOINT"] = self.emulators[index].url
        argv = torchrun_argv(
            node,
            endpoint=self.endpoint,
            rdzv_id="job",
            nnodes="2:2" if self.scenario == "A" else "1:2",
            hosts_store=index == 1,
            max_restarts=3,
            script=[str(script), *args],
        )
        agent = Agent(node, argv, node_env(node, base_env(), **extra), self.logs, label)
        self.agents[label] = agent
        return agent

    def poll(self) -> None:
        for a in self.agents.values():
            a.poll()

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            got = predicate()
            if got:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.tool} {self.scenario}: never {what} within {timeout:.0f} s")
            time.sleep(POLL_S)

    # what the processes said --------------------------------------------------------------------------------
    def steps(self) -> list[tuple[float, int]]:
        """Rank 0's step lines (the harness's time, the step index), in order (rank 0 is on node 1)."""
        return [(t, int(m.group(1))) for t, line in self.agents["first"].out.lines if (m := _STEP.match(line))]

    def journals(self) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        for path in sorted((self.root / "journal").glob("*.jsonl")):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    e = json.loads(line)
                    e["_t"] = datetime.datetime.fromisoformat(e["t"].replace("Z", "+00:00")).timestamp()
                    out.setdefault(int(e["rank"]), []).append(e)
        return out

    def restored(self, since: float) -> dict[int, dict[str, Any]]:
        """Each rank's restore after ``since``: step, seconds (epoch) and bytes read."""
        got: dict[int, dict[str, Any]] = {}
        if self.tool == "preemptible":
            for rank, events in self.journals().items():
                for e in events:
                    if e["event"] == "restored" and e["_t"] > since:
                        got[rank] = {"step": e["step"], "t": e["_t"], "bytes": e.get("bytes_read")}
            return got
        for agent in self.agents.values():  # the baseline prints it on every rank
            for _, line in agent.out.lines:
                m = _RESTORED.match(line)
                if m and float(m.group(5)) > since:
                    got[int(m.group(1))] = {"step": int(m.group(2)), "t": float(m.group(5)), "bytes": int(m.group(3))}
        return got

    def resumed(self, since: float, world: int) -> tuple[dict[int, dict[str, Any]], float] | None:
        """Every rank's restore after ``since`` and the harness's time of rank 0's first step after it."""
        got = self.restored(since)
        if len(got) < world:
            return None
        first = [t for t, s in self.steps() if s == got[0]["step"] and t > got[0]["t"]]
        return (got, first[0]) if first else None

    # the run ------------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tool": self.tool, "scenario": self.scenario, "loadavg_at_start": os.getloadavg()}
        with Cluster(2, self.base / "cluster") as c:
            if self.tool == "preemptible" and self.scenario == "A":
                self.emulators = {n.index: NodeEmulator(n, "aws", env=node_env(n, base_env())) for n in c}
            self.endpoint = f"{c.node(1).addr}:{c.node(1).free_port()}"
            notices = bool(self.emulators)
            launched = time.time()
            self.launch(c, 1, "first", notices=notices)
            self.launch(c, 2, "second", notices=notices)
            self.wait(lambda: any(s >= TRIGGER_STEP for _, s in self.steps()), f"step {TRIGGER_STEP}", 240)
            steps = self.steps()
            out["start_to_trigger_s"] = round(steps[-1][0] - launched, 2)
            mid = [t for t, s in steps if s >= TRIGGER_STEP // 2]
            out["step_s"] = round((mid[-1] - mid[0]) / max(len(mid) - 1, 1), 4)
            t0 = time.time()
            out["trigger_step"] = steps[-1][1]
            if self.scenario == "A" and self.tool == "preemptible":
                self.emulators[2].notice()
                second = self.agents["second"]
                self.wait(lambda: second.exited_at is not None, "node 2's agent left", 120)
                assert second.exited_at is not None
                gone = second.exited_at  # the VM may go once its agent has left
            elif self.scenario == "A":
                self.wait(lambda: time.time() >= t0 + WINDOW_S, "the window's end", WINDOW_S + 5)
                gone = time.time()
            else:
                gone = t0
            c.cut(2)  # the node vanishes: not a packet more, not even a FIN
            c.down(2)  # its processes SIGKILLed, its scratch deleted
            out["node_gone_s"] = round(gone - t0, 3)
            if self.scenario == "A":
                # a new VM with a new address, as a cloud gives (one at 10.77.0.2 again would answer the survivor's
                # retransmissions to the old node with a reset, and end its hung collective at once)
                c.replace(3)
                self.launch(c, 3, "replacement", notices=False)
            world = 2 if self.scenario == "A" else 1
            done = self.wait(lambda: self.resumed(t0, world), "resumed", CASE_TIMEOUT_S)
            self.poll()
            out.update(self.measure(t0, gone, *done))
        return out

    def measure(self, t0: float, gone: float, restored: dict[int, dict[str, Any]], first: float) -> dict[str, Any]:
        resumed_from = restored[0]["step"]
        lines = self.steps()
        at = next(i for i, (t, s) in enumerate(lines) if s == resumed_from and t > restored[0]["t"])
        before = lines[at - 1][1] + 1 if at > 0 else 0  # steps completed before the restart (indices from 0)
        m: dict[str, Any] = {
            "resumed_from": resumed_from,
            "steps_done_before_restart": before,
            "steps_lost": before - resumed_from,
            "resumed_s": round(max(r["t"] for r in restored.values()) - t0, 3),
            "first_step_s": round(first - t0, 3),
            "gone_to_resumed_s": round(max(r["t"] for r in restored.values()) - gone, 3),
            "bytes_read": [restored[r]["bytes"] for r in sorted(restored)],
        }
        survivor = self.agents["first"]
        restarts = [(t, line) for t, line in survivor.err.lines if "restart worker group" in line]
        m["agent_restarts"] = [line.split("]", 1)[-1].strip()[:160] for _, line in restarts]
        if self.tool == "preemptible":
            ranks = self.journals()
            rank0 = ranks.get(0, [])
            if self.scenario == "A":
                commits = [
                    e
                    for e in rank0
                    if e["event"] == "save_committed" and e.get("reason") == "emergency" and e["_t"] > t0
                ]
                m["commit_s"] = round(commits[0]["_t"] - t0, 3) if commits else None
                m["stop_step"] = commits[0]["step"] if commits else None
                m["report_notice_to_commit_s"] = self.report_notice_to_commit()
            exits = [e for e in rank0 if e["event"] == "exit" and e["_t"] > t0]
            m["survivor_exit"] = {k: exits[0].get(k) for k in ("code", "reason", "saved", "step")} if exits else None
            lost = [e for e in rank0 if e["event"] == "peer_lost" and e["_t"] > t0]
            if lost:
                m["detected_s"] = round(lost[0]["_t"] - t0, 3)
                m["detected_how"] = f"peer_lost (stalled {lost[0].get('stalled_s')} s; {lost[0].get('how')})"
                m["survivor_exit"] = {"code": lost[0].get("code"), "reason": "peer_lost", "step": lost[0]["step"]}
        else:
            failed = [(float(g.group(1)), g.group(2)) for _, line in survivor.err.lines if (g := _FAILED.match(line))]
            failed = [f for f in failed if f[0] > t0]
            if failed:
                m["detected_s"] = round(failed[0][0] - t0, 3)
                m["detected_how"] = f"rank 0's collective raised: {failed[0][1][:200]}"
            elif restarts:
                m["detected_s"] = round(restarts[0][0] - t0, 3)
                m["detected_how"] = "no collective error: node 1's agent restarted its workers (" + (
                    restarts[0][1].split("]", 1)[-1].strip()[:160] + ")"
                )
        return m

    def report_notice_to_commit(self) -> float | None:
        from preemptible import report
        from preemptible.store.io import storage_for

        try:
            doc = report.report(storage_for(str(self.root)))
            value = doc["preemptions"][0]["notice_to_commit_s"]
            return float(value) if value is not None else None
        except (LookupError, TypeError, ValueError, OSError):
            return None

    def tails(self) -> str:
        self.poll()
        return "\n".join(
            f"--- {label} (node {a.node.index}) stdout:\n{a.out.text(8)}\n--- stderr:\n{a.err.text(25)}"
            for label, a in self.agents.items()
        )


def checkpoint_bytes(work: Path) -> dict[str, int]:
    """The bytes of one committed step of each tool, from the runs' roots (before they are deleted)."""
    out: dict[str, int] = {}
    for tool, pattern in (("preemptible", "step-*/COMMIT.json"), ("baseline", "step-*/DONE")):
        for marker in sorted(work.glob(f"*-{tool}/ckpt/{pattern}")):
            out[tool] = sum(p.stat().st_size for p in marker.parent.rglob("*") if p.is_file())
            break
    return out


METRICS = (
    ("commit_s", "notice -> committed s"),
    ("report_notice_to_commit_s", "seen -> committed s"),
    ("detected_s", "event -> detected s"),
    ("node_gone_s", "event -> node gone s"),
    ("resumed_s", "event -> resumed s"),
    ("first_step_s", "event -> first step s"),
    ("gone_to_resumed_s", "node gone -> resumed s"),
    ("steps_lost", "steps lost"),
    ("step_s", "s per step before"),
)


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sc in SCENARIOS:
        for tool in TOOLS:
            sel = [r for r in runs if r["tool"] == tool and r["scenario"] == sc and "error" not in r]
            if not sel:
                continue
            med = {k: median(sel, k) for k, _ in METRICS}
            ranks = max(len(r["bytes_read"]) for r in sel)
            med["bytes_read"] = [
                statistics.median(r["bytes_read"][k] for r in sel if len(r["bytes_read"]) > k) for k in range(ranks)
            ]
            med["runs"] = len(sel)
            out[f"{sc}/{tool}"] = med
        p, b = out.get(f"{sc}/preemptible"), out.get(f"{sc}/baseline")
        if p and b:
            out[f"{sc}/ratio baseline/preemptible"] = {
                k: round(b[k] / p[k], 2) if p.get(k) and b.get(k) is not None else None
                for k in ("detected_s", "resumed_s", "first_step_s", "gone_to_resumed_s")
            }
    return out


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def table(runs: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """One row per figure, one column per scenario and tool: the median, then each run in brackets."""
    cols = [(sc, tool) for sc in SCENARIOS for tool in TOOLS if f"{sc}/{tool}" in summary]
    width = 28
    rows = [f"{'':<24}" + "".join(f"{sc + ' ' + tool:>{width}}" for sc, tool in cols)]
    for key, label in METRICS:
        cells = []
        for sc, tool in cols:
            each = [r for r in runs if r["tool"] == tool and r["scenario"] == sc and "error" not in r]
            cells.append(f"{fmt(summary[f'{sc}/{tool}'][key])} ({'/'.join(fmt(r.get(key)) for r in each)})")
        rows.append(f"{label:<24}" + "".join(f"{c:>{width}}" for c in cells))
    cells = []
    for sc, tool in cols:
        each = [r for r in runs if r["tool"] == tool and r["scenario"] == sc and "error" not in r]
        med = summary[f"{sc}/{tool}"]["bytes_read"]
        cells.append("/".join(f"{b / 1e6:.2f}" for b in med) + f" ({len(each)} runs)")
    rows.append(f"{'MB read per rank':<24}" + "".join(f"{c:>{width}}" for c in cells))
    for sc in SCENARIOS:
        ratio = summary.get(f"{sc}/ratio baseline/preemptible")
        if ratio:
            shown = ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items() if v is not None)
            rows.append(f"{sc}: baseline / preemptible (medians): {shown}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 round")
    ap.add_argument("--only", default="", help="comma-separated cases to run, e.g. A/preemptible,B/baseline")
    ap.add_argument("--dir", default=None, help="where the runs' roots and logs go (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the roots and logs")
    ap.add_argument("--out", default=None, help="the result JSON (default: benchmarks/results/nodes-<date>.json)")
    ap.add_argument("--show", default=None, metavar="JSON", help="print the table of an earlier result and exit")
    args = ap.parse_args(argv)
    if args.show:
        shown = json.loads(Path(args.show).read_text())
        print(table(shown["runs"], summarize(shown["runs"])))
        return 0
    rounds = 1 if args.quick else args.rounds
    only = {x for x in args.only.split(",") if x}
    started = time.monotonic()
    now = datetime.datetime.now(datetime.timezone.utc)
    out_path = Path(args.out) if args.out else REPO / "benchmarks" / "results" / f"nodes-{now:%Y-%m-%d}.json"
    import torch

    import preemptible

    params = 16 * HIDDEN + HIDDEN + HIDDEN + 1
    doc: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv],
        "torch": torch.__version__,
        "preemptible": preemptible.__version__,
        "machine": machine(),
        "loadavg_at_start": os.getloadavg(),
        "settings": {
            "nodes": 2,
            "ranks_per_node": 1,
            "backend": "gloo (CPU)",
            "model": f"examples/train_ddp.py --hidden {HIDDEN}: {params} parameters, AdamW",
            "save_every": SAVE_EVERY,
            "trigger_step": TRIGGER_STEP,
            "window_s (A, baseline)": WINDOW_S,
            "aws_window_s": 120.0,
            "gloo_timeout_s (baseline)": GLOO_TIMEOUT_S,
            "gloo_timeout_default_s": GLOO_DEFAULT_S,
            "peer_timeout_s (preemptible)": PEER_TIMEOUT_S,
            "torchrun": "c10d rendezvous on node 1, --max-restarts 3, A: --nnodes 2:2, B: --nnodes 1:2, defaults "
            "otherwise (last_call_timeout 30 s); TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
            "rounds": rounds,
        },
        "runs": [],
    }
    work = Path(tempfile.mkdtemp(prefix="nodes-bench-", dir=args.dir))
    print(f"nodes_bench: {rounds} round(s); work in {work}; result to {out_path}", flush=True)
    runs: list[dict[str, Any]] = doc["runs"]
    try:
        for rnd in range(rounds):
            for sc in SCENARIOS:
                for tool in TOOLS:
                    if only and f"{sc}/{tool}" not in only:
                        continue
                    case = Case(tool, sc, work / f"{rnd}-{sc}-{tool}")
                    t = time.monotonic()
                    try:
                        res = case.run()
                    except (TimeoutError, AssertionError, RuntimeError, OSError, StopIteration) as e:
                        res = {"tool": tool, "scenario": sc, "error": f"{type(e).__name__}: {e}"}
                        print(f"  {sc}/{tool} round {rnd + 1} FAILED: {e}\n{case.tails()}", flush=True)
                    res["round"] = rnd + 1
                    res["wall_s"] = round(time.monotonic() - t, 1)
                    runs.append(res)
                    shown = {k: res.get(k) for k in ("detected_s", "commit_s", "resumed_s", "steps_lost")}
                    print(f"  round {rnd + 1} {sc}/{tool}: {shown} ({res['wall_s']} s)", flush=True)
                    out_path.parent.mkdir(parents=True, exist_ok=True)
                    out_path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        doc["checkpoint_bytes"] = checkpoint_bytes(work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    doc["summary"] = summarize(runs)
    doc["seconds"] = round(time.monotonic() - started, 1)
    doc["loadavg_at_end"] = os.getloadavg()
    out_path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(table(runs, doc["summary"]))
    print(f"checkpoint bytes (one step): {doc['checkpoint_bytes']}; {doc['seconds']} s; result in {out_path}")
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
