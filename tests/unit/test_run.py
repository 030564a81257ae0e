from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from conftest import committed_steps, journal, make_model, train_some
from preemptible import Guard, PreemptibleError, Run, UnsupportedStateError, report
from preemptible.emergency import EXIT_SAVE_FAILED
from preemptible.journal import read as read_journal
from preemptible.store.io import LocalStorage


def parts(seed: int = 0) -> dict[str, Any]:
    model = make_model(seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return {"model": model, "optimizer": opt}


def committed(root: Path) -> list[int]:
    return committed_steps(root)


def test_fresh_run_saves_periodically_and_finishes(tmp_path: Path) -> None:
    p = parts()
    run = Run(tmp_path, save_every=3, keep=10, **p)
    seen = []
    for step in run.steps(8):
        train_some(p["model"], p["optimizer"], 1, start=step)
        run.log(loss=1.0 / (step + 1))
        seen.append(step)
    assert seen == list(range(8))
    assert committed(tmp_path) == [3, 6, 8]
    assert json.loads((tmp_path / "DONE.json").read_text())["step"] == 8
    events = [e["event"] for e in journal(tmp_path)]
    assert events[:2] == ["start", "fresh"]
    assert events[-1] == "done"
    assert events.count("log") == 8
    assert all({"t", "event", "step", "rank"} <= set(e) for e in journal(tmp_path))


def test_logged_tensors_and_numpy_scalars_are_journaled_as_numbers_the_report_plots(tmp_path: Path) -> None:
    """`run.log(loss=loss)` with the step's own loss tensor (it requires grad) records its number, not its text,
    without torch's warning about converting a tensor that requires grad; the report then has the figure."""
    p = parts()
    run = Run(tmp_path, **p)
    want = []
    for step in run.steps(3):
        x = torch.full((4, 8), float(step + 1))
        loss = p["model"](x).pow(2).mean()
        p["optimizer"].zero_grad()
        loss.backward()
        p["optimizer"].step()
        want.append(loss.item())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            run.log(loss=loss, lr=numpy.float32(0.25), acc=torch.tensor([0.5]), phase="warmup", v=torch.ones(3))
    logs = [e for e in journal(tmp_path) if e["event"] == "log"]
    assert [e["loss"] for e in logs] == want
    assert {(e["lr"], e["acc"], e["phase"]) for e in logs} == {(0.25, 0.5, "warmup")}
    assert all(isinstance(e["v"], str) for e in logs)  # not one figure: kept as its text, as before
    doc = report.summarize(read_journal(LocalStorage(str(tmp_path))))
    assert sorted(doc["figures"]) == ["acc", "loss", "lr"]
    assert [v for _, v, _ in doc["figures"]["loss"]] == want


def test_restart_resumes_after_newest_and_a_finished_run_yields_nothing(tmp_path: Path) -> None:
    p = parts()
    for step in Run(tmp_path, save_every=2, **p).steps(5):
        train_some(p["model"], p["optimizer"], 1, start=step)
    q = parts(seed=1)
    run = Run(tmp_path, **q)
    assert list(run.steps(5)) == []
    assert run.resumed_from == 5
    for k, v in p["model"].state_dict().items():
        assert torch.equal(q["model"].state_dict()[k], v)
    run = Run(tmp_path, **parts(seed=2))
    assert list(run.steps(7)) == [5, 6]  # extending the run continues it
    assert json.loads((tmp_path / "DONE.json").read_text())["step"] == 7


def test_notice_saves_at_the_boundary_and_exits_with_policy_code(tmp_path: Path) -> None:
    p = parts()
    run = Run(tmp_path, save_every=100, exit_code=143, **p)
    with pytest.raises(SystemExit) as info:
        for step in run.steps(50):
            train_some(p["model"], p["optimizer"], 1, start=step)
            if step == 6:
                run.guard.trigger(source="test")  # arrives mid-step; the boundary after step 6 saves
    assert info.value.code == 143
    assert committed(tmp_path) == [7]
    assert run.preempted
    assert run.step == 7
    events = journal(tmp_path)
    names = [e["event"] for e in events if e["event"] != "plan"]
    assert names[-4:] == ["notice", "save_started", "save_committed", "exit"]
    assert events[-1]["code"] == 143
    assert events[-1]["saved"] is True
    assert events[-3]["reason"] == "emergency"
    assert not (tmp_path / "DONE.json").exists()


def test_exit_on_notice_false_ends_the_loop_instead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = parts()
    run = Run(tmp_path, exit_on_notice=False, **p)
    steps = []
    for step in run.steps(50):
        steps.append(step)
        if step == 2:
            run.guard.trigger(source="test")
    assert steps == [0, 1, 2]
    assert run.preempted
    assert run.notice is not None
    assert run.notice.source == "test"
    assert committed(tmp_path) == [3]


def test_exit_code_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREEMPTIBLE_EXIT_CODE", "85")
    p = parts()
    run = Run(tmp_path, **p)
    with pytest.raises(SystemExit) as info:
        for step in run.steps(5):
            if step == 1:
                run.guard.trigger(source="test")
    assert info.value.code == 85


def test_notice_before_the_first_step_exits_with_nothing_to_save(tmp_path: Path) -> None:
    p = parts()
    guard = Guard([])
    guard.trigger(source="test")
    run = Run(tmp_path, guard=guard, exit_on_notice=False, **p)
    assert list(run.steps(5)) == []
    assert committed(tmp_path) == []
    names = [e["event"] for e in journal(tmp_path)]
    assert "save_skipped" in names
    assert "save_started" not in names


def test_notice_during_periodic_save_stops_at_the_same_boundary(tmp_path: Path) -> None:
    p = parts()
    run = Run(tmp_path, save_every=2, exit_on_notice=False, **p)
    original = run.checkpointer.save

    def save_then_notice(*a: Any, **k: Any) -> Any:
        handle = original(*a, **k)
        run.guard.trigger(source="test")  # as if SIGTERM landed while the periodic save was writing
        return handle

    run.checkpointer.save = save_then_notice  # type: ignore[method-assign]
    steps = list(run.steps(10))
    assert steps == [0, 1]
    assert committed(tmp_path) == [2]
    assert [e["reason"] for e in journal(tmp_path) if e["event"] == "save_skipped"] == ["emergency"]


def test_save_interval_uses_the_injected_clock(tmp_path: Path) -> None:
    now = [0.0]
    p = parts()
    run = Run(tmp_path, save_interval_s=10.0, monotonic=lambda: now[0], **p)
    for _step in run.steps(6):
        now[0] += 4.0  # each step "takes" 4 s: saves after steps 3 and 6 (>= 10 s since the last)
    assert committed(tmp_path) == [3, 6]


def test_failed_periodic_save_warns_and_training_continues(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = parts()
    run = Run(tmp_path, save_every=2, **p)
    original = run.checkpointer.save
    calls = [0]

    def flaky(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise OSError(28, "No space left on device")
        return original(*a, **k)

    run.checkpointer.save = flaky  # type: ignore[method-assign]
    assert list(run.steps(5)) == [0, 1, 2, 3, 4]
    assert committed(tmp_path) == [4, 5]
    assert "periodic save of step 2 failed, training continues" in caplog.text


def test_failed_emergency_save_exits_with_its_own_code(tmp_path: Path) -> None:
    p = parts()
    run = Run(tmp_path, **p)

    def broken(*a: Any, **k: Any) -> Any:
        raise OSError(28, "No space left on device")

    run.checkpointer.save = broken  # type: ignore[method-assign]
    with pytest.raises(SystemExit) as info:
        for step in run.steps(5):
            if step == 1:
                run.guard.trigger(source="test")
    assert info.value.code == EXIT_SAVE_FAILED
    assert journal(tmp_path)[-1]["saved"] is False


def test_handlers_live_only_while_steps_run(tmp_path: Path) -> None:
    import signal

    before = signal.getsignal(signal.SIGTERM)
    run = Run(tmp_path, **parts())
    assert signal.getsignal(signal.SIGTERM) == before  # nothing on construction
    for _ in run.steps(2):
        assert signal.getsignal(signal.SIGTERM) != before
    assert signal.getsignal(signal.SIGTERM) == before
    with Run(tmp_path / "b", **parts()) as run2:
        assert signal.getsignal(signal.SIGTERM) != before
        list(run2.steps(1))
        assert signal.getsignal(signal.SIGTERM) != before  # the context manager owns the lifetime
    assert signal.getsignal(signal.SIGTERM) == before


def test_bad_arguments_are_clear(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedStateError, match="reserves"):
        Run(tmp_path, _rng={})
    with pytest.raises(UnsupportedStateError, match="'lr' is a float"):
        Run(tmp_path, lr=0.1)
    with pytest.raises(ValueError, match="save_every"):
        Run(tmp_path, save_every=0)
    with pytest.raises(PreemptibleError, match="inside"):
        Run(tmp_path).log(loss=1.0)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"keep": 2.5}, "expected keep to be a whole number >= 2, found 2.5"),
        ({"keep": 1}, "keep"),
        ({"save_every": True}, "save_every"),
        ({"save_interval_s": float("nan")}, "finite number of seconds"),
        ({"save_interval_s": float("inf")}, "finite number of seconds"),
        ({"prestage_every": 0}, "prestage_every"),
        ({"save_every_epochs": 0}, "expected save_every_epochs to be a whole number >= 1 or None, found 0"),
        ({"save_every_epochs": 1.5}, "save_every_epochs"),
        ({"on_advisory": "maybe"}, "on_advisory"),
        ({"exit_code": "0"}, "exit_code"),
        ({"per_rank": ["nope"]}, r"per_rank names \['nope'\], which are not state entries"),
        ({"per_rank": [torch.nn.Linear(1, 1)]}, "one of Run's own keywords"),
        ({"compress": "fast"}, "expected compress=True, False or 'auto', found 'fast'"),
        ({"keep_best": ("loss", "avg")}, r"keep_best: expected \(figure, 'min' or 'max'\)"),
        ({"keep_best": "loss"}, "keep_best"),
        ({"probe_rtol": -1e-3}, "expected probe_rtol to be a finite relative tolerance >= 0"),
        ({"probe_rtol": float("nan")}, "probe_rtol"),
        ({"probe_rtol": "1e-3"}, "probe_rtol"),
    ],
)
def test_options_out_of_range_are_refused_when_run_is_built(
    tmp_path: Path, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        Run(tmp_path, model=torch.nn.Linear(2, 1), **options)


def test_reserved_names_are_run_s_own_keywords() -> None:
    from preemptible.run import RESERVED

    assert {"keep", "probe", "per_rank", "guard", "root"} <= RESERVED and "state" not in RESERVED


class Opaque:
    pass


def test_a_leaf_that_cannot_be_stored_is_an_error_when_run_is_built(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedStateError, match=r"extra/callback"):
        Run(tmp_path, extra={"callback": Opaque()})
    assert not list(tmp_path.glob("step-*"))


def test_state_that_appears_later_is_checked_at_every_save_and_the_error_reaches_the_caller(tmp_path: Path) -> None:
    extra: dict[str, Any] = {"epoch": 0}
    run = Run(tmp_path, save_every=2, extra=extra)
    seen = []
    with pytest.raises(UnsupportedStateError, match=r"extra/hook"):
        for step in run.steps(10):
            seen.append(step)
            if step == 0:
                extra["hook"] = Opaque()  # created lazily, like optimizer state: not storable
    assert seen == [0, 1]  # the periodic save at step 2 raised instead of "training continues"
    assert not list(tmp_path.glob("step-*/COMMIT.json"))


def test_advisory_notice_saves_early_and_training_continues(tmp_path: Path) -> None:
    from preemptible import NoticeKind

    p = parts()
    run = Run(tmp_path, save_every=100, **p)
    steps = []
    for step in run.steps(8):
        steps.append(step)
        if step == 2:
            run.guard.trigger(source="aws", kind=NoticeKind.REBALANCE, grace=None)
    assert steps == list(range(8))
    assert committed(tmp_path) == [3, 8]
    advisory = [e for e in journal(tmp_path) if e["event"] == "advisory"]
    assert len(advisory) == 1 and advisory[0]["step"] == 3 and advisory[0]["action"] == "save"


def test_advisory_can_stop_or_be_ignored(tmp_path: Path) -> None:
    from preemptible import NoticeKind

    run = Run(tmp_path / "stop", on_advisory="stop", exit_on_notice=False, **parts())
    steps = []
    for step in run.steps(8):
        steps.append(step)
        if step == 2:
            run.guard.trigger(source="aws", kind=NoticeKind.REBALANCE)
    assert steps == [0, 1, 2]
    assert committed(tmp_path / "stop") == [3]
    run = Run(tmp_path / "ignore", on_advisory="ignore", **parts())
    for step in run.steps(5):
        if step == 1:
            run.guard.trigger(source="aws", kind=NoticeKind.REBALANCE)
    assert committed(tmp_path / "ignore") == [5]
    with pytest.raises(ValueError, match="on_advisory"):
        Run(tmp_path, on_advisory="panic")


def test_sources_are_acknowledged_after_the_emergency_commit(tmp_path: Path) -> None:
    seen: list[tuple[str, list[int]]] = []

    class Recorder:
        name = "recorder"

        def start(self, sink: Any) -> None:
            pass

        def close(self) -> None:
            pass

        def acknowledge(self, notice: Any) -> None:
            seen.append((notice.source, committed(tmp_path)))

    run = Run(tmp_path, sources=[Recorder()], exit_on_notice=False, **parts())
    for step in run.steps(10):
        if step == 3:
            run.guard.trigger(source="test")
    assert seen == [("test", [4])]  # acknowledged once, after step 4 was committed


def test_kubernetes_default_exit_code_is_143(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    run = Run(tmp_path, **parts())
    with pytest.raises(SystemExit) as info:
        for step in run.steps(5):
            if step == 1:
                run.guard.trigger(source="test")
    assert info.value.code == 143


def fake_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """An ``scontrol`` first on PATH running ``body``, in a Slurm job that asks to be requeued."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\n{body}\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("PREEMPTIBLE_SLURM_REQUEUE", "1")


def notice_at_step_1(root: Path, **kw: Any) -> list[dict[str, Any]]:
    """A run that gets a notice during step 1; its requeue events."""
    run = Run(root, exit_on_notice=False, **kw, **parts())
    for step in run.steps(5):
        if step == 1:
            run.guard.trigger(source="signal")
    return [e for e in journal(root) if e["event"] == "requeue"]


def test_slurm_requeue_after_a_successful_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "scontrol-calls"
    fake_scontrol(tmp_path, monkeypatch, f'echo "$@" >> {calls}')
    assert notice_at_step_1(tmp_path / "ckpt")[0]["ok"] is True
    assert calls.read_text().split() == ["requeue", "4242"]
    calls.unlink()
    notice_at_step_1(tmp_path / "ckpt2", requeue=False)
    assert not calls.exists()


def test_slurm_requeue_survives_the_sigterm_that_ends_its_own_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requeue ends the step scontrol runs in: slurmstepd's SIGTERM may reach scontrol before it returns."""
    fake_scontrol(tmp_path, monkeypatch, 'kill -TERM $$\necho "requeued $2"')  # the step's SIGTERM, then the reply
    assert notice_at_step_1(tmp_path / "ckpt")[0]["ok"] is True


# `squeue --noheader --states=all --jobs J --Format=State:40,Requeue:12` of a real Slurm 22.05 job
# (scripts/slurm_cluster.py): the two fields padded to their widths, nothing else of the job.
SQUEUE = "{state:<40}{requeue:<12}"


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, squeue: str) -> Path:
    """``squeue`` printing ``squeue`` (a shell snippet), ``scontrol`` recording its calls (the requeue)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "scontrol-calls"
    (bin_dir / "squeue").write_text(f"#!/bin/sh\n{squeue}\n")
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    for name in ("squeue", "scontrol"):
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    return calls


def stop_at_step_1(tmp_path: Path) -> list[dict[str, Any]]:
    run = Run(tmp_path / "ckpt", exit_on_notice=False, **parts())
    for step in run.steps(5):
        if step == 1:
            run.guard.trigger(source="signal")
    return [e for e in journal(tmp_path / "ckpt") if e["event"] == "requeue"]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (("RUNNING", "1", ""), True),  # preempted, or a --signal before the time limit: comes back
        (("CANCELLED", "1", ""), False),  # scancel by its user: stays cancelled
        (("COMPLETING", "1", ""), False),
        (("RUNNING", "0", ""), False),  # not requeueable
        (("COMPLETING", "1", "1"), True),  # forced
        (("RUNNING", "1", "0"), False),  # off
    ],
)
def test_slurm_requeues_by_default_when_the_job_is_requeueable_and_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[str, str, str], expected: bool
) -> None:
    state, requeue, env = case
    calls = fake_slurm(tmp_path, monkeypatch, f'echo "{SQUEUE.format(state=state, requeue=requeue)}"')
    monkeypatch.setenv("PREEMPTIBLE_SLURM_REQUEUE", env)
    (event,) = stop_at_step_1(tmp_path)
    assert calls.exists() == expected
    assert event["ok"] is expected and event["why"]


@pytest.mark.parametrize(
    "output",
    [
        "printf 'RUNNING \\377\\376 1\\n'",  # bytes that are not UTF-8
        "printf 'RUNNING\\n'",  # one field
        "printf 'RUNNING 1\\nRUNNING 1\\n'",  # two jobs
        "printf 'JobState=RUNNING Requeue=1\\n'",  # what a job name could say, were it printed
        "exit 1",
    ],
    ids=["not-utf8", "one-field", "two-lines", "fields-in-text", "fails"],
)
def test_regression_50_7_a_slurm_answer_that_cannot_decide_is_journaled_and_the_exit_stays_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    """Issue 50 item 7: non-UTF-8 bytes from ``scontrol show job`` raised out of the requeue decision (traceback,
    exit 1); a job name holding ``JobState=RUNNING Requeue=1`` was read as those fields. squeue now prints only the
    two fields; anything but one line of a state and a flag is "cannot say": journaled, not requeued, no raise."""
    calls = fake_slurm(tmp_path, monkeypatch, output)
    monkeypatch.setenv("PREEMPTIBLE_SLURM_REQUEUE", "")
    (event,) = stop_at_step_1(tmp_path)
    assert event["ok"] is False and "could not say" in event["why"]
    assert not calls.exists()


def test_regression_50_7_the_squeue_query_never_prints_the_job_name() -> None:
    from preemptible.sources import slurm

    assert slurm.parse_job("x JobState=RUNNING Requeue=1 y RUNNING 1") is None
    assert slurm.parse_job(SQUEUE.format(state="RUNNING", requeue="1")) == {"JobState": "RUNNING", "Requeue": "1"}


def test_a_late_slurm_warning_after_a_finished_run_does_not_kill_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen on a loaded machine: the --signal USR1 arrived a moment after the final checkpoint; its default action
    ended the finished process, and Slurm recorded the job FAILED. (If this test breaks, the test process dies.)"""
    import os
    import signal

    monkeypatch.setenv("SLURM_JOB_ID", "5")
    previous = signal.getsignal(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        run = Run(tmp_path / "ckpt", **parts())
        for _ in run.steps(3):
            pass
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR1)  # ignored: the run is done
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        for _ in Run(tmp_path / "ckpt", **parts()).steps(3):  # already finished: no step runs, the same after
            raise AssertionError("a finished run ran a step")
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize("how", ["break", "error", "epochs"])
def test_leaving_the_loop_early_is_journaled_saves_nothing_and_a_rerun_resumes(tmp_path: Path, how: str) -> None:
    """Early stopping (a ``break`` out of `steps` or `epochs`) or an error in the loop body: the journal says the
    loop was left at that step, so a report does not take it for a kill; nothing is saved; a rerun resumes."""
    from preemptible import report

    p = parts()
    run = Run(tmp_path, save_every=3, keep=10, **p)
    if how == "epochs":
        for epoch in run.epochs(10):
            for _ in run.batches(range(2)):
                train_some(p["model"], p["optimizer"], 1, start=run.step)
            if epoch == 2:  # 6 steps done: the save of step 6 came first
                break
        left = 6
    else:
        with pytest.raises(RuntimeError, match="diverged") if how == "error" else contextlib.nullcontext():
            for step in run.steps(10):
                train_some(p["model"], p["optimizer"], 1, start=step)
                if step == 4:
                    if how == "error":
                        raise RuntimeError("loss diverged")
                    break
        left = 4
    exits = [e for e in journal(tmp_path) if e["event"] == "exit"]
    assert [(e["step"], e["reason"], e["saved"]) for e in exits] == [(left, "left the loop", False)]
    assert committed(tmp_path) == ([3, 6] if how == "epochs" else [3])
    assert report.summarize(journal(tmp_path))["runs"][0]["ended"] == "left the loop"
    rerun = Run(tmp_path, **parts(seed=1))
    assert rerun.start_step == (6 if how == "epochs" else 3)
    rerun.close()


def test_a_bad_mtbf_for_the_save_advice_is_refused_at_start_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``$PREEMPTIBLE_MTBF_HOURS`` feeds the Young/Daly advice: a value that is not hours > 0 is an error when the run
    starts (not after its first step), saying what was expected and found; ``plan`` exits 2 with the same words."""
    from preemptible.cli import main

    monkeypatch.setenv("PREEMPTIBLE_MTBF_HOURS", "-4")
    run = Run(tmp_path / "ckpt", model=torch.nn.Linear(2, 1), sources=())
    with pytest.raises(ValueError, match=r"expected \$PREEMPTIBLE_MTBF_HOURS to be a number of hours > 0, found '-4'"):
        _ = run.start_step
    run.close()
    assert not list((tmp_path / "ckpt").glob("step-*"))
    assert main(["plan", str(tmp_path), "--params", "1e6", "--bandwidth", "1e8", "--window", "30"]) == 2
    assert "found '-4'; unset it or fix it" in capsys.readouterr().err
