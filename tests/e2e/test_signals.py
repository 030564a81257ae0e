"""The example training script as a real process, preempted with real signals, then resumed."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from conftest import E2E_ARGS, Trainer, committed_steps, final_digest, journal, wait_for_event

SLOW = ("--step-time", "0.01")  # same results, slower steps: the signal lands mid-training


def committed(root: Path) -> list[int]:
    return committed_steps(root)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_signal_mid_training_saves_exits_and_resumes_bit_identically(
    tmp_path: Path, reference_digest: str, sig: signal.Signals
) -> None:
    root = tmp_path / "ckpt"
    t = Trainer(root, *E2E_ARGS, *SLOW)
    t.wait_for_step(60)
    t.signal(sig)
    code, out, err = t.finish()  # its timeout is the hang guard; the time to exit is a benchmark's business
    assert code == 0, err
    events = journal(root)
    notice = next(e for e in events if e["event"] == "notice")
    stop = notice["step"]
    assert notice["detail"] == sig.name
    assert notice["deadline"] is not None
    last_step_run = max(int(line.split()[1]) for line in out.splitlines() if line.startswith("step "))
    assert stop == last_step_run + 1, "the checkpoint must be of the boundary right after the last step run"
    assert stop in committed(root)
    assert [e["event"] for e in events if e["event"] != "plan"][-3:] == ["save_started", "save_committed", "exit"]
    assert "final" not in out

    code, out, err = Trainer(root, *E2E_ARGS).finish()
    assert code == 0, err
    assert f"resumed_from={stop}" in out
    assert final_digest(out) == reference_digest


BARE_LOOP = Path(__file__).parent.parent / "scripts" / "bare_loop.py"


@pytest.mark.parametrize(
    ("platform", "exit_code"), [({}, 0), ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, 143)], ids=["local", "k8s"]
)
def test_the_readmes_bare_loop_saves_a_planned_emergency_checkpoint_at_a_signal_and_resumes_bit_identically(
    tmp_path: Path, platform: dict[str, str], exit_code: int
) -> None:
    """The README's "Lower layers" loop (a `Guard` and a `Checkpointer`, saving only on a notice), as a stranger
    would copy it: SIGTERM mid-training, an emergency save of the step after the last one run, which refills the plan
    the loop made after its first step, the platform's exit code (143 in a Kubernetes pod, so its Job does not
    count it Succeeded; 0 elsewhere), and a resume bit-identical to a run never stopped."""
    code, out, err = Trainer(tmp_path / "ref", "--steps", "120", script=BARE_LOOP).finish()
    assert code == 0, err
    reference = final_digest(out)

    root = tmp_path / "ckpt"
    t = Trainer(root, "--steps", "120", "--step-time", "0.01", script=BARE_LOOP, env=platform)
    t.wait_for_step(40)
    t.signal(signal.SIGTERM)
    code, out, err = t.finish()
    assert code == exit_code, err
    assert "final " not in out
    last_step_run = max(int(line.split()[1]) for line in out.splitlines() if line.startswith("step "))
    stop = last_step_run + 1
    assert committed(root) == [stop]
    assert f"saved step={stop} plan=refilled" in out.splitlines()

    code, out, err = Trainer(root, "--steps", "120", script=BARE_LOOP, env=platform).finish()
    assert code == 0, err
    assert f"resumed_from={stop}" in out
    assert final_digest(out) == reference


BIG = ("--hidden", "2500", "--save-every", "3", "--width", "64")  # ~75 MB state: a save takes a while


def test_sigkill_during_save_leaves_previous_checkpoint_restorable(tmp_path: Path) -> None:
    ref = Trainer(tmp_path / "ref", *BIG, "--steps", "7").finish()
    assert ref[0] == 0, ref[2]
    root = tmp_path / "ckpt"
    t = Trainer(root, *BIG, "--steps", "7")
    wait_for_event(root, lambda e: e["event"] == "save_started" and e["step"] == 6)
    deadline = time.monotonic() + 30
    # plain or compressed (.safetensors.zst): auto decides by what the first save measured
    while not list(root.glob("step-000000000006.part-*/*.safetensors*")) and time.monotonic() < deadline:
        time.sleep(0.001)
    t.proc.kill()  # SIGKILL while the tensor files are being written
    t.finish()
    assert not any(e["event"] == "save_committed" and e["step"] == 6 for e in journal(root)), "killed too late"
    assert committed(root) == [3]
    (leftover,) = root.glob("step-000000000006.part-*")  # the torn save's own directory, invisible to restore
    assert not (root / "step-000000000006").exists()

    code, out, err = Trainer(root, *BIG, "--steps", "7").finish()
    assert code == 0, err
    assert "resumed_from=3" in out
    # step 6 written again in a directory of its own; step 3 stays as the newest validated checkpoint
    assert committed(root) == [3, 6, 7]
    assert leftover.exists()  # younger than stale_after_s: it could be another machine's save in progress
    assert final_digest(out) == final_digest(ref[1])


def test_second_sigterm_during_the_emergency_save_does_not_interrupt_it(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    t = Trainer(root, "--hidden", "4000", "--width", "64", "--save-every", "3", "--steps", "1000")  # a ~200 MB save
    wait_for_event(root, lambda e: e["event"] == "save_committed" and e["step"] == 3)
    t.wait_for_step(4)  # past the periodic save's boundary: the emergency save has new steps to write
    t.signal(signal.SIGTERM)
    wait_for_event(root, lambda e: e["event"] == "save_started" and e["reason"] == "emergency")
    t.signal(signal.SIGTERM)
    t.signal(signal.SIGTERM)
    code, _, err = t.finish()
    assert code == 0, err
    events = journal(root)
    exit_event = events[-1]
    assert exit_event["event"] == "exit"
    assert exit_event["saved"] is True
    assert exit_event["later_notices"] >= 1, "the repeated SIGTERMs arrived after the save had started"
    assert exit_event["step"] in committed(root)


def test_item_9_a_storm_of_sigterms_still_exits_with_the_policy_code(tmp_path: Path) -> None:
    """Regression (issue 14, item 9): handlers were restored before teardown, so a late SIGTERM made it 143."""
    root = tmp_path / "ckpt"
    t = Trainer(root, *E2E_ARGS, *SLOW)
    t.wait_for_step(20)
    sent = 0
    while t.proc.poll() is None and sent < 5000:  # until it has exited: every phase of the stop gets some
        try:
            t.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            break
        sent += 1
        time.sleep(0.0005)
    code, _, err = t.finish()
    assert code == 0, f"exit {code} after {sent} SIGTERMs: {err[-2000:]}"
    exit_event = [e for e in journal(root) if e["event"] == "exit"][-1]
    assert exit_event["saved"] is True and exit_event["step"] in committed(root)
    assert sent > 1
