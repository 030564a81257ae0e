"""The Hugging Face Trainer with PreemptibleCallback (examples/hf_trainer.py: a 2-layer GPT-2 built from a config,
dropout on, the Trainer's standard data loading), in real processes: SIGTERM mid-epoch and an AWS notice from the
emulator through `preemptible drill`, a truncated newest checkpoint, exit_on_notice=False, 2-rank DDP under
torchrun with SIGTERM to one worker only. Every resume must end bit-identical to the run that was never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import REPO, clean_env, journal
from preemptible.checkpoint import Checkpointer
from preemptible.state import flatten
from torchrunkit import Torchrun, journals, last

HF = REPO / "examples" / "hf_trainer.py"
pytestmark = pytest.mark.timeout(300)


def drill(*args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "preemptible", "drill", "--json", *args],
        capture_output=True, text=True, env=clean_env(), timeout=280, check=False,
    )  # fmt: skip
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    except ValueError:
        raise AssertionError(f"drill printed no JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None


def trainer(root: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HF), "--root", str(root), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(**env),
    )  # fmt: skip


def wait_for_step(proc: subprocess.Popen[str], step: int) -> list[str]:
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(f"step {step} "):
            return lines
    raise AssertionError(f"never reached step {step}: {proc.communicate()[1][-3000:]}")


def final_tensors(root: Path) -> dict[str, torch.Tensor]:
    ck = Checkpointer(root)
    step = ck.latest()
    assert step is not None, f"no checkpoint under {root}"
    loaded = ck.load(step)
    return flatten({k: v for k, v in loaded.items() if k in ("model", "trainer")}).tensors


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, differ


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    root = tmp_path_factory.mktemp("ref") / "ckpt"
    proc = trainer(root, "--epochs", "2")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0 and "finished at global step 32" in out, err[-3000:]
    return final_tensors(root)


def test_sigterm_mid_epoch_commits_exits_inside_the_window_and_resumes(tmp_path: Path) -> None:
    """The drill's own checks (bit-identity to a run never stopped is shown by the fallback and DDP tests)."""
    code, doc, err = drill(
        "--at", "0.5", "--", sys.executable, str(HF), "--root", str(tmp_path / "ckpt"),
        "--epochs", "3", "--step-time", "0.05",
    )  # fmt: skip
    assert code == 0 and doc["passed"], json.dumps(doc, indent=1) + err[-3000:]
    assert doc["checkpoint_step"] == doc["resumed_step"] > 0 and doc["notice_to_exit_s"] < doc["window_s"]


def test_an_aws_notice_from_the_emulator_stops_the_trainer_inside_its_window(tmp_path: Path) -> None:
    code, doc, err = drill(
        "--source", "aws", "--at", "2", "--", sys.executable, str(HF), "--root", str(tmp_path / "ckpt"),
        "--epochs", "6", "--step-time", "0.1",
    )  # fmt: skip
    assert code == 0 and doc["passed"], json.dumps(doc, indent=1) + err[-3000:]
    assert doc["window_s"] == 120 and doc["checkpoint_step"] == doc["resumed_step"] > 0


def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_and_still_ends_identical(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    root = tmp_path / "ckpt"
    proc = trainer(root, "--epochs", "2", "--save-every", "4", "--step-time", "0.05")
    wait_for_step(proc, 10)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    steps = [c.step for c in Checkpointer(root).checkpoints()]
    newest = steps[-1]
    assert newest >= 10 and steps[-2] == newest - newest % 4 - (4 if newest % 4 == 0 else 0)
    model = root / f"step-{newest:012d}" / "model.safetensors"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])  # a torn write, after the commit

    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = trainer(root, "--epochs", "2", TMPDIR=str(temp))
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0 and "finished at global step 32" in out, err[-3000:]
    assert not list(temp.glob("preemptible-step-*"))  # the directory handed to the Trainer is not left behind
    assert f"skipping the checkpoint of step {newest}" in err
    assert f"resumes at global step {steps[-2]}" in err
    invalid = [e for e in journal(root) if e["event"] == "checkpoint_invalid"]
    assert [e["step"] for e in invalid] == [newest], invalid  # marked, then rotated away by later saves
    assert_same(final_tensors(root), reference)


def test_the_callback_replaces_the_trainer_s_own_sigterm_handling_and_exit_on_notice_false_returns(
    tmp_path: Path,
) -> None:
    """enable_jit_checkpoint=True as well: one SIGTERM, one stop, ours: no 3 s wait while training on, no pickled
    checkpoint-N from the Trainer's handler. With exit_on_notice=False, train() returns and cb.preempted says so."""
    root = tmp_path / "ckpt"
    args = ("--epochs", "2", "--hf-jit", "--no-exit", "--out", str(tmp_path / "out"), "--step-time", "0.05")
    proc = trainer(root, *args)
    wait_for_step(proc, 5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "preempted at global step" in out and "finished" not in out
    stopped = int(out.split("preempted at global step")[1].split()[0])
    exit_event = last(journal(root), "exit")
    assert exit_event["saved"] and exit_event["step"] == stopped >= 5  # ours: no 3 s of training on, no checkpoint-N
    assert Checkpointer(root).latest() == stopped
    assert not list((tmp_path / "out").glob("checkpoint-*"))
    logged = [e for e in journal(root) if e["event"] == "log"]  # the Trainer's logs (logging_steps=5), forwarded
    assert logged and {"loss", "learning_rate"} <= set(logged[0]) and logged[0]["step"] == 4, logged[:2]  # 0-based
    assert not any("train_runtime" in e or "train_loss" in e for e in logged)  # timings and a per-process average


def test_two_ranks_under_torchrun_stop_together_on_one_worker_s_sigterm_and_resume_identical(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ref_root = tmp_path_factory.mktemp("ddp-ref") / "ckpt"
    code, out, err = Torchrun(ref_root, 2, "--epochs", "2", script=HF).finish(240)
    assert code == 0 and out.count("finished at global step 16") == 2, err[-3000:]

    root = tmp_path / "ckpt"
    t = Torchrun(root, 2, "--epochs", "2", "--step-time", "0.1", script=HF)
    t.wait_for_step(4, timeout=180)
    os.kill(last(journals(root)[1], "start")["pid"], signal.SIGTERM)  # one worker only
    code, _, err = t.finish(180)
    assert code == 0, err[-3000:]
    ranks = journals(root)
    stops = {r: last(ev, "exit") for r, ev in ranks.items()}
    assert len({e["step"] for e in stops.values()}) == 1 and all(e["saved"] for e in stops.values()), stops
    stop = stops[0]["step"]
    assert 0 < stop < 16

    code, out, err = Torchrun(root, 2, "--epochs", "2", script=HF).finish(240)
    assert code == 0 and out.count("finished at global step 16") == 2, err[-3000:]
    assert_same(final_tensors(root), final_tensors(ref_root))


def test_training_without_resume_from_over_existing_checkpoints_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    proc = trainer(root, "--epochs", "1", "--no-exit", "--step-time", "0.05")
    wait_for_step(proc, 3)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    script = (  # the example as written, but with train() given nothing: cb.resume_from is never read
        "import sys, runpy\n"
        "from preemptible.integrations.transformers import PreemptibleCallback\n"
        "PreemptibleCallback.resume_from = property(lambda self: None)\n"
        "sys.argv = ['hf_trainer.py', '--root', sys.argv[1], '--epochs', '1']\n"
        f"runpy.run_path({str(HF)!r}, run_name='__main__')\n"
    )
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", script, str(root)], capture_output=True, text=True, env=clean_env(TMPDIR=str(temp)),
        timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "expected trainer.train(resume_from_checkpoint=cb.resume_from)" in proc.stderr, proc.stderr[-3000:]
    assert not list(temp.glob("preemptible-step-*"))  # nothing left behind by the refused start either


def test_trackers_tensorboard_flushed_and_wandb_marked_on_the_notice_and_continued_after(tmp_path: Path) -> None:
    """W&B in offline mode and TensorBoard files, no network: the notice flushes the Trainer's SummaryWriter (the
    losses logged before it are on disk) and marks the W&B run preempting; the restart continues the same W&B run id
    and TensorBoard at the resumed step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    args = ("--out", str(tmp_path / "out"), "--epochs", "3", "--report-to", "tensorboard", "wandb")
    root = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, str(HF), "--root", str(root), *args, "--step-time", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(**env), cwd=tmp_path,
    )  # fmt: skip
    wait_for_step(proc, 12)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    (tracked,) = [e for e in journal(root) if e["event"] == "trackers"]
    assert tracked["flushed"] == 1 and tracked["wandb"]["marked_preempting"] is True, tracked
    stop = tracked["step"]
    done = subprocess.run(
        [sys.executable, str(HF), "--root", str(root), *args], capture_output=True, text=True,
        env=clean_env(**env), cwd=tmp_path, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "finished at global step 48" in done.stdout, done.stderr[-3000:]
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(f"-{tracked['wandb']['id']}") for r in runs), runs  # one W&B run
    steps = []
    for logdir in sorted((tmp_path / "out" / "runs").iterdir()):
        events = EventAccumulator(str(logdir))
        events.Reload()
        steps.append([e.step for e in events.Scalars("train/loss")])
    assert len(steps) == 2 and steps[0] and max(steps[0]) <= stop < min(steps[1])  # flushed before the exit
    assert steps[0] + steps[1] == list(range(5, 49, 5))  # every log once, continued at the resumed step
