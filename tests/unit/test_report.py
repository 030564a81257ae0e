"""`preemptible report`: goodput and badput from the journals of a run's attempts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import make_model
from preemptible import Run
from preemptible.cli import main


def attempt(root: Path, *, stop_at: int | None = None, notice_at: int | None = None) -> None:
    """One process's run of a 12-step job: a notice during step ``notice_at`` (emergency save), or the loop left
    after step ``stop_at`` without any (the machine gone: the steps since the last checkpoint are lost)."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = Run(root, model=model, optimizer=opt, save_every=4, exit_on_notice=False, async_save=False)
    for step in run.steps(12):
        run.log(loss=1.0 / (step + 1))
        if step == notice_at:
            run.guard.trigger(source="signal")
        if step == stop_at:
            break


def test_a_preempted_run_and_a_lost_one_are_accounted_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    attempt(tmp_path, notice_at=2)  # emergency checkpoint of step 3
    attempt(tmp_path, stop_at=6)  # periodic at 4; steps 4 and 5 completed, then gone during step 6 without a save
    attempt(tmp_path)  # resumes from 4, finishes
    assert main(["report", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["attempts"] == 3 and doc["finished"] is True
    runs = [(r["from_step"], r["to_step"], r["kept_steps"], r["redone_steps"]) for r in doc["runs"]]
    assert runs == [(0, 3, 3, 0), (3, 6, 1, 2), (4, 12, 8, 0)]
    (p,) = doc["preemptions"]
    assert (p["attempt"], p["step"], p["source"], p["steps_lost"], p["resumed_from"]) == (1, 3, "signal", 0, 3)
    assert p["window_s"] == 30.0 and 0 < p["window_used"] < 1
    parts = doc["goodput_s"] + sum(doc["badput_s"].values())
    assert parts == pytest.approx(doc["wall_s"], abs=0.01)  # every second of the wall time is in one place
    assert 0 < doc["goodput"] < 1 and doc["badput_s"]["redone_s"] > 0
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "attempts                   3    finished" in out and "2 redone" in out


def test_a_root_without_a_journal_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 0
    assert "no journal" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["report", str(tmp_path / "nope")])
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
