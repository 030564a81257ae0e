"""The memory tier on several nodes, for real: torchrun agents on simulated nodes (`preemptible.testing.nodes`),
gloo on CPU, each node's tier a tmpfs in a mount namespace of its own (no other node and not this test sees it: the
test reads a node's tier only by running a process inside that node).

- A node lost: its ranks' parts survive as replicas on its peer; the job, relaunched with a replacement node,
  resumes from memory a step that no durable checkpoint holds, bit-identically.
- A replica whose bytes were damaged on its holder is never used: the job resumes from the next older complete
  memory step.
- A node and its peer lost together (both nodes of a two-node job): the durable root restores, and the journal
  says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_nodes import cluster, finals, launch, reference_digest, wait_for

from conftest import committed_steps
from preemptible.testing.nodes import Cluster, Node
from torchrunkit import EXAMPLE, journals

pytestmark = pytest.mark.timeout(600)  # a detector for a hang, not a speed assertion

STEPS = "1500"

LIST = """
import json, os, sys
tier = sys.argv[1]
out = {}
for name in sorted(os.listdir(tier)):
    if name.startswith("step-") and "." not in name:
        parts = sorted(int(p[5:]) for p in os.listdir(os.path.join(tier, name))
                       if p.startswith("part-") and "." not in p
                       and os.path.exists(os.path.join(tier, name, p, "COMMIT.json")))
        out[int(name[5:])] = parts
print(json.dumps(out))
"""

DAMAGE = """
import os, sys
part = sys.argv[1]
names = [n for n in os.listdir(part) if n.endswith(".safetensors")]
name = max(names, key=lambda n: os.path.getsize(os.path.join(part, n)))
with open(os.path.join(part, name), "r+b") as f:
    f.seek(os.path.getsize(os.path.join(part, name)) - 1)
    b = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([b[0] ^ 0xFF]))
print(name)
"""


def tier_of(node: Node) -> dict[int, list[int]]:
    """The committed parts of each step in ``node``'s tier, read by a process inside the node."""
    done = node.run([sys.executable, "-c", LIST, str(node.memory)])
    assert done.returncode == 0, done.stderr
    return {int(k): v for k, v in json.loads(done.stdout).items()}


def memory_saves(root: Path) -> list[int]:
    """The steps whose memory-tier save rank 0 journaled as protected."""
    ranks = journals(root)
    return [e["step"] for e in ranks.get(0, []) if e["event"] == "save_committed" and e.get("tier") == "memory"]


def stop_processes(node: Node) -> None:
    """Every process of ``node`` SIGKILLed, the node itself (its namespaces, its tier) left standing."""
    for pid in node.pids():
        if pid != node.holder.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def run_until_memory_saves(c: Cluster, root: Path, args: tuple[str, ...], saves: int) -> None:
    launch(c, root, slow=True, nnodes="2:2", script=EXAMPLE, args=args)
    wait_for(lambda: len(memory_saves(root)) >= saves, f"{saves} memory-tier saves", timeout=300)


def node_two_lost(c: Cluster, root: Path, args: tuple[str, ...]) -> tuple[Node, dict[int, list[int]], list[int]]:
    """The job runs until 3 memory saves; then node 2 goes (its tier with it) and the job ends on node 1, whose
    tier stays. Returns node 1, what its tier holds, and the steps complete there (every part: own and replica)."""
    run_until_memory_saves(c, root, args, saves=3)
    one = c.node(1)
    assert list(one.memory.iterdir()) == []  # this test's own namespace does not see the node's tier
    c.down(2)
    stop_processes(one)  # the job ends on the node that stays; a scheduler relaunches it
    held = tier_of(one)
    complete = sorted(s for s, parts in held.items() if parts == [0, 1])
    assert complete, held
    return one, held, complete


def relaunch(c: Cluster, root: Path, args: tuple[str, ...]) -> list[Any]:
    agents = launch(c, root, slow=False, nnodes="2:2", host=1, name="relaunch", script=EXAMPLE, args=args)
    codes = [a.wait(timeout=400) for a in agents]
    assert codes == [0, 0], [a.stderr()[-3000:] for a in agents]
    return agents


def resumes(root: Path) -> dict[int, list[dict[str, Any]]]:
    return {r: [e for e in events if e["event"] in ("resume", "tier_fallback")] for r, events in journals(root).items()}


def test_a_lost_node_comes_back_from_its_peers_memory_bit_identically(tmp_path: Path) -> None:
    """Node 2 goes (its tier with it); node 1 holds node 2's part as a replica. The relaunched job (node 2
    replaced) resumes from memory at a step no durable checkpoint holds: rank 1 fetches its part from rank 0."""
    expected = reference_digest("ddp", 2, tmp_path / "ref")
    root = tmp_path / "ckpt"
    args = ("--steps", STEPS, "--save-every", "1000", "--memory-every", "10")
    with cluster(2, tmp_path) as c:
        _, held, complete = node_two_lost(c, root, args)
        newest = complete[-1]
        assert committed_steps(root) == []  # no durable checkpoint: only memory can give it back
        c.replace(2)
        assert tier_of(c.node(2)) == {}
        agents = relaunch(c, root, args)
    out = "".join(a.stdout() for a in agents)
    assert f"resumed_from={newest}" in out, out[-2000:]
    assert finals(agents) == [expected]
    got = resumes(root)
    for r in (0, 1):
        (resume,) = [e for e in got[r] if e["event"] == "resume"]
        assert (resume["step"], resume["tier"]) == (newest, "memory"), resume
    report = subprocess.run(
        [sys.executable, "-m", "preemptible", "report", str(root)], capture_output=True, text=True, check=False
    )
    assert report.returncode == 0, report.stderr
    assert f"restored step {newest} from the memory tier" in report.stdout, report.stdout
    assert "started fresh (memory could not: the memory tier holds no step on any node)" in report.stdout
    fetched = [e for e in got[1] if e["event"] == "resume"][0]["bytes"]
    assert fetched > 0  # rank 1 read its share: its own part from node 1's replica, the rest from rank 0
    print(f"resumed from memory at step {newest} (held: {held}); rank 1 fetched {fetched} bytes")


def test_a_damaged_replica_is_never_used(tmp_path: Path) -> None:
    """The newest step's replica of node 2's part is damaged on node 1 (one byte): the restore of that step fails
    its checksums on rank 1, every rank learns it, and the job resumes from the next older complete memory step."""
    expected = reference_digest("ddp", 2, tmp_path / "ref")
    root = tmp_path / "ckpt"
    args = ("--steps", STEPS, "--save-every", "1000", "--memory-every", "10")
    with cluster(2, tmp_path) as c:
        one, _, complete = node_two_lost(c, root, args)
        assert len(complete) >= 2, complete  # keep=2: the one before stays
        newest, before = complete[-1], complete[-2]
        part = one.memory / f"step-{newest:012d}" / "part-00001"
        done = one.run([sys.executable, "-c", DAMAGE, str(part)])
        assert done.returncode == 0, done.stderr
        c.replace(2)
        agents = relaunch(c, root, args)
    out = "".join(a.stdout() for a in agents)
    assert f"resumed_from={before}" in out, out[-2000:]
    assert finals(agents) == [expected]
    for r, events in resumes(root).items():
        (resume,) = [e for e in events if e["event"] == "resume"]
        assert (resume["step"], resume["tier"]) == (before, "memory"), (r, resume)
    assert "checksum" in "".join(a.stderr() for a in agents)


def test_a_node_and_its_peer_lost_together_fall_back_to_the_durable_root(tmp_path: Path) -> None:
    """Both nodes of a two-node job go (each the other's peer): no node holds any part. The job resumes from the
    newest durable checkpoint, and each rank's journal says why memory could not."""
    expected = reference_digest("ddp", 2, tmp_path / "ref")
    root = tmp_path / "ckpt"
    args = ("--steps", STEPS, "--save-every", "40", "--memory-every", "10")
    with cluster(2, tmp_path) as c:
        launch(c, root, slow=True, nnodes="2:2", script=EXAMPLE, args=args)
        wait_for(lambda: committed_steps(root) and len(memory_saves(root)) >= 5, "durable and memory saves", 300)
        c.down(1)
        c.down(2)
        durable = committed_steps(root)[-1]
        c.replace(1)
        c.replace(2)
        agents = relaunch(c, root, args)
    out = "".join(a.stdout() for a in agents)
    assert f"resumed_from={durable}" in out, out[-2000:]
    assert finals(agents) == [expected]
    for r, events in resumes(root).items():
        fallback = [e for e in events if e["event"] == "tier_fallback"]
        assert fallback and "holds no step" in fallback[-1]["why"], (r, events)
        assert events[-1]["event"] == "resume" and events[-1]["tier"] == "durable", (r, events)
