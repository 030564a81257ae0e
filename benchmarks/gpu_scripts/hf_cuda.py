"""`examples/hf_trainer.py` on the GPU, for `benchmarks/gpu_suite.py`'s ``hf_callback`` check: a 2-layer GPT-2
built from a config (no download), dropout on, fp16 mixed precision on CUDA (the callback saves the Trainer's
GradScaler), eager attention (SDPA's memory-efficient backward is not deterministic), the Trainer's standard data
loading. Writes ``--marker`` at global step ``--marker-step`` (the parent then sends SIGTERM) and prints
``final step=N digest=HEX`` when training ends.

    python benchmarks/gpu_scripts/hf_cuda.py --root DIR [--marker FILE --marker-step K] [--device cpu]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("PREEMPTIBLE_SOURCES", "signal")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from preemptible.integrations.transformers import PreemptibleCallback


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Marker(TrainerCallback):
    def __init__(self, path: str | None, at: int, seconds: float) -> None:
        self.path, self.at, self.seconds = path, at, seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        print(f"step {state.global_step}", flush=True)
        if self.path and state.global_step == self.at:
            with open(self.path, "w") as f:
                f.write(str(state.global_step))
        if self.seconds:
            time.sleep(self.seconds)


def digest(trainer: Trainer) -> str:
    h = hashlib.sha256()
    for key, value in sorted(trainer.model.state_dict().items()):
        h.update(key.encode())
        h.update(value.detach().float().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    for index, entry in sorted(trainer.optimizer.state_dict()["state"].items()):
        for name, value in sorted(entry.items()):
            h.update(f"{index}/{name}".encode())
            if isinstance(value, torch.Tensor):
                h.update(value.detach().float().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--marker", default=None)
    parser.add_argument("--marker-step", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    cpu = args.device == "cpu"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)  # deterministic kernels where torch has them
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=64, n_positions=32)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=f"{args.root}-trainer",
        per_device_train_batch_size=4,
        num_train_epochs=args.epochs,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        use_cpu=cpu,
        fp16=not cpu,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    cb = PreemptibleCallback(args.root)
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Tokens(args.samples, 16, 64),
        callbacks=[cb, Marker(args.marker, args.marker_step, args.step_time)],
    )
    resume = cb.resume_from
    trainer.train(resume_from_checkpoint=resume)
    scaler = getattr(trainer.accelerator, "scaler", None)
    scale = scaler.get_scale() if scaler is not None else None
    print(
        f"final step={trainer.state.global_step} resumed={resume is not None} digest={digest(trainer)} "
        f"scale={scale} device={next(trainer.model.parameters()).device}",
        flush=True,
    )


if __name__ == "__main__":
    main()
