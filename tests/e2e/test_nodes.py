"""Several nodes for real: one torchrun agent per simulated node (network namespaces of the test's own, see
`preemptible.testing.nodes`), c10d rendezvous, gloo on CPU, a shared durable root.

Every packet stays inside namespaces the test creates: node ``i`` is ``10.77.0.<i>`` on a bridge in the test's
namespace, and its metadata emulator listens on the node's own loopback. Where namespaces cannot be made the tests
skip and say why (under ``CI=true`` they fail).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import clean_env, committed_steps, final_digest
from preemptible.emergency import EXIT_PEER_NODE
from preemptible.testing.nodes import (
    SUBNET,
    Cluster,
    NamespacesUnavailable,
    Node,
    Socket,
    netns_of,
    node_env,
    sockets_of,
    torchrun_argv,
)
from torchrunkit import EXAMPLE, FSDP, journals, last

STEPS = 1500  # the notice lands long before: AWS is polled once a second
ARGS = ("--steps", str(STEPS), "--save-every", "40")
SLOW = ("--step-time", "0.02")
PEER_TIMEOUT_S = 20.0  # scenario 3's detection bound: generous for a loaded machine, far below gloo's 30 minutes
NOTICE = "import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], method='POST'))"


def cluster(nodes: int, base: Path) -> Cluster:
    try:
        return Cluster(nodes, base)
    except NamespacesUnavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the multi-node tests must run in CI, but: {e}")
        pytest.skip(f"no network namespaces: {e}")


class Emulator:
    """The AWS metadata emulator of one node, on that node's own loopback."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.proc = node.popen(
            [sys.executable, "-m", "preemptible", "emulate", "aws"],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in first, first
        self.url = first.split("listening on ", 1)[1].strip()

    def notice(self) -> None:
        done = self.node.run([sys.executable, "-c", NOTICE, f"{self.url}/_emulator/notice"], env=clean_env())
        assert done.returncode == 0, done.stderr


class Agent:
    """One node's torchrun agent; its output goes to ``logs/node<i>.<name>.out`` and ``.err`` beside the nodes'
    scratch directories (a relaunch takes another ``name``, so the first launch's logs stay for diagnose's
    fixtures, tests/corpus/diagnose/harness)."""

    def __init__(
        self,
        node: Node,
        root: Path,
        endpoint: str,
        *,
        hosts_store: bool,
        env: dict[str, str],
        nnodes: str = "1:2",
        max_restarts: int = 3,
        name: str = "agent",
        script: Path = EXAMPLE,
        args: tuple[str, ...] = ARGS,
        rdzv_conf: dict[str, str] | None = None,
    ) -> None:
        self.node = node
        logs = node.scratch.parent / "logs"  # kept when the node goes (its scratch directory does not survive it)
        logs.mkdir(exist_ok=True)
        self.out = logs / f"node{node.index}.{name}.out"
        self.err = logs / f"node{node.index}.{name}.err"
        argv = torchrun_argv(
            node,
            endpoint=endpoint,
            rdzv_id="job",
            nnodes=nnodes,
            hosts_store=hosts_store,
            max_restarts=max_restarts,
            script=[str(script), "--root", str(root), *args, *env.pop("_args", "").split()],
            rdzv_conf=rdzv_conf,
        )
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = node.popen(argv, env=node_env(node, clean_env(**env)), stdout=out, stderr=err)
        self.endpoint = endpoint

    def wait(self, timeout: float = 180) -> int:
        return self.proc.wait(timeout=timeout)

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()


def launch(
    c: Cluster,
    root: Path,
    *,
    slow: bool,
    sources: dict[int, Emulator] | None = None,
    host: int = 1,
    only: list[int] | None = None,
    endpoint: str | None = None,
    env: dict[str, str] | None = None,
    **agent: Any,
) -> list[Agent]:
    """The nodes' agents (``only`` those), node ``host`` hosting the c10d store at ``endpoint`` (a new port on
    it by default)."""
    endpoint = endpoint or f"{c.node(host).addr}:{c.node(host).free_port()}"
    agents = []
    for node in c:
        if only is not None and node.index not in only:
            continue
        env_ = {"MASTER_ADDR": c.node(host).addr, "LOGLEVEL": "INFO", **(env or {})}
        if sources:
            env_.update(PREEMPTIBLE_SOURCES="signal,aws", PREEMPTIBLE_AWS_ENDPOINT=sources[node.index].url)
        if slow:
            env_["_args"] = " ".join(SLOW)
        agents.append(Agent(node, root, endpoint, hosts_store=node.index == host, env=env_, **agent))
    return agents


def finals(agents: list[Agent]) -> list[str]:
    return [final_digest(a.stdout()) for a in agents if "final " in a.stdout()]


class Audit:
    """Every TCP socket of every harness process seen while it ran (`preemptible.testing.nodes.sockets_of`)."""

    def __init__(self) -> None:
        self.initial = netns_of(os.getpid())
        self.netns: set[str] = set()
        self.sockets: set[Socket] = set()
        self.pids: set[int] = set()

    def sample(self, c: Cluster) -> None:
        for pid in c.pids():
            try:
                ns = netns_of(pid)
            except OSError:
                continue  # ended meanwhile
            self.pids.add(pid)
            self.netns.add(ns)
            self.sockets.update(sockets_of(pid))

    def until_done(self, c: Cluster, agents: list[Agent]) -> None:
        while any(a.proc.poll() is None for a in agents):
            self.sample(c)
            time.sleep(0.05)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Audit]:
    """The final digest of an uninterrupted 2-node run, and the sockets its processes had."""
    base = tmp_path_factory.mktemp("nodes-ref")
    audit = Audit()
    with cluster(2, base) as c:
        agents = launch(c, base / "ckpt", slow=False)
        audit.until_done(c, agents)
        codes = [a.wait() for a in agents]
        assert codes == [0, 0], [a.stderr()[-3000:] for a in agents]
        (digest,) = finals(agents)
    return digest, audit


def wait_for(predicate: Any, what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError(f"never: {what}")


def test_every_socket_of_a_two_node_run_stays_on_loopback_or_in_the_test_namespaces(
    reference: tuple[str, Audit],
) -> None:
    _, audit = reference
    initial = {audit.initial}  # the test's own namespace, the machine's initial one unless pid 1 says otherwise
    with contextlib.suppress(OSError):
        initial.add(netns_of(1))  # unreadable in some containers
    assert audit.pids and not initial & audit.netns  # no harness process in the machine's namespace
    outside = [s for s in audit.sockets if not s.allowed()]
    assert not outside, outside
    # not vacuous: the rendezvous store and gloo ran between the nodes' addresses
    across = {(s.local, s.remote) for s in audit.sockets if s.local in SUBNET and s.remote in SUBNET}
    assert {(ipaddress.ip_address("10.77.0.2"), ipaddress.ip_address("10.77.0.1"))} <= across, audit.sockets


def test_a_cut_node_is_unreachable_both_ways_until_healed(tmp_path: Path) -> None:
    server = (
        "import socket, sys\n"
        "s = socket.create_server((sys.argv[1], 0)); print(s.getsockname()[1], flush=True)\n"
        "while True:\n    c, _ = s.accept(); c.sendall(b'up'); c.close()\n"
    )
    client = (
        "import socket, sys\n"
        "try:\n    print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).recv(2).decode())\n"
        "except OSError as e:\n    print(type(e).__name__)\n"
    )
    with cluster(2, tmp_path) as c:
        ports = {}
        for n in c:
            proc = n.popen([sys.executable, "-c", server, n.addr], stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            ports[n.index] = proc.stdout.readline().strip()

        def reach(src: int, dst: int) -> str:
            done = c.node(src).run([sys.executable, "-c", client, c.node(dst).addr, ports[dst]])
            return done.stdout.strip()

        assert (reach(1, 2), reach(2, 1)) == ("up", "up")
        c.cut(2)
        assert (reach(1, 2), reach(2, 1)) == ("TimeoutError", "TimeoutError")
        assert reach(2, 2) == "up"  # the node itself keeps running
        c.heal(2)
        assert (reach(1, 2), reach(2, 1)) == ("up", "up")


@pytest.mark.timeout(600)  # a detector for a hang, not a speed assertion
def test_one_node_reclaimed_with_notice_stops_every_rank_at_one_step_and_the_job_restarts_itself_with_a_replacement(
    tmp_path: Path, reference: tuple[str, Audit]
) -> None:
    """Scenario 1: an AWS notice served only to node 2 (not the store host). Every rank stops at one step and the
    save commits once; node 2's rank exits with the platform's code (0 on AWS) and its agent leaves the
    rendezvous; node 1's rank exits `EXIT_PEER_NODE`, so its agent restarts on its own (torchrun's elastic
    restart), waits in the rendezvous for a replacement node, and the job resumes bit-identically at world 2."""
    root = tmp_path / "ckpt"
    with cluster(2, tmp_path) as c:
        emulators = {n.index: Emulator(n) for n in c}
        agents = launch(c, root, slow=True, sources=emulators, nnodes="2:2")
        wait_for(lambda: committed_steps(root), "the first periodic save")
        emulators[2].notice()  # node 2 only, which does not host the store
        reclaimed = agents[1].wait()
        ranks = journals(root)
        assert sorted(ranks) == [0, 1], agents[1].stderr()[-3000:]
        exits = {r: last(ev, "exit") for r, ev in ranks.items()}
        stop = exits[0]["step"]
        assert stop < STEPS
        assert all((e["step"], e["reason"], e["saved"]) == (stop, "notice", True) for e in exits.values())
        # the rank on node 2 (group rank 1) leaves with AWS's code; node 1's restarts
        assert (exits[1]["code"], exits[1]["role"], exits[1]["node"]) == (0, "reclaimed", 1), exits
        assert (exits[0]["code"], exits[0]["role"], exits[0]["node"]) == (EXIT_PEER_NODE, "survivor", 0), exits
        assert exits[1]["agent_pid"] == agents[1].proc.pid  # nsenter execs torchrun: the same process
        assert reclaimed != 0  # the agent ended on the signal: it did not close the rendezvous
        notices = {r: last(ev, "notice") for r, ev in ranks.items()}
        assert {n["source"] for n in notices.values()} == {"aws"}
        assert notices[1]["detail"].endswith("Z") and notices[0]["detail"].endswith("(seen by rank 1)")
        emergency = [
            e for ev in ranks.values() for e in ev if e["event"] == "save_committed" and e["reason"] == "emergency"
        ]
        assert sorted(e["rank"] for e in emergency) == [0, 1] and {e["step"] for e in emergency} == {stop}
        assert committed_steps(root)[-1] == stop
        assert json.loads((root / f"step-{stop:012d}" / "COMMIT.json").read_text())["world_size"] == 2
        assert agents[0].proc.poll() is None  # node 1's agent stays, restarting: nobody relaunches it

        # the VM goes; a replacement comes up empty at the same address and joins the same rendezvous
        old_scratch = c.node(2).scratch
        c.replace(2)
        assert not old_scratch.exists()
        endpoint = agents[0].endpoint
        (replacement,) = launch(c, root, slow=False, only=[2], endpoint=endpoint, nnodes="2:2", name="replacement")
        codes = [agents[0].wait(), replacement.wait()]
        assert codes == [0, 0], [agents[0].stderr()[-3000:], replacement.stderr()[-3000:]]
        out = agents[0].stdout()
        assert f"resumed_from={stop}" in out
        assert finals([agents[0]]) == [reference[0]]
        assert "restart" in agents[0].stderr().lower()  # torchrun's own elastic restart, not a relaunch

    from preemptible import report
    from preemptible.store.io import storage_for

    doc = report.report(storage_for(str(root)))
    assert doc["attempts"] == 2 and doc["finished"] is True
    (p,) = doc["preemptions"]
    assert (p["step"], p["resumed_from"], p["steps_lost"]) == (stop, stop, 0)
    # one row per launch of the whole job, each with its ranks and nodes (every start journals its node)
    first, second = doc["runs"]
    assert [(r["rank"], r["node"], r["exit_code"], r["role"]) for r in first["ranks"]] == [
        (0, 0, EXIT_PEER_NODE, "survivor"),
        (1, 1, 0, "reclaimed"),
    ]
    assert (first["ended"], p["rank"], p["node"]) == ("notice (aws) on node 1 (rank 1)", 1, 1)
    assert [(r["rank"], r["node"], r["ended"]) for r in second["ranks"]] == [(0, 0, "finished"), (1, 1, "finished")]
    print(f"stopped at {stop}; notice to commit {p['notice_to_commit_s']:.3f} s, steps lost {p['steps_lost']}")


@pytest.mark.timeout(600)  # a detector for a hang, not a speed assertion
def test_the_reclaimed_node_hosts_the_store_and_goes_right_after_the_commit(
    tmp_path: Path, reference: tuple[str, Audit]
) -> None:
    """Scenario 2: the notice goes to node 1, which hosts the rendezvous store (and rank 0, the workers' store).
    Rank 0 holds at the ``committed`` phase of the emergency save (COMMIT.json durable, the other ranks not yet
    told) while the harness takes node 1 away. The survivor neither hangs nor loses the commit: it reads the
    outcome off the storage, exits 76, and its agent ends (its rendezvous is gone). The test relaunches every node
    with a new endpoint, as a scheduler would, and the job resumes bit-identically."""
    root = tmp_path / "ckpt"
    phases_dir = tmp_path / "phases"
    phases_dir.mkdir()
    with cluster(2, tmp_path) as c:
        emulators = {n.index: Emulator(n) for n in c}
        agents = launch(
            c, root, slow=True, sources=emulators, nnodes="2:2", env={"PREEMPTIBLE_PHASE_DIR": str(phases_dir)}
        )
        wait_for(lambda: committed_steps(root), "the first periodic save")
        (phases_dir / "hold.rank0.committed").write_text("emergency")  # rank 0 stops at the emergency commit
        emulators[1].notice()  # node 1 only: the store's host
        marker = phases_dir / "rank0.committed"
        wait_for(lambda: marker.exists() and "emergency" in marker.read_text(), "rank 0 holds at the emergency commit")
        held = int((phases_dir / "rank0.committed").read_text().split()[0])
        c.down(1)  # the VM goes right after the commit, its store with it
        survivor = agents[1].wait(timeout=300)  # it ends: no hang on the store that is gone
        ranks = journals(root)
        exit1 = last(ranks[1], "exit")
        assert exit1 is not None, agents[1].stderr()[-3000:]
        stop = exit1["step"]
        assert (exit1["code"], exit1["role"], exit1["saved"], exit1["reason"]) == (
            EXIT_PEER_NODE,
            "survivor",
            True,
            "notice",
        )
        emergency1 = [e for e in ranks[1] if e["event"] == "save_committed" and e["reason"] == "emergency"]
        assert [e["step"] for e in emergency1] == [stop]
        assert held == stop
        assert "its COMMIT.json names this rank's files: committed" in agents[1].stderr()
        assert committed_steps(root)[-1] == stop  # the commit landed and stays
        assert survivor != 0, "the survivor's agent restarted into a rendezvous whose store is gone, and failed"
        print(f"stop {stop}; held at the commit of step {held}; survivor agent exit {survivor}")

        c.replace(1)
        agents = launch(c, root, slow=False, nnodes="2:2", host=2, name="relaunch")  # a new endpoint: node 2 hosts it
        codes = [a.wait() for a in agents]
        assert codes == [0, 0], [a.stderr()[-3000:] for a in agents]
        out = "".join(a.stdout() for a in agents)
        assert f"resumed_from={stop}" in out
        assert finals(agents) == [reference[0]]


def commit_doc(root: Path, step: int) -> dict[str, Any]:
    return json.loads((root / f"step-{step:012d}" / "COMMIT.json").read_text())


@pytest.mark.timeout(600)  # a detector for a hang, not a speed assertion
def test_a_node_lost_without_notice_is_detected_the_rest_goes_on_resharded_and_grows_back(tmp_path: Path) -> None:
    """Scenarios 3 and 5, FSDP2 (``fully_shard``) on gloo. Node 2 vanishes without notice (cut off, then its
    processes SIGKILLed and its scratch directory deleted: no FIN reaches anyone). Node 1's rank finds it within
    the configured peer timeout (journal: ``peer_lost``), exits 76, and its agent restarts on its own into a
    rendezvous of one node (``--nnodes 1:2``): the job resumes alone, resharded, from the newest committed
    checkpoint. Then node 1 is stopped by a notice at world 1, and the job is relaunched on 2 nodes (a
    replacement for node 2): it resumes resharded at world 2 (elastic growth) and finishes."""
    root = tmp_path / "ckpt"
    fsdp = dict(script=FSDP, args=("--steps", "3000", "--save-every", "40"))
    env = {"PREEMPTIBLE_PEER_TIMEOUT_S": str(PEER_TIMEOUT_S), "PREEMPTIBLE_SOURCES": "signal"}
    with cluster(2, tmp_path) as c:
        agents = launch(c, root, slow=True, nnodes="1:2", env=env, **fsdp)
        wait_for(lambda: committed_steps(root), "the first periodic save", timeout=180)
        lost_scratch = c.node(2).scratch
        c.cut(2)  # the VM vanishes: not a packet more, not even a FIN
        c.down(2)
        assert not lost_scratch.exists()
        # node 1 alone: it detects, restarts by itself at world 1 and saves there
        wait_for(
            lambda: any(commit_doc(root, s)["world_size"] == 1 for s in committed_steps(root)),
            "a save at world 1",
            timeout=300,
        )
        ranks = journals(root)
        (lost,) = [e for e in ranks[0] if e["event"] == "peer_lost"]
        assert (lost["missing"], lost["timeout_s"], lost["code"]) == ([1], PEER_TIMEOUT_S, EXIT_PEER_NODE), lost
        assert lost["stalled_s"] >= PEER_TIMEOUT_S / 2
        before = [s for s in committed_steps(root) if commit_doc(root, s)["world_size"] == 2]
        restored = [e for e in ranks[0] if e["event"] == "restored"]
        assert restored and restored[-1]["step"] == before[-1]  # the newest committed before the loss, nothing older
        changed = last(ranks[0], "world_changed")
        assert (changed["saved_world"], changed["world"]) == (2, 1), changed
        assert not [e for e in ranks[0] if e["event"] == "checkpoint_invalid"]  # nothing torn was tried
        assert agents[0].proc.poll() is None  # the same agent: torchrun's elastic restart, nobody relaunched it

        # a notice at world 1 (the agent forwards SIGTERM to its worker), then the job comes back on 2 nodes
        agents[0].proc.send_signal(signal.SIGTERM)
        agents[0].wait()
        stop = last(journals(root)[0], "exit")
        assert (stop["reason"], stop["saved"]) == ("notice", True), stop
        assert commit_doc(root, stop["step"])["world_size"] == 1
        c.replace(2)
        agents = launch(c, root, slow=False, nnodes="2:2", env=env, name="relaunch", **fsdp)
        codes = [a.wait(timeout=300) for a in agents]
        assert codes == [0, 0], [a.stderr()[-3000:] for a in agents]
        assert f"resumed_from={stop['step']}" in agents[0].stdout()
        grown = last(journals(root)[1], "world_changed")
        assert (grown["saved_world"], grown["world"]) == (1, 2), grown
        assert commit_doc(root, committed_steps(root)[-1])["world_size"] == 2
        print(f"lost after step {before[-1]}; peer_lost after {lost['stalled_s']} s stalled; stopped at {stop['step']}")


@pytest.mark.timeout(600)  # a detector for a hang, not a speed assertion
def test_a_node_cut_off_mid_save_never_leaves_a_torn_step_to_restore(
    tmp_path: Path, reference: tuple[str, Audit]
) -> None:
    """Scenario 4, DDP. Node 2's rank holds at the ``written`` phase of a periodic save (its files durable, its
    report to the commit barrier not yet sent) and the harness cuts node 2 off there, then lets it go on: its
    report never arrives, so rank 0 commits nothing; both sides find the other gone within the peer timeout
    (rank 0: rank 1 does not answer; rank 1: the store is unreachable) and exit 76. Healed and relaunched, the job
    restores the newest checkpoint that verifies, the one before the cut save, and ends bit-identical."""
    root = tmp_path / "ckpt"
    phases_dir = tmp_path / "phases"
    phases_dir.mkdir()
    env = {
        "PREEMPTIBLE_PEER_TIMEOUT_S": str(PEER_TIMEOUT_S),
        "PREEMPTIBLE_COORD_TIMEOUT": "15",
        "PREEMPTIBLE_SOURCES": "signal",
        "PREEMPTIBLE_PHASE_DIR": str(phases_dir),
    }
    with cluster(2, tmp_path) as c:
        agents = launch(c, root, slow=True, nnodes="2:2", max_restarts=0, env=env)
        wait_for(lambda: committed_steps(root), "the first periodic save")
        before = committed_steps(root)[-1]
        (phases_dir / "hold.rank1.written").write_text("periodic")  # the next periodic save of rank 1 stops there
        marker = phases_dir / "rank1.written"
        wait_for(lambda: marker.exists() and int(marker.read_text().split()[0]) > before, "rank 1 holds mid-save")
        cut = int(marker.read_text().split()[0])
        c.cut(2)
        (phases_dir / "hold.rank1.written").unlink()  # it goes on, into a network that is not there

        def both_lost() -> bool:
            return all(any(e["event"] == "peer_lost" for e in ev) for ev in journals(root).values())

        wait_for(both_lost, "each side finds the other gone", timeout=180)
        c.heal(2)  # the partition ends: the agents (max_restarts 0) end too, and the scheduler relaunches
        cut_codes = [a.wait(timeout=300) for a in agents]
        assert all(code != 0 for code in cut_codes), cut_codes
        ranks = journals(root)
        lost = {r: last(ev, "peer_lost") for r, ev in ranks.items()}
        assert lost[0]["missing"] == [1] and lost[0]["timeout_s"] == PEER_TIMEOUT_S, lost[0]
        assert "unreachable" in lost[1]["how"] and lost[1]["timeout_s"] == PEER_TIMEOUT_S, lost[1]
        assert cut not in committed_steps(root)  # no commit without every rank's report
        assert committed_steps(root)[-1] == before
        failed = last(ranks[0], "save_failed")
        assert failed["step"] == cut, failed  # rank 0 heard nothing from rank 1 within the commit timeout

        agents = launch(
            c, root, slow=False, nnodes="2:2", max_restarts=0, env={"PREEMPTIBLE_SOURCES": "signal"}, name="relaunch"
        )
        codes = [a.wait(timeout=300) for a in agents]
        assert codes == [0, 0], [a.stderr()[-3000:] for a in agents]
        assert f"resumed_from={before}" in agents[0].stdout()
        assert finals(agents) == [reference[0]]
        restored = [e for e in journals(root)[0] if e["event"] == "restored"]
        assert restored[-1]["step"] == before
        print(f"cut mid-save of step {cut}; resumed from {before}; agents' codes after the cut {cut_codes}")
