"""Public scripts' patterns, written here (`tests/scripts/ddp_tutorial.py`: the DDP tutorial's ``Trainer`` with its
batch-size peek and ``DistributedSampler.set_epoch``), under real torchrun with gloo: stopped by a notice mid-epoch,
or SIGKILLed after timed saves that only rank 0's (injected) clock decides, each resumes to the digest of a run never
stopped."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from conftest import REPO, final_digest
from torchrunkit import Torchrun, journals

SCRIPT = REPO / "tests" / "scripts" / "ddp_tutorial.py"
EPOCH = 6  # steps per epoch: 96 samples, 2 ranks, batches of 8


def saves_by_rank(root: Path) -> dict[int, list[int]]:
    return {
        rank: sorted({e["step"] for e in events if e["event"] == "save_committed"})
        for rank, events in journals(root).items()
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """Never stopped, with timed saves every 5 s of rank 0's clock (one second per step)."""
    root = tmp_path_factory.mktemp("ref") / "ckpt"
    code, out, err = Torchrun(root, 2, "--save-interval", "5", script=SCRIPT).finish()
    assert code == 0, err
    return final_digest(out), root


def test_timed_saves_under_torchrun_fall_at_the_same_steps_on_every_rank(reference: tuple[str, Path]) -> None:
    """save_interval_s with 2 ranks: rank 0's clock falls due 5 steps after each save, the other rank's never; both
    save at the step after rank 0's clock fell due (an all-reduce at every step keeps the other rank from passing
    it)."""
    saves = saves_by_rank(reference[1])
    assert saves == {0: [6, 12, 18], 1: [6, 12, 18]}, saves


def test_the_ddp_tutorial_shape_stopped_mid_epoch_resumes_to_the_same_digest(
    reference: tuple[str, Path], tmp_path: Path
) -> None:
    """The peek at a batch before `run.batches` draws from the global stream; a stop in the middle of epoch 1
    (after step 8 of 7..12) resumes that epoch with the batches and dropout masks it would have had."""
    root = tmp_path / "ckpt"
    code, out, err = Torchrun(root, 2, "--notice-at", "8", script=SCRIPT).finish()
    assert code == 0, err
    stops = {r: [e["step"] for e in ev if e["event"] == "exit"] for r, ev in journals(root).items()}
    assert stops == {0: [9], 1: [9]}, stops  # mid-epoch: the other rank waits in step 9's all-reduce
    code, out, err = Torchrun(root, 2, script=SCRIPT).finish()
    assert code == 0, err
    assert final_digest(out) == reference[0]
    assert not [e for ev in journals(root).values() for e in ev if e["event"] == "inexact_resume"]


def test_a_sigkill_after_timed_saves_loses_only_the_steps_since_the_last_one(
    reference: tuple[str, Path], tmp_path: Path
) -> None:
    """No notice: the whole job SIGKILLed mid-epoch (from step 14 on, once a timed save has committed: a marker the
    script writes there, then waits). The rerun resumes from the newest committed save and ends at the uninterrupted
    digest."""
    root, marker = tmp_path / "ckpt", tmp_path / "marker"
    t = Torchrun(root, 2, "--save-interval", "5", "--hang-at", "14", "--marker", str(marker), script=SCRIPT)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert t.proc.poll() is None and time.monotonic() < deadline, "the job ended or never reached the marker"
        time.sleep(0.05)
    at, saved = map(int, marker.read_text().split())
    workers = [e["pid"] for ev in journals(root).values() for e in ev if e["event"] == "start"]
    assert len(workers) == 2
    for pid in [t.proc.pid, *workers]:  # torchrun starts each worker in a session of its own: each by its pid
        os.kill(pid, signal.SIGKILL)
    t.proc.wait(30)
    committed = sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if (p / "COMMIT.json").exists())
    assert committed and saved <= committed[-1] <= at, (committed, at, saved)
    code, out, err = Torchrun(root, 2, "--save-interval", "5", script=SCRIPT).finish()
    assert code == 0, err
    resumed = [e["step"] for e in journals(root)[0] if e["event"] == "resume"]
    assert resumed == [committed[-1]]
    assert final_digest(out) == reference[0]
    assert re.search(rf"^step {at} ", out, re.M)  # the step it was killed in ran again after the resume
