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
from objkit import CREDENTIALS
from objkit import env as s3_env
from preemptible.emergency import EXIT_PEER_NODE
from preemptible.testing.nodes import (
    SERVICES,
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


MAKE_BUCKET = """
import sys, time, s3fs
fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": sys.argv[1]})
for _ in range(300):
    try:
        fs.mkdir(sys.argv[2])
        break
    except Exception:
        time.sleep(0.1)
else:
    raise SystemExit("the S3 server never answered")
"""

MIRROR = """
import os, sys, s3fs
endpoint, src, dest = sys.argv[1:4]
fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
for path in fs.find(src):
    rel = path[len(src):].lstrip("/")
    if rel.endswith((".json", ".jsonl")):
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        fs.get(path, out)
"""


class Root:
    """The job's shared durable root: a directory, or a bucket on an S3 server (moto) that listens on the
    cluster's services address, reached by every node through its own link (so a cut node loses it too)."""

    def __init__(self, c: Cluster, base: Path, kind: str) -> None:
        self.c, self.base, self.kind = c, base, kind
        self.env: dict[str, str] = {}
        if kind == "dir":
            self.arg = str(base / "ckpt")
            return
        port = c.free_services_port()
        self.endpoint = f"http://{SERVICES}:{port}"
        c.serve(
            [sys.executable, "-m", "moto.server", "-H", SERVICES, "-p", str(port)],
            env=clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        made = c.run_outside([sys.executable, "-c", MAKE_BUCKET, self.endpoint, "ckpt"], env=clean_env(**CREDENTIALS))
        assert made.returncode == 0, made.stderr
        self.arg = "s3://ckpt/run"
        self.env = s3_env(self.endpoint)
        self._views = 0

    def view(self) -> Path:
        """A local view of the root's documents (COMMIT.json files, the journal): the directory itself, or a
        fresh copy of the bucket's, fetched from the outer namespace."""
        if self.kind == "dir":
            return Path(self.arg)
        self._views += 1
        dest = self.base / f"s3-view-{self._views}"
        done = self.c.run_outside(
            [sys.executable, "-c", MIRROR, self.endpoint, "ckpt/run", str(dest)], env=clean_env(**CREDENTIALS)
        )
        assert done.returncode == 0, done.stderr
        dest.mkdir(exist_ok=True)
        return dest


class Agent:
    """One node's torchrun agent; its output goes to ``logs/node<i>.<name>.out`` and ``.err`` beside the nodes'
    scratch directories (a relaunch takes another ``name``, so the first launch's logs stay for diagnose's
    fixtures, tests/corpus/diagnose/harness)."""

    def __init__(
        self,
        node: Node,
        root: Path | str,
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
    root: Path | str,
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


SCRIPTS = {"ddp": EXAMPLE, "fsdp": FSDP}
FULL = os.environ.get("PREEMPTIBLE_NODES_MATRIX", "").strip() == "full"
"""``PREEMPTIBLE_NODES_MATRIX=full``: every scenario under both wrappers (DDP, FSDP2) and with 2, 3 and 4 nodes
(scenario 2 and 4: 2 and 3). CI runs each once, with 2 nodes: DDP for 1, 2 and 4; FSDP2 for 3 and 5."""


def matrix(ci: tuple[str, int], nodes: tuple[int, ...] = (2, 3, 4)) -> list[Any]:
    cases = [(w, n) for w in SCRIPTS for n in nodes] if FULL else [ci]
    return [pytest.param(w, n, id=f"{w}-{n}nodes") for w, n in cases]


_REFERENCES: dict[tuple[str, int], str] = {}


def reference_digest(wrapper: str, n: int, base: Path) -> str:
    """The final digest of an uninterrupted ``n``-node run of ``wrapper``'s script (made once per session)."""
    if (wrapper, n) not in _REFERENCES:
        with cluster(n, base / f"ref-{wrapper}-{n}") as c:
            agents = launch(c, base / f"ref-{wrapper}-{n}" / "ckpt", slow=False, nnodes=f"{n}:{n}", **script(wrapper))
            codes = [a.wait(timeout=300) for a in agents]
            assert codes == [0] * n, [a.stderr()[-3000:] for a in agents]
            (_REFERENCES[wrapper, n],) = finals(agents)
    return _REFERENCES[wrapper, n]


def script(wrapper: str) -> dict[str, Any]:
    return {"script": SCRIPTS[wrapper], "args": ARGS}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Audit]:
    """The final digest of an uninterrupted 2-node DDP run, and the sockets its processes had."""
    base = tmp_path_factory.mktemp("nodes-ref")
    audit = Audit()
    with cluster(2, base) as c:
        agents = launch(c, base / "ckpt", slow=False)
        audit.until_done(c, agents)
        codes = [a.wait() for a in agents]
        assert codes == [0, 0], [a.stderr()[-3000:] for a in agents]
        (digest,) = finals(agents)
    _REFERENCES["ddp", 2] = digest
    return digest, audit


@pytest.fixture(scope="module")
def refs(tmp_path_factory: pytest.TempPathFactory, reference: tuple[str, Audit]) -> Any:
    base = tmp_path_factory.mktemp("nodes-refs")
    return lambda wrapper, n: reference_digest(wrapper, n, base)


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

        s3 = Root(c, tmp_path, "s3")  # the shared object store, on the bridge
        s3_port = s3.endpoint.rsplit(":", 1)[1]

        def reach_s3(src: int) -> str:
            probe = (
                "import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)\n"
            )
            probe += "    print('up')\nexcept OSError as e:\n    print(type(e).__name__)\n"
            return c.node(src).run([sys.executable, "-c", probe, SERVICES, s3_port]).stdout.strip()

        assert (reach(1, 2), reach(2, 1), reach_s3(1), reach_s3(2)) == ("up", "up", "up", "up")
        c.cut(2)  # store, gloo and S3 alike: every packet of node 2 goes through its one link
        assert (reach(1, 2), reach(2, 1), reach_s3(2)) == ("TimeoutError", "TimeoutError", "TimeoutError")
        assert (reach(2, 2), reach_s3(1)) == ("up", "up")  # the node itself keeps running; the others keep S3
        c.heal(2)
        assert (reach(1, 2), reach(2, 1), reach_s3(2)) == ("up", "up", "up")


@pytest.mark.timeout(900)  # a detector for a hang, not a speed assertion
@pytest.mark.parametrize("store", ["s3", "dir"] if FULL else ["s3"])
@pytest.mark.parametrize(("wrapper", "n"), matrix(("ddp", 2)))
def test_one_node_reclaimed_with_notice_stops_every_rank_at_one_step_and_the_job_restarts_itself_with_a_replacement(
    tmp_path: Path, refs: Any, wrapper: str, n: int, store: str
) -> None:
    """Scenario 1: an AWS notice served only to the last node (not the store host). Every rank stops at one step
    and the save commits once; the reclaimed node's rank exits with the platform's code (0 on AWS) and its agent
    leaves the rendezvous; every other rank exits `EXIT_PEER_NODE`, so their agents restart on their own
    (torchrun's elastic restart) and wait in the rendezvous for a replacement node; the job resumes
    bit-identically at the same world size. The durable root is a bucket on an S3 server the nodes reach over
    their own links (CI), or a directory."""
    expected = refs(wrapper, n)
    last_rank = n - 1  # one rank per node: node i is group rank i - 1
    with cluster(n, tmp_path) as c:
        root = Root(c, tmp_path, store)
        emulators = {node.index: Emulator(node) for node in c}
        env = {**root.env, "PREEMPTIBLE_PEER_TIMEOUT_S": str(PEER_TIMEOUT_S)}  # a spurious detection would show
        agents = launch(c, root.arg, slow=True, sources=emulators, nnodes=f"{n}:{n}", env=env, **script(wrapper))
        wait_for(lambda: committed_steps(root.view()), "the first periodic save", timeout=240)
        emulators[n].notice()  # the last node only, which does not host the store
        reclaimed = agents[-1].wait(timeout=300)
        view = root.view()
        ranks = journals(view)
        assert sorted(ranks) == list(range(n)), agents[-1].stderr()[-3000:]
        exits = {r: last(ev, "exit") for r, ev in ranks.items()}
        stop = exits[0]["step"]
        assert stop < STEPS
        assert all((e["step"], e["reason"], e["saved"]) == (stop, "notice", True) for e in exits.values())
        # the reclaimed node's rank leaves with AWS's code; every other node's restarts
        assert (exits[last_rank]["code"], exits[last_rank]["role"], exits[last_rank]["node"]) == (
            0,
            "reclaimed",
            last_rank,
        ), exits
        for r in range(last_rank):
            assert (exits[r]["code"], exits[r]["role"], exits[r]["node"]) == (EXIT_PEER_NODE, "survivor", r), exits
        assert exits[last_rank]["agent_pid"] == agents[-1].proc.pid  # nsenter execs torchrun: the same process
        assert reclaimed != 0  # the agent ended on the signal: it did not close the rendezvous
        notices = {r: last(ev, "notice") for r, ev in ranks.items()}
        assert {x["source"] for x in notices.values()} == {"aws"}
        assert notices[last_rank]["detail"].endswith("Z")
        assert all(notices[r]["detail"].endswith(f"(seen by rank {last_rank})") for r in range(last_rank))
        emergency = [
            e for ev in ranks.values() for e in ev if e["event"] == "save_committed" and e["reason"] == "emergency"
        ]
        assert sorted(e["rank"] for e in emergency) == list(range(n)) and {e["step"] for e in emergency} == {stop}
        assert committed_steps(view)[-1] == stop
        assert commit_doc(view, stop)["world_size"] == n
        assert all(a.proc.poll() is None for a in agents[:-1])  # the other agents stay, restarting

        # the VM goes; a replacement comes up empty at the same address and joins the same rendezvous
        old_scratch = c.node(n).scratch
        c.replace(n)
        assert not old_scratch.exists()
        (replacement,) = launch(
            c, root.arg, slow=False, only=[n], endpoint=agents[0].endpoint, nnodes=f"{n}:{n}", name="replacement",
            env=env, **script(wrapper),
        )  # fmt: skip
        stayed = agents[:-1]
        codes = [a.wait(timeout=300) for a in stayed] + [replacement.wait(timeout=300)]
        assert codes == [0] * n, [a.stderr()[-3000:] for a in [*stayed, replacement]]
        assert f"resumed_from={stop}" in agents[0].stdout()
        assert finals([agents[0]]) == [expected]
        assert all("will restart worker group" in a.stderr() for a in stayed)  # torchrun's own elastic restart
        view = root.view()
        assert not [e for ev in journals(view).values() for e in ev if e["event"] == "peer_lost"]  # none spurious

    from preemptible import report
    from preemptible.store.io import storage_for

    doc = report.report(storage_for(str(view)))
    assert doc["finished"] is True
    (p,) = doc["preemptions"]
    assert (p["step"], p["resumed_from"], p["steps_lost"]) == (stop, stop, 0)
    # one row per launch of the whole job, each with its ranks and nodes (every start journals its node)
    first, second = doc["runs"]
    assert [(r["rank"], r["node"], r["exit_code"], r["role"]) for r in first["ranks"]] == [
        *((r, r, EXIT_PEER_NODE, "survivor") for r in range(last_rank)),
        (last_rank, last_rank, 0, "reclaimed"),
    ]
    assert (first["ended"], p["rank"], p["node"]) == (
        f"notice (aws) on node {last_rank} (rank {last_rank})",
        last_rank,
        last_rank,
    )
    assert [(r["rank"], r["node"], r["ended"]) for r in second["ranks"]] == [(r, r, "finished") for r in range(n)]
    took = p["notice_to_commit_s"]
    print(f"{wrapper} {n} nodes, {store}: stopped at {stop}; notice to commit {took:.3f} s, steps lost 0")


@pytest.mark.timeout(900)  # a detector for a hang, not a speed assertion
@pytest.mark.parametrize(("wrapper", "n"), matrix(("ddp", 2), nodes=(2, 3)))
def test_the_reclaimed_node_hosts_the_store_and_goes_right_after_the_commit(
    tmp_path: Path, refs: Any, wrapper: str, n: int
) -> None:
    """Scenario 2: the notice goes to node 1, which hosts the rendezvous store (and rank 0, the workers' store).
    Rank 0 holds at the ``committed`` phase of the emergency save (COMMIT.json durable, the other ranks not yet
    told) while the harness takes node 1 away. The survivors neither hang nor lose the commit: they read the
    outcome off the storage, exit 76, and their agents end (their rendezvous is gone). The test relaunches every
    node with a new endpoint, as a scheduler would, and the job resumes bit-identically."""
    root = tmp_path / "ckpt"
    expected = refs(wrapper, n)
    phases_dir = tmp_path / "phases"
    phases_dir.mkdir()
    with cluster(n, tmp_path) as c:
        emulators = {node.index: Emulator(node) for node in c}
        env = {"PREEMPTIBLE_PHASE_DIR": str(phases_dir)}
        agents = launch(c, root, slow=True, sources=emulators, nnodes=f"{n}:{n}", env=env, **script(wrapper))
        wait_for(lambda: committed_steps(root), "the first periodic save", timeout=240)
        (phases_dir / "hold.rank0.committed").write_text("emergency")  # rank 0 stops at the emergency commit
        emulators[1].notice()  # node 1 only: the store's host
        marker = phases_dir / "rank0.committed"
        wait_for(lambda: marker.exists() and "emergency" in marker.read_text(), "rank 0 holds at the emergency commit")
        held = int(marker.read_text().split()[0])
        c.down(1)  # the VM goes right after the commit, its store with it
        survivors = [a.wait(timeout=300) for a in agents[1:]]  # they end: no hang on the store that is gone
        ranks = journals(root)
        for r in range(1, n):
            e = last(ranks[r], "exit")
            assert (e["step"], e["code"], e["role"], e["saved"]) == (held, EXIT_PEER_NODE, "survivor", True), e
            emergency = [x for x in ranks[r] if x["event"] == "save_committed" and x["reason"] == "emergency"]
            assert [x["step"] for x in emergency] == [held]
        assert "its COMMIT.json names this rank's files: committed" in agents[1].stderr()
        assert committed_steps(root)[-1] == held  # the commit landed and stays
        assert all(code != 0 for code in survivors), survivors  # restarted into a rendezvous that is gone: failed

        c.replace(1)
        agents = launch(c, root, slow=False, nnodes=f"{n}:{n}", host=2, name="relaunch", **script(wrapper))
        codes = [a.wait(timeout=300) for a in agents]
        assert codes == [0] * n, [a.stderr()[-3000:] for a in agents]
        out = "".join(a.stdout() for a in agents)
        assert f"resumed_from={held}" in out
        assert finals(agents) == [expected]
        print(f"{wrapper} {n} nodes: held at the commit of step {held}; survivors' agents {survivors}")


def commit_doc(root: Path, step: int) -> dict[str, Any]:
    return json.loads((root / f"step-{step:012d}" / "COMMIT.json").read_text())


@pytest.mark.timeout(900)  # a detector for a hang, not a speed assertion
@pytest.mark.parametrize(("wrapper", "n"), matrix(("fsdp", 2)))
def test_a_node_lost_without_notice_is_detected_the_rest_goes_on_resharded_and_grows_back(
    tmp_path: Path, wrapper: str, n: int
) -> None:
    """Scenarios 3 and 5. The last node vanishes without notice (cut off, then its processes SIGKILLed and its
    scratch directory deleted: no FIN reaches anyone). The other ranks find it within the configured peer timeout
    (journal: ``peer_lost``), exit 76, and their agents restart on their own into a rendezvous of the nodes that
    remain (``--nnodes 1:N``): the job resumes on fewer ranks, resharded (FSDP2), from the newest committed
    checkpoint. Then a notice stops it there, and the job is relaunched on all N nodes (a replacement for the
    lost one): it resumes resharded at world N (elastic growth) and finishes."""
    root = tmp_path / "ckpt"
    env = {"PREEMPTIBLE_PEER_TIMEOUT_S": str(PEER_TIMEOUT_S), "PREEMPTIBLE_SOURCES": "signal"}
    long = {"script": SCRIPTS[wrapper], "args": ("--steps", "3000", "--save-every", "40")}
    lost_rank = n - 1
    with cluster(n, tmp_path) as c:
        agents = launch(c, root, slow=True, nnodes=f"1:{n}", env=env, **long)
        wait_for(lambda: committed_steps(root), "the first periodic save", timeout=240)
        lost_scratch = c.node(n).scratch
        c.cut(n)  # the VM vanishes: not a packet more, not even a FIN
        c.down(n)
        assert not lost_scratch.exists()
        # the others alone: they detect, restart by themselves at world n - 1 and save there
        wait_for(
            lambda: any(commit_doc(root, s)["world_size"] == n - 1 for s in committed_steps(root)),
            f"a save at world {n - 1}",
            timeout=400,
        )
        ranks = journals(root)
        found = []
        for r in range(n - 1):  # each survivor ends the same way, once: peer_lost, exit 76
            (lost,) = [e for e in ranks[r] if e["event"] == "peer_lost"]
            assert (lost["timeout_s"], lost["code"]) == (PEER_TIMEOUT_S, EXIT_PEER_NODE), lost
            # its own watch named the lost rank; or (with more nodes) a survivor that exited first closed the
            # collective's connection, or took the workers' store with it (rank 0 hosts it), before it fired
            assert (
                lost["missing"] == [lost_rank]
                or lost["how"].startswith("a collective failed")
                or "unreachable" in lost["how"]
            ), lost
            found += [lost] if lost["missing"] else []
        assert found and all(x["stalled_s"] >= PEER_TIMEOUT_S / 2 for x in found)  # some watch found it, in time
        lost = found[0]
        before = [s for s in committed_steps(root) if commit_doc(root, s)["world_size"] == n]
        restored = [e for e in ranks[0] if e["event"] == "restored"]
        assert restored and restored[-1]["step"] == before[-1]  # the newest committed before the loss
        changed = last(ranks[0], "world_changed")
        assert (changed["saved_world"], changed["world"]) == (n, n - 1), changed
        assert not [e for e in ranks[0] if e["event"] == "checkpoint_invalid"]  # nothing torn was tried
        assert all(a.proc.poll() is None for a in agents[:-1])  # the same agents: torchrun's elastic restart

        # a notice at world n - 1 (each agent forwards SIGTERM to its worker), then the job comes back on n nodes
        for a in agents[:-1]:
            a.proc.send_signal(signal.SIGTERM)
        for a in agents[:-1]:
            a.wait(timeout=300)
        stop = last(journals(root)[0], "exit")
        assert (stop["reason"], stop["saved"]) == ("notice", True), stop
        assert commit_doc(root, stop["step"])["world_size"] == n - 1
        c.replace(n)
        # the grown job runs on to two periodic saves at world n (not to the long first run's end: no reference here)
        finish = {"script": long["script"], "args": ("--steps", str(stop["step"] + 80), "--save-every", "40")}
        agents = launch(c, root, slow=False, nnodes=f"{n}:{n}", env=env, name="relaunch", **finish)
        codes = [a.wait(timeout=300) for a in agents]
        assert codes == [0] * n, [a.stderr()[-3000:] for a in agents]
        assert f"resumed_from={stop['step']}" in agents[0].stdout()
        grown = last(journals(root)[lost_rank], "world_changed")
        assert (grown["saved_world"], grown["world"]) == (n - 1, n), grown
        assert commit_doc(root, committed_steps(root)[-1])["world_size"] == n
        stalled = lost["stalled_s"]
        print(
            f"{wrapper} {n} nodes: lost after step {before[-1]}; peer_lost after {stalled} s; stopped at {stop['step']}"
        )


@pytest.mark.timeout(900)  # a detector for a hang, not a speed assertion
@pytest.mark.parametrize(("wrapper", "n"), matrix(("ddp", 2), nodes=(2, 3)))
def test_a_node_cut_off_mid_save_never_leaves_a_torn_step_to_restore(
    tmp_path: Path, refs: Any, wrapper: str, n: int
) -> None:
    """Scenario 4. The last node's rank holds at the ``written`` phase of a periodic save (its files durable, its
    report to the commit barrier not yet sent) and the harness cuts that node off there, then lets it go on: its
    report never arrives, so rank 0 commits nothing; both sides find the other gone within the peer timeout
    (the others: that rank does not answer; it: the store is unreachable) and exit 76. Healed and relaunched, the
    job restores the newest checkpoint that verifies, the one before the cut save, and ends bit-identical."""
    root = tmp_path / "ckpt"
    expected = refs(wrapper, n)
    phases_dir = tmp_path / "phases"
    phases_dir.mkdir()
    cut_rank = n - 1
    env = {
        "PREEMPTIBLE_PEER_TIMEOUT_S": str(PEER_TIMEOUT_S),
        "PREEMPTIBLE_COORD_TIMEOUT": "15",
        "PREEMPTIBLE_SOURCES": "signal",
        "PREEMPTIBLE_PHASE_DIR": str(phases_dir),
    }
    with cluster(n, tmp_path) as c:
        agents = launch(c, root, slow=True, nnodes=f"{n}:{n}", max_restarts=0, env=env, **script(wrapper))
        wait_for(lambda: committed_steps(root), "the first periodic save", timeout=240)
        before = committed_steps(root)[-1]
        hold = phases_dir / f"hold.rank{cut_rank}.written"
        hold.write_text("periodic")  # the next periodic save of that rank stops there
        marker = phases_dir / f"rank{cut_rank}.written"
        wait_for(lambda: marker.exists() and int(marker.read_text().split()[0]) > before, "the rank holds mid-save")
        cut = int(marker.read_text().split()[0])
        c.cut(n)
        hold.unlink()  # it goes on, into a network that is not there

        def all_lost() -> bool:
            return all(any(e["event"] == "peer_lost" for e in ev) for ev in journals(root).values())

        wait_for(all_lost, "each side finds the other gone", timeout=240)
        c.heal(n)  # the partition ends: the agents (max_restarts 0) end too, and the scheduler relaunches
        cut_codes = [a.wait(timeout=300) for a in agents]
        assert all(code != 0 for code in cut_codes), cut_codes
        ranks = journals(root)
        lost = {r: last(ev, "peer_lost") for r, ev in ranks.items()}
        for r in range(cut_rank):
            assert lost[r]["missing"] == [cut_rank] and lost[r]["timeout_s"] == PEER_TIMEOUT_S, lost[r]
        assert "unreachable" in lost[cut_rank]["how"] and lost[cut_rank]["timeout_s"] == PEER_TIMEOUT_S
        assert cut not in committed_steps(root)  # no commit without every rank's report
        assert committed_steps(root)[-1] == before
        failed = last(ranks[0], "save_failed")
        assert failed["step"] == cut, failed  # rank 0 heard nothing from the cut rank within the commit timeout

        agents = launch(c, root, slow=False, nnodes=f"{n}:{n}", max_restarts=0, name="relaunch", **script(wrapper))
        codes = [a.wait(timeout=300) for a in agents]
        assert codes == [0] * n, [a.stderr()[-3000:] for a in agents]
        assert f"resumed_from={before}" in agents[0].stdout()
        assert finals(agents) == [expected]
        restored = [e for e in journals(root)[0] if e["event"] == "restored"]
        assert restored[-1]["step"] == before
        print(f"{wrapper} {n} nodes: cut mid-save of step {cut}; resumed from {before}; codes at the cut {cut_codes}")
