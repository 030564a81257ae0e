"""A multi-node job's exit after a notice: which node this process is, its role (the reclaimed node, or a
survivor that must restart), the torchrun agent it signals, and the named phases of a save a rehearsal holds at.
Real processes where a process is involved."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from preemptible import dist, phases
from preemptible.emergency import EXIT_PEER_NODE, NodeRole, node_role


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"GROUP_WORLD_SIZE": "2", "GROUP_RANK": "1"}, 1),
        ({"GROUP_WORLD_SIZE": "4", "GROUP_RANK": "0"}, 0),
        ({"GROUP_WORLD_SIZE": "1", "GROUP_RANK": "0"}, None),  # one node: no node roles
        ({"GROUP_RANK": "1"}, None),
        ({"GROUP_WORLD_SIZE": "2"}, None),
        ({"GROUP_WORLD_SIZE": "two", "GROUP_RANK": "1"}, None),
        ({}, None),
    ],
)
def test_the_node_comes_from_torchruns_group_variables(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: int | None
) -> None:
    for key in ("GROUP_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert dist.node() == expected


def test_the_node_that_announced_the_notice_is_reclaimed_the_others_survive() -> None:
    assert node_role({"rank": 3, "node": 1}, 1) is NodeRole.RECLAIMED
    assert node_role({"rank": 3, "node": 1}, 0) is NodeRole.SURVIVOR
    assert node_role({"rank": 3, "node": None}, 0) is None  # announced from one node's job: no roles
    assert node_role({"rank": 3}, 0) is None  # an announcement of an older version
    assert node_role(None, 0) is None
    assert node_role({"rank": 3, "node": 1}, None) is None
    assert EXIT_PEER_NODE not in (0, 1, 75, 143)  # never the platform's, a crash's or a failed save's
    # its own notice too (the whole job preempted): it goes as well, whichever node announced first
    assert node_role({"rank": 3, "node": 1}, 0, own_notice=True) is NodeRole.RECLAIMED
    assert dist.relayed("SIGTERM (seen by rank 3)") and not dist.relayed("SIGTERM") and not dist.relayed("")


AGENT = """
import os, signal, subprocess, sys
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append(1))
env = {**os.environ, "TORCHELASTIC_RUN_ID": "job"}
child = subprocess.run([sys.executable, "-c", os.environ["WORKER"]], env=env, check=False)
print("signalled" if got else "not signalled", child.returncode, flush=True)
"""

WORKER = """
from preemptible import dist
import os
print(dist.agent_pid() == os.getppid(), dist.leave_rendezvous(), flush=True)
"""


def agent_of(worker: str, *argv: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", AGENT, *argv],
        env={**os.environ, "WORKER": worker},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_a_reclaimed_worker_signals_its_torchrun_agent_and_nothing_else() -> None:
    # the parent's command line names torchrun's module, as `python -m torch.distributed.run` does
    assert agent_of(WORKER, "torch.distributed.run") == ["True", "True", "signalled", "0"]
    # any other parent is left alone
    assert agent_of(WORKER, "train.py") == ["False", "False", "not", "signalled", "0"]


def test_no_agent_outside_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert dist.agent_pid() is None and dist.leave_rendezvous() is False


def test_phases_are_marked_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(phases.PHASE_DIR_ENV, raising=False)
    phases.reached("written", 7, 0, "periodic")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(phases.PHASE_DIR_ENV, str(tmp_path))
    phases.reached("written", 7, 1, "periodic")
    assert (tmp_path / "rank1.written").read_text() == "7 periodic"


def test_a_hold_for_one_reason_lets_other_saves_pass_and_holds_its_own_until_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(phases.PHASE_DIR_ENV, str(tmp_path))
    hold = tmp_path / "hold.rank0.committed"
    hold.write_text("emergency")
    phases.reached("committed", 40, 0, "periodic")  # not held: returns at once
    phases.reached("committed", 40, 1, "emergency")  # another rank's hold: returns at once
    released = threading.Event()
    done = threading.Event()

    def save() -> None:
        phases.reached("committed", 42, 0, "emergency")
        assert released.is_set()  # it returned only after the hold was removed
        done.set()

    t = threading.Thread(target=save)
    t.start()
    assert not done.wait(0.5)  # held (the marker is written before the hold)
    assert (tmp_path / "rank0.committed").read_text() == "42 emergency"
    released.set()
    hold.unlink()
    t.join(30)
    assert done.is_set()
