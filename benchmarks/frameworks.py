"""The same preemption, four ways: the Hugging Face Trainer with its own ``enable_jit_checkpoint`` against
preemptible's callback, and Lightning's defaults (``ModelCheckpoint`` every 7 steps, ``save_last``) against
preemptible's callback.

Each case trains the same tiny model (examples/hf_trainer.py's 2-layer GPT-2; examples/lightning_fit.py's
regressor) with dropout on and the framework's standard data loading, gets one SIGTERM mid-epoch (a 30 s window),
is started again the way its documentation says, and runs to the end. Reported per case:
- notice -> commit: seconds from the SIGTERM to the newest checkpoint's last file written;
- committed: whether a checkpoint newer than the notice exists;
- steps lost: steps trained before the notice that the restart trains again;
- exact: whether the final weights and optimizer state equal an uninterrupted run's (a digest of both);
- code changed: lines of the training script touched to get this behaviour.

    .venv/bin/python benchmarks/frameworks.py            # about 2 minutes
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STOP_AT = 11  # SIGTERM when this step is printed: mid-epoch for both (16 and 20 steps per epoch)


def digest(*state_dicts: dict[str, Any]) -> str:
    import torch

    from preemptible.state import flatten

    h = hashlib.sha256()
    for i, sd in enumerate(state_dicts):
        for k, v in sorted(flatten({str(i): sd}).tensors.items()):
            h.update(k.encode())
            h.update(v.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


# children: one training process each ---------------------------------------------------------------------------
def hf_child(root: str, mode: str, step_time: float) -> None:
    import runpy

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    tokens = runpy.run_path(str(REPO / "examples" / "hf_trainer.py"))["Tokens"]

    class Pace(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            print(f"step {state.global_step}", flush=True)
            time.sleep(step_time)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32))
    native = mode == "native"
    training = TrainingArguments(
        output_dir=f"{root}/out", per_device_train_batch_size=4, num_train_epochs=3, learning_rate=1e-3,
        lr_scheduler_type="cosine", warmup_steps=5, logging_steps=5, save_strategy="no", report_to=[], use_cpu=True,
        seed=0, disable_tqdm=True, enable_jit_checkpoint=native,
    )  # fmt: skip
    callbacks: list[Any] = [Pace()]
    resume: Any = None
    if native:
        out = Path(f"{root}/out")
        resume = True if out.exists() and any(out.glob("checkpoint-*")) else None  # the documented resume
    else:
        from preemptible.integrations.transformers import PreemptibleCallback

        cb = PreemptibleCallback(f"{root}/ckpt")
        callbacks.insert(0, cb)
    trainer = Trainer(model=model, args=training, train_dataset=tokens(64, 16, 64), callbacks=callbacks)
    if not native:
        resume = cb.resume_from
    trainer.train(resume_from_checkpoint=resume)
    print(f"end step={trainer.state.global_step} digest={digest(model.state_dict(), trainer.optimizer.state_dict())}")


def pl_child(root: str, mode: str, step_time: float) -> None:
    import runpy

    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    regressor = runpy.run_path(str(REPO / "examples" / "lightning_fit.py"))["Regressor"]
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    loader = DataLoader(TensorDataset(torch.randn(160, 16, generator=g), torch.randn(160, 1, generator=g)), 8, True)
    native = mode == "native"
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=f"{root}/lightning", every_n_train_steps=7, save_last=True)
    callbacks: list[Any] = [ckpt]
    resume: Any = None
    if native:
        resume = f"{root}/lightning/last.ckpt" if Path(f"{root}/lightning/last.ckpt").exists() else None
    else:
        from preemptible.integrations.lightning import PreemptibleCallback

        cb = PreemptibleCallback(f"{root}/ckpt")
        callbacks.insert(0, cb)
        resume = cb.resume_from
    trainer = L.Trainer(
        max_epochs=3, accelerator="cpu", devices=1, callbacks=callbacks, enable_progress_bar=False,
        enable_model_summary=False, logger=False, default_root_dir=root,
    )  # fmt: skip
    module = regressor(step_time, None)
    trainer.fit(module, loader, ckpt_path=resume)
    opt = trainer.optimizers[0].state_dict()
    print(f"end step={trainer.global_step} digest={digest(module.state_dict(), opt)}", flush=True)


# the driver ----------------------------------------------------------------------------------------------------
def launch(framework: str, mode: str, root: Path, step_time: float) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREEMPTIBLE_", "SLURM_", "WANDB_"))}
    env["PREEMPTIBLE_SOURCES"] = "signal"
    cmd = [sys.executable, __file__, "child", framework, mode, str(root), str(step_time)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def newest_write(root: Path, since: float) -> float | None:
    times = [p.stat().st_mtime for p in root.rglob("*") if p.is_file() and "journal" not in p.parts]
    times = [t for t in times if t >= since]
    return max(times) if times else None


def case(framework: str, mode: str, reference: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"sbs-{framework}-{mode}-") as tmp:
        root = Path(tmp)
        proc = launch(framework, mode, root, 0.1)
        assert proc.stdout is not None
        trained = 0
        for line in proc.stdout:
            if line.startswith("step "):
                trained = int(line.split()[1])
                if trained >= STOP_AT:
                    break
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        for line in out.splitlines():
            if line.startswith("step "):
                trained = max(trained, int(line.split()[1]))
        first_code = proc.returncode
        went_on = "end step=" in out  # the script's code after train()/fit() ran as if training had finished
        committed_at = newest_write(root, t0)
        resumed = launch(framework, mode, root, 0.0)
        out2, err2 = resumed.communicate(timeout=300)
        first_step = next((int(x.split()[1]) for x in out2.splitlines() if x.startswith("step ")), None)
        end = next((x for x in out2.splitlines() if x.startswith("end ")), "")
        final_digest = end.split("digest=")[-1] if end else None
        return {
            "framework": framework,
            "mode": mode,
            "first_exit_code": first_code,
            "code_after_train_ran": went_on,
            "notice_to_commit_s": round(committed_at - t0, 2) if committed_at else None,
            "committed": committed_at is not None,
            "steps_trained_before_exit": trained,
            "resumed_at": (first_step - 1) if first_step is not None else None,
            "steps_lost": max(0, trained - (first_step - 1)) if first_step is not None else None,
            "exact": final_digest == reference,
            "resume_error": err2.strip().splitlines()[-1] if resumed.returncode != 0 else None,
        }


def reference(framework: str) -> str:
    with tempfile.TemporaryDirectory(prefix=f"sbs-{framework}-ref-") as tmp:
        proc = launch(framework, "native", Path(tmp), 0.0)
        out, err = proc.communicate(timeout=300)
        end = next(x for x in out.splitlines() if x.startswith("end ")) if "end " in out else err[-2000:]
        return end.split("digest=")[-1]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        framework, mode, root, step_time = sys.argv[2:6]
        (hf_child if framework == "hf" else pl_child)(root, mode, float(step_time))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = []
    for framework in ("hf", "lightning"):
        ref = reference(framework)
        for mode in ("native", "preemptible"):
            row = case(framework, mode, ref)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    recorded(main, "frameworks")
