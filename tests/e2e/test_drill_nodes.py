"""``preemptible drill --nodes``: scenario 1 of a multi-node job rehearsed by one command, on simulated nodes (the
network namespaces of `preemptible.testing.nodes`), with real torchrun agents, real emulators and the example DDP
script; plus the arguments it refuses and a drill that must fail.

Where namespaces cannot be made (not root) the drills skip and say why; under ``CI=true`` they fail.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from conftest import clean_env
from preemptible.emergency import EXIT_PEER_NODE
from preemptible.testing.nodes import SUBNET, Socket, netns_of, sockets_of, unavailable
from torchrunkit import EXAMPLE

STEPS = 1500
TRAIN = ("--steps", str(STEPS), "--save-every", "40", "--step-time", "0.02")


def need_namespaces() -> None:
    why = unavailable()
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the multi-node drill must run in CI, but: {why}")
    pytest.skip(f"no network namespaces: {why}")


def drill(*args: str, timeout: float = 170) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "preemptible", "drill", *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=timeout,
        check=False,
    )


def as_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"drill printed no JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None
    assert isinstance(doc, dict)
    return doc


def naming(marker: str) -> dict[int, str]:
    """The processes running now whose command line names ``marker`` (pid: command line), this one aside."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(marker in a for a in argv):
                found[int(entry)] = " ".join(argv)
    return found


def leftovers(marker: str) -> list[str]:
    """Command lines of processes still running that name ``marker`` (the drill must end all it started)."""
    return list(naming(marker).values())


class Audit(threading.Thread):
    """While the drill runs: the network namespace and TCP sockets of every process naming ``marker`` (its agents
    and ranks), the drill itself aside (it runs here, and reaches the nodes only through their processes), and an
    ``nsenter`` not yet inside its node (until it has entered the node's namespace and exec'd the agent, it runs in
    this one: seen there under a CPU-heavy neighbour, which is no agent in the wrong namespace)."""

    def __init__(self, marker: str) -> None:
        super().__init__(name="drill-socket-audit", daemon=True)
        self.marker = marker
        self.netns: set[str] = set()
        self.sockets: set[Socket] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            for pid, argv in naming(self.marker).items():
                if " -m preemptible drill " in argv or argv.startswith("nsenter "):
                    continue
                with contextlib.suppress(OSError):
                    self.netns.add(netns_of(pid))
                    self.sockets.update(sockets_of(pid))


@pytest.mark.timeout(200)
def test_a_two_node_drill_reclaims_the_last_node_and_the_job_resumes_with_a_replacement(tmp_path: Path) -> None:
    need_namespaces()
    root = tmp_path / "ckpt"
    audit = Audit(str(root))
    audit.start()
    try:
        proc = drill(
            "--json", "--nodes", "2", "--source", "aws", "--", sys.executable, str(EXAMPLE), "--root", str(root), *TRAIN
        )
    finally:
        audit.stop.set()
        audit.join()
    doc = as_json(proc)
    assert proc.returncode == 0 and doc["passed"], json.dumps(doc, indent=1) + proc.stderr
    assert [c["name"] for c in doc["checks"]] == [
        "the command's Run started on every node",
        "the notice reached every rank",
        "every rank stopped at one step",
        "one emergency checkpoint committed",
        "the reclaimed node's ranks exited with the platform's code",
        "the reclaimed node's agent left the rendezvous open",
        "exit within the window",
        "the other nodes' ranks exited 76 and their agents restart",
        "the job resumed from the emergency checkpoint with the replacement",
        "the surviving agents restarted the job themselves",
        "a second notice stops the resumed job",
    ]
    stop = doc["checkpoint_step"]
    assert doc["moment"]["aim"] == "first-save" and 0 < doc["moment"]["step"] <= stop < STEPS
    assert doc["resumed_step"] == stop and doc["steps_lost"] == 0
    assert (doc["node_count"], doc["root"], doc["window_s"]) == (2, str(root), 120)
    t = doc["timings"]
    assert t["notice_to_boundary_s"] <= t["notice_to_commit_s"] <= t["notice_to_exit_s"] < doc["window_s"]
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert (nodes[2]["addr"], nodes[2]["role"], nodes[2]["replaced"], nodes[2]["hosts_store"]) == (
        "10.77.0.2",
        "reclaimed",
        True,
        False,
    )
    assert [r["code"] for r in nodes[2]["ranks"]] == [0]  # AWS's code
    assert nodes[2]["agent_exit"] not in (None, 0)  # ended by its rank's SIGTERM: the rendezvous stayed open
    assert (nodes[1]["role"], nodes[1]["hosts_store"], [r["code"] for r in nodes[1]["ranks"]]) == (
        "survivor",
        True,
        [EXIT_PEER_NODE],
    )
    assert "drill: node 2 goes; a replacement comes up at 10.77.0.2" in proc.stderr

    # the run's own journal, read after the fact, tells the same story
    from preemptible import report
    from preemptible.store.io import storage_for

    summary = report.report(storage_for(str(root)))
    first, second = summary["preemptions"]
    assert (first["step"], first["resumed_from"], first["steps_lost"], first["source"]) == (stop, stop, 0, "aws")
    assert second["step"] > stop and summary["attempts"] == 2
    assert not leftovers(str(root))  # every agent, rank and emulator ended with the drill

    # every packet on loopback or inside the drill's namespaces: no agent or rank in this test's own namespace, and
    # not vacuous: the rendezvous and gloo ran between the nodes' addresses
    assert audit.netns and netns_of(os.getpid()) not in audit.netns
    assert not [s for s in audit.sockets if not s.allowed()]
    across = {(s.local, s.remote) for s in audit.sockets if s.local in SUBNET and s.remote in SUBNET}
    assert (ipaddress.ip_address("10.77.0.2"), ipaddress.ip_address("10.77.0.1")) in across, audit.sockets


def test_a_multi_node_drill_of_a_command_without_a_run_fails_and_ends_everything(tmp_path: Path) -> None:
    need_namespaces()
    script = tmp_path / "no_run.py"
    script.write_text("import time\ntime.sleep(120)\n")
    proc = drill("--json", "--nodes", "2", "--source", "aws", "--start-timeout", "3", "--", sys.executable, str(script))
    doc = as_json(proc)
    assert proc.returncode == 1 and not doc["passed"]
    (check,) = doc["checks"]
    assert check["name"] == "the command's Run started on every node" and not check["passed"]
    assert "not every rank's Run entered the loop within 3 s" in check["detail"]
    assert "PREEMPTIBLE_REPORT_FILE" in check["detail"]  # what the command must do: train with preemptible.Run
    assert not leftovers(str(script))


@pytest.mark.parametrize(
    ("args", "found", "todo"),
    [
        (("--nodes", "1", "--source", "aws"), "found 1", "drop --nodes for a drill of one node"),
        (("--nodes", "5", "--source", "aws"), "found 5", "drop --nodes for a drill of one node"),
        (("--nodes", "2", "--source", "gcp"), "found --source gcp", "Use --source aws, or drop --nodes"),
        (("--nodes", "2", "--source", "aws", "--kill"), "found both", "drop one"),
    ],
)
def test_bad_nodes_arguments_are_refused_saying_what_was_expected_and_what_to_do(
    args: tuple[str, ...], found: str, todo: str
) -> None:
    proc = drill(*args, "--", sys.executable, str(EXAMPLE), "--root", "/nonexistent/never-made", timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("preemptible drill: expected --"), proc.stderr
    assert found in proc.stderr and todo in proc.stderr
    assert proc.stdout == ""  # nothing ran
