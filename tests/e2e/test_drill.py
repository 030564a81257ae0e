"""preemptible drill against the example training script, for every notice source, with real processes, real
signals and the real metadata emulators; plus drills that must fail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLE, clean_env
from preemptible.diagnose import diagnose
from preemptible.events import Event
from preemptible.journal import Record

TRAIN = [sys.executable, str(EXAMPLE), "--steps", "100000", "--save-every", "1000", "--step-time", "0.005"]


def drill(*args: str, timeout: float = 240) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "preemptible", "drill", "--json", *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=timeout,
        check=False,
    )
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"drill printed no JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None
    return proc.returncode, doc, proc.stderr


@pytest.mark.parametrize("source", ["signal", "sigint", "slurm", "aws", "gcp", "azure"])
def test_drill_every_source(source: str, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    code, doc, err = drill("--source", source, "--at", "0.5", "--", *TRAIN, "--root", str(root))
    assert code == 0 and doc["passed"], json.dumps(doc, indent=1) + err
    assert doc["checkpoint_step"] == doc["resumed_step"] and doc["checkpoint_step"] > 0
    assert 0 < doc["notice_to_exit_s"] < doc["window_s"]
    assert doc["timings"]["notice_to_boundary_s"] <= doc["timings"]["notice_to_commit_s"] <= doc["notice_to_exit_s"]
    assert doc["root"] == str(root)
    expected = {"aws": 120, "gcp": 30, "azure": 30, "slurm": 60}.get(source, 30)
    assert doc["window_s"] == expected
    # the run's own journal, read after the fact, tells the same story
    verdict = diagnose(root=str(root)).verdict
    assert verdict == ("preempted" if source in ("aws", "gcp", "azure") else "terminated")


def test_drill_with_reference_proves_the_resume_bit_exact(tmp_path: Path) -> None:
    """A loop of run.steps has no epochs: the default mid-epoch aim falls back to a time within the reference loop."""
    root = tmp_path / "ckpt"
    args = ("--steps", "400", "--save-every", "100", "--step-time", "0.004", "--root", str(root))
    code, doc, err = drill("--reference", "--", sys.executable, str(EXAMPLE), *args)
    assert code == 0 and doc["passed"], json.dumps(doc, indent=1) + err
    names = [c["name"] for c in doc["checks"]]
    assert "final state bit-identical to the uninterrupted run" in names
    assert 0 < doc["checkpoint_step"] < 400
    assert doc["moment"]["aim"] == "seconds" and "not a loop of run.epochs/run.batches" in doc["moment"]["why"]


def test_a_drill_fails_when_the_window_is_missed(tmp_path: Path) -> None:
    code, doc, _ = drill("--window", "0.001", "--at", "0.3", "--", *TRAIN, "--root", str(tmp_path / "ckpt"))
    assert code == 1 and not doc["passed"]
    failed = [c["name"] for c in doc["checks"] if not c["passed"]]
    assert failed == ["exit within the window"]


def test_the_final_state_comparison_sees_a_difference(tmp_path: Path) -> None:
    import torch

    from preemptible import Checkpointer
    from preemptible.drill import Drill

    def final(root: Path, seed: int) -> dict[str, str] | None:
        torch.manual_seed(seed)
        Checkpointer(str(root)).save({"model": torch.nn.Linear(4, 4)}, 10)
        return Drill._final_state(str(root), 10)

    assert final(tmp_path / "a", 0) == final(tmp_path / "b", 0)
    assert final(tmp_path / "c", 0) != final(tmp_path / "d", 1)


def test_names_of_files_the_runs_wrote_are_set_aside_and_paths_to_older_files_are_not(tmp_path: Path) -> None:
    """Both runs of a --reference drill write the framework's checkpoints to one directory, so the second one's
    names carry a version suffix (Lightning's ``-v1``): not a difference of the resume. A path into a directory
    nobody wrote during the drill (data the runs read) still counts."""
    import os
    import time

    import torch

    from preemptible import Checkpointer
    from preemptible.drill import Drill, explain_difference

    data = tmp_path / "data"
    data.mkdir()
    for name in ("shard-1.bin", "shard-2.bin"):
        (data / name).write_bytes(b"x")
    os.utime(data, (time.time() - 3600, time.time() - 3600))  # written long before the drill
    since = time.time() - 2.0
    written = tmp_path / "lightning" / "checkpoints"
    written.mkdir(parents=True)

    def final(root: Path, suffix: str, shard: str) -> Path:
        best = str(written / f"epoch=2-step=56{suffix}.ckpt")
        (written / f"epoch=2-step=56{suffix}.ckpt").write_bytes(b"ckpt")
        torch.manual_seed(0)
        meta = {"best_model_path": best, "best_k_models": {best: 0.5}, "score": 0.5, "shard": str(data / shard)}
        Checkpointer(str(root)).save({"model": torch.nn.Linear(4, 4), "meta": meta}, 10).wait()
        return root

    a, b = final(tmp_path / "a", "", "shard-1.bin"), final(tmp_path / "b", "-v1", "shard-1.bin")
    assert Drill._final_state(str(a), 10) != Drill._final_state(str(b), 10)  # as compared before
    assert Drill._final_state(str(a), 10, written_since=since) == Drill._final_state(str(b), 10, written_since=since)
    c = final(tmp_path / "c", "-v2", "shard-2.bin")  # another shard read: a real difference
    assert Drill._final_state(str(a), 10, written_since=since) != Drill._final_state(str(c), 10, written_since=since)
    text = explain_difference(str(a), str(c), 10, written_since=since)
    assert "1 non-tensor values differ" in text and "meta/shard" in text and "best_model_path" not in text


def test_a_difference_is_explained_by_entry_with_the_likely_causes(tmp_path: Path) -> None:
    import torch

    from preemptible import Checkpointer
    from preemptible.drill import explain_difference

    def save(root: Path, bias: float, counter: int, log: list[float]) -> None:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        with torch.no_grad():
            model.bias[0] += bias
        state = {"model": model, "meta": {"seen": counter, "log_history": log, "train_runtime": 1.0 + bias}}
        Checkpointer(str(root)).save(state, 10).wait()

    save(tmp_path / "ours", 0.5, 7, [1.0])
    save(tmp_path / "theirs", 0.0, 8, [2.0])
    text = explain_difference(str(tmp_path / "ours"), str(tmp_path / "theirs"), 10)
    assert "1 of 2 tensors differ" in text and "model/bias: 1 of 4 values, max |difference| 0.5" in text
    assert "meta/seen (7 vs 8)" in text  # a counter that is not where the uninterrupted run had it
    assert "log_history" not in text and "runtime" not in text  # records and timings are not training state
    assert "prefetched" in text and "run.batches" in text  # the likely causes, named


def test_a_drill_fails_for_a_command_without_a_run(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = drill("--start-timeout", "3", "--", sys.executable, "-c", "import time; time.sleep(30)", timeout=60)
    assert code == 1 and not doc["passed"]
    (check,) = doc["checks"]
    assert check["name"] == "the command's Run started" and "PREEMPTIBLE_REPORT_FILE" in check["detail"]


def test_drill_text_report_and_bad_arguments() -> None:
    from preemptible.drill import Check, DrillReport

    report = DrillReport("aws", 120.0, ["python", "train.py"], timings={"notice_to_exit_s": 1.5})
    report.checks += [
        Check("the notice reached the run", True, "aws terminate"),
        Check("exit within the window", False),
    ]
    text = report.render()
    assert "PASS  the notice reached the run" in text and "FAIL  exit within the window" in text
    assert "notice -> process exited" in text and "(1% of the window)" in text and "FAILED: 1/2 checks" in text
    bad = subprocess.run(
        [sys.executable, "-m", "preemptible", "drill", "--at", "soon", "--", "true"],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=False,
    )
    assert bad.returncode == 2 and "expected seconds, 'random' or 'mid-epoch'" in bad.stderr


HANGS_AFTER_THE_LOOP = """
import sys, time, torch, preemptible
model = torch.nn.Linear(4, 1)
run = preemptible.Run(sys.argv[1], model=model, exit_on_notice=False)
for step in run.steps(100_000):
    time.sleep(0.005)
print("evaluating on the whole test set", flush=True)  # after the notice, where a stopped run should exit
time.sleep(600)
"""


def test_a_run_that_outlives_its_notice_is_reported_with_what_it_last_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import preemptible.drill._drill as drill_module

    monkeypatch.setattr(drill_module, "SLACK_S", 2.0)  # the drill's wait past the window, shortened for the test
    monkeypatch.setenv("PREEMPTIBLE_SOURCES", "signal")
    script = tmp_path / "train.py"
    script.write_text(HANGS_AFTER_THE_LOOP)
    report = drill_module.Drill(
        [sys.executable, str(script), str(tmp_path / "ckpt")], at=0.3, window=1.0, start_timeout=120
    ).run()
    assert not report.passed
    failed = [c for c in report.checks if not c.passed]
    assert [c.name for c in failed] == ["the process exited after the notice"]
    detail = failed[0].detail
    assert detail.startswith("still running 3 s after it; its Run stopped at step")
    assert "chose exit code 0" in detail and "code after the loop" in detail
    assert detail.rstrip().endswith("evaluating on the whole test set")


LINGERS_AFTER_A_SHORT_LOOP = """
import sys, time, torch, preemptible
model = torch.nn.Linear(4, 1)
for step in preemptible.Run(sys.argv[1], model=model).steps(5):
    pass
print("uploading the results", flush=True)  # the loop is over: a signal now would only kill this
time.sleep(600)
"""


def test_a_notice_after_the_loop_has_ended_fails_the_drill_with_what_to_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop ends before the notice is due while the process lives on: the drill says so and sends nothing,
    instead of killing what runs after the loop and reporting a missed notice and an unclean exit."""
    import preemptible.drill as drill_module

    monkeypatch.setenv("PREEMPTIBLE_SOURCES", "signal")
    script = tmp_path / "train.py"
    script.write_text(LINGERS_AFTER_A_SHORT_LOOP)
    lines: list[str] = []
    report = drill_module.Drill(
        [sys.executable, str(script), str(tmp_path / "ckpt")], at=1.0, start_timeout=120, progress=lines.append
    ).run()
    assert not report.passed
    assert [(c.name, c.passed) for c in report.checks] == [
        ("the command's Run started", True),
        ("the run is still training when the notice comes", False),
    ]
    detail = report.checks[-1].detail
    assert detail.startswith("its loop ended at step 5, before the notice 1 s into it")
    assert "a smaller --at" in detail and "make the run longer" in detail
    assert not any("sent" in line for line in lines)  # no signal went out


def test_a_reference_loop_shorter_than_the_notice_delay_fails_before_the_drilled_run(tmp_path: Path) -> None:
    args = ("--steps", "5", "--step-time", "0.001", "--root", str(tmp_path / "ckpt"))
    code, doc, err = drill("--reference", "--at", "30", "--", sys.executable, str(EXAMPLE), *args)
    assert code == 1 and not doc["passed"]
    assert [(c["name"], c["passed"]) for c in doc["checks"]] == [
        ("reference run finished uninterrupted", True),
        ("the run is still training when the notice comes", False),
    ]
    detail = doc["checks"][-1]["detail"]
    assert detail.startswith("the reference run's loop ended ") and "before the notice 30 s into it" in detail
    assert "--at " in detail and "starting the command (first)" not in err  # the drilled run never started


def test_a_random_notice_falls_within_a_short_reference_loop() -> None:
    import preemptible.drill as drill_module

    d = drill_module.Drill(["true"], at="random")
    d._loop_s = 2.0
    delays = [d._delay() for _ in range(200)]
    assert all(0.4 <= x <= 1.6 for x in delays)
    d._loop_s = 60.0
    assert all(1.0 <= d._delay() <= 10.0 for _ in range(200))


EPOCH_LOOP = [sys.executable, str(Path(__file__).parent.parent / "scripts" / "epoch_loop.py")]
"""3 epochs of 8 batches, the loss logged at each step (tests/scripts/epoch_loop.py)."""


def _held(root: Path) -> tuple[Record, Record]:
    """The drilled start's mid-epoch hold and the notice it stopped on, from the run's own journal."""
    from preemptible.journal import records
    from preemptible.store.io import LocalStorage

    events = list(records(LocalStorage(str(root))))
    held = [r for r in events if r.event == Event.PROGRESS and r.get("held") is True]
    notices = [r for r in events if r.event == Event.NOTICE]
    assert len(held) == 1 and len(notices) == 1, events
    return held[0], notices[0]


def test_a_reference_drill_stops_mid_epoch_and_names_the_first_step_an_inexact_resume_changed(tmp_path: Path) -> None:
    """The script keeps a counter outside the Run's state in its loss (a resume inexact on purpose): the drill stops
    it in the middle of an epoch by default, fails, and names the first step whose logged loss differs: the first
    one after the resume."""
    root = tmp_path / "ckpt"
    code, doc, err = drill("--reference", "--", *EPOCH_LOOP, "--root", str(root), "--inexact")
    assert code == 1 and not doc["passed"], json.dumps(doc, indent=1) + err
    moment = doc["moment"]
    assert moment["aim"] == "mid-epoch" and moment["epoch"] == 1 and 0 < moment["batches_done"] < 8
    assert doc["checkpoint_step"] == doc["resumed_step"] == moment["step"] == 12
    first = doc["first_differing_step"]
    assert first["step"] == 12 and first["figure"] == "loss" and not first["before_the_stop"]
    assert isinstance(first["ours"], float) and isinstance(first["reference"], float)
    assert first["ours"] != first["reference"]
    failed = {c["name"]: c["detail"] for c in doc["checks"] if not c["passed"]}
    assert list(failed) == [
        "figures logged at each step equal the uninterrupted run's",
        "final state bit-identical to the uninterrupted run",
    ]
    detail = failed["figures logged at each step equal the uninterrupted run's"]
    assert detail.startswith("first differing step: step 12, the first after the resume at step 12")
    assert f"loss {first['ours']!r} in the drilled run, {first['reference']!r} in the uninterrupted one" in detail
    held, notice = _held(root)
    assert held.step == notice.step == 12 and held.get("epoch_batches") == 8


def test_a_reference_drill_of_an_exact_epoch_loop_passes_with_its_stop_mid_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from preemptible.drill import Drill

    monkeypatch.setenv("PREEMPTIBLE_SOURCES", "signal")
    root = tmp_path / "ckpt"
    report = Drill([*EPOCH_LOOP, "--root", str(root)], reference=True).run()
    assert report.passed, report.render()
    text = report.render()
    assert "stop: mid-epoch: epoch 1 (0-based, as run.epochs counts), after 4 of 8 batches (step 12)" in text
    assert "PASS  figures logged at each step equal the uninterrupted run's" in text
    assert report.first_differing_step is None
    held, notice = _held(root)  # from the journal: the stop was not at an epoch boundary
    assert held.step == notice.step and 0 < held.get("batches_done") < held.get("epoch_batches")
    assert held.step % 8 != 0


def test_a_crash_rehearsal_resumes_from_the_last_periodic_save_and_ends_as_the_uninterrupted_run(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ckpt"
    code, doc, err = drill("--kill", "--reference", "--", *EPOCH_LOOP, "--root", str(root), "--save-every", "5")
    assert code == 0 and doc["passed"], json.dumps(doc, indent=1) + err
    assert doc["mode"] == "kill" and doc["moment"]["step"] == 12
    # the save of step 10 runs in the background: a kill at step 12 may come before it commits (a real crash's luck)
    assert doc["checkpoint_step"] == doc["resumed_step"] in (5, 10)
    assert doc["steps_lost"] == 12 - doc["resumed_step"]
    names = [c["name"] for c in doc["checks"]]
    assert "the process died of SIGKILL (crash rehearsal)" in names
    assert "final state bit-identical to the uninterrupted run" in names
    assert not any("window" in n or "notice" in n for n in names)  # no notice, no emergency save to grade
    assert "drill: sent SIGKILL" in err


def test_a_crash_rehearsal_without_periodic_saves_starts_over_and_counts_the_steps_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from preemptible.drill import Drill

    monkeypatch.setenv("PREEMPTIBLE_SOURCES", "signal")
    report = Drill([*EPOCH_LOOP, "--root", str(tmp_path / "ckpt")], kill=True, at="mid-epoch").run()
    assert report.passed, report.render()
    assert report.checkpoint_step is None and report.resumed_step == 0
    assert report.steps_lost == report.moment["step"] == 12
    text = report.render()
    assert text.startswith("preemptible drill: crash rehearsal (SIGKILL, no notice, no emergency save)")
    assert "none committed, so a fresh start at step 0; resumed at step 0; 12 steps lost (redone)" in text
