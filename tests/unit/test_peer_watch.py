"""The peer watch (`dist.PeerWatch`): a rank or the store gone without a word is found within the timeout; a slow
job whose ranks all answer is never taken for a lost one. Ranks as threads against a real TCPStore on loopback;
the process exit is a recorder."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as c10d

from preemptible import dist

TIMEOUT_S = 4.0  # the stall takes half, the answers the other half: generous for a loaded machine


class Exits:
    def __init__(self) -> None:
        self.codes: list[int] = []
        self.found: list[dict[str, Any]] = []
        self.event = threading.Event()

    def on_lost(self, found: dict[str, Any]) -> None:
        self.found.append(found)

    def exit(self, code: int) -> None:
        self.codes.append(code)
        self.event.set()


def watches(port: int, ranks: list[int], world: int, exits: Exits) -> list[dist.PeerWatch]:
    return [
        dist.PeerWatch(
            dist.Coordinator(rank_=r, world=world, address=("127.0.0.1", port), timeout_s=3),
            timeout_s=TIMEOUT_S,
            on_lost=exits.on_lost,
            exit_code=76,
            exit=exits.exit,
        )
        for r in ranks
    ]


def until(predicate: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


@pytest.fixture
def server() -> Any:
    return c10d.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def test_a_stalled_job_whose_ranks_all_answer_is_not_a_loss(server: Any) -> None:
    exits = Exits()
    ws = watches(server.port, [0, 1, 2], 3, exits)
    try:  # nobody beats: every rank stalls, asks, and hears from all three
        until(lambda: all(w.probes >= 2 for w in ws), "two rounds of questions on every rank")
    finally:
        for w in ws:
            w.close()
    assert exits.codes == [] and exits.found == []


def test_a_rank_that_reaches_its_boundaries_never_asks(server: Any) -> None:
    exits = Exits()
    (w,) = watches(server.port, [0], 1, exits)
    try:
        end = time.monotonic() + TIMEOUT_S * 1.5
        while time.monotonic() < end:
            w.beat()
            time.sleep(0.05)
    finally:
        w.close()
    assert w.probes == 0 and exits.codes == []


def test_a_rank_gone_without_a_word_is_named_and_the_others_exit_76(server: Any) -> None:
    exits = Exits()
    ws = watches(server.port, [0, 1], 3, exits)  # rank 2's process vanished: nothing of it answers
    try:
        until(lambda: len(exits.codes) == 2, "both survivors exit")
    finally:
        for w in ws:
            w.close()
    assert exits.codes == [76, 76]
    assert all(f["missing"] == [2] for f in exits.found), exits.found
    assert all(f["timeout_s"] == TIMEOUT_S and f["stalled_s"] >= TIMEOUT_S / 2 for f in exits.found)
    assert all("did not answer" in f["how"] for f in exits.found)


def test_the_store_gone_with_its_host_is_a_loss_too() -> None:
    host = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import datetime, time, torch.distributed as d\n"
            "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False,"
            " timeout=datetime.timedelta(seconds=10))\n"
            "print(s.port, flush=True)\ntime.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        exits = Exits()
        ws = watches(port, [0, 1], 2, exits)
        host.kill()
        host.wait()
        try:
            until(lambda: len(exits.codes) == 2, "both ranks exit")
        finally:
            for w in ws:
                w.close()
    finally:
        host.kill()
    assert exits.codes == [76, 76]
    assert all(f["missing"] == [] and "unreachable" in f["how"] and str(port) in f["how"] for f in exits.found)


def test_the_timeout_comes_from_the_argument_the_environment_or_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(dist.PEER_TIMEOUT_ENV, raising=False)
    assert dist.peer_timeout(None) == dist.DEFAULT_PEER_TIMEOUT_S
    assert dist.peer_timeout(0) == 0 and dist.peer_timeout(45.5) == 45.5
    monkeypatch.setenv(dist.PEER_TIMEOUT_ENV, "90")
    assert dist.peer_timeout(None) == 90 and dist.peer_timeout(10) == 10
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv(dist.PEER_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=r"expected \$PREEMPTIBLE_PEER_TIMEOUT_S .* found") as e:
            dist.peer_timeout(None)
        assert bad in str(e.value)
    monkeypatch.delenv(dist.PEER_TIMEOUT_ENV)
    for value in (-1, float("inf"), True, "30"):
        with pytest.raises(ValueError, match="expected peer_timeout_s"):
            dist.peer_timeout(value)  # type: ignore[arg-type]


def test_run_refuses_a_bad_peer_timeout_before_anything_is_saved(tmp_path: Any) -> None:
    import torch

    from preemptible import Run

    with pytest.raises(ValueError, match="expected peer_timeout_s"):
        Run(tmp_path / "ckpt", model=torch.nn.Linear(2, 2), peer_timeout_s=-5)
    assert not (tmp_path / "ckpt").exists()


def test_a_collectives_error_about_a_gone_peer_is_told_from_other_errors() -> None:
    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.77.0.3]:7")
    assert dist.peer_failure(gloo) == f"RuntimeError: {gloo}"
    wrapped = ValueError("step failed")
    wrapped.__cause__ = ConnectionResetError(104, "Connection reset by peer")
    assert "Connection reset by peer" in (dist.peer_failure(wrapped) or "")
    assert dist.peer_failure(c10d.DistNetworkError("Failed to recv, got 0 bytes")) is not None
    for other in (RuntimeError("CUDA out of memory"), ValueError("shapes (3,) and (4,)"), KeyError("model")):
        assert dist.peer_failure(other) is None


def test_a_run_whose_collective_fails_on_a_gone_peer_journals_the_loss_and_exits_76(tmp_path: Any, server: Any) -> None:
    import torch

    from preemptible import Run
    from preemptible.journal import read

    run = Run(tmp_path / "ckpt", model=torch.nn.Linear(2, 2))
    exits = Exits()
    with pytest.raises(SystemExit) as stop, run:
        for _ in run.steps(3):
            run._peers = dist.PeerWatch(  # what a multi-node job's run starts (here: a world of one)
                dist.Coordinator(rank_=0, world=1, address=("127.0.0.1", server.port), timeout_s=3),
                timeout_s=600,
                on_lost=exits.on_lost,
                exit_code=76,
                exit=exits.exit,
            )
            raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.77.0.3]:7")
    assert stop.value.code == 76 and exits.codes == []
    assert isinstance(stop.value.__cause__, RuntimeError)
    (lost,) = [e for e in read(run.checkpointer.storage) if e["event"] == "peer_lost"]
    assert lost["how"].startswith("a collective failed: RuntimeError") and lost["timeout_s"] == 600
