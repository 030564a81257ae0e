"""A Hugging Face Trainer run made preemption-safe: a tiny GPT-2 (2 layers, built from a config with random
weights: no download) trained on random token sequences, dropout on, the Trainer's standard data loading.
The three lines marked ``# preemptible`` are all it takes.

    python examples/hf_trainer.py --root /tmp/hf --epochs 3
    # kill -TERM <pid> mid-epoch, then the same command again: it resumes at that step, exactly
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from preemptible.integrations.transformers import PreemptibleCallback  # preemptible


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pace(TrainerCallback):
    """Prints each step and slows it down (a watchable demo; a drill's notice lands mid-epoch)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        print(f"step {state.global_step} rank {args.process_index}", flush=True)
        time.sleep(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True, help="checkpoint root")
    parser.add_argument("--out", default=None, help="the Trainer's output_dir (default: <root>-trainer)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--save-every", type=int, default=None)
    parser.add_argument("--no-exit", action="store_true", help="exit_on_notice=False: train() returns on a notice")
    parser.add_argument("--report-to", nargs="*", default=[], help="trackers: tensorboard, wandb")
    parser.add_argument("--hf-jit", action="store_true", help="also enable_jit_checkpoint (the callback replaces it)")
    parser.add_argument("--save-steps", type=int, default=None, help="the Trainer's own checkpoints, beside ours")
    parser.add_argument("--hf-resume", default=None, help="resume from one of the Trainer's own checkpoints instead")
    args = parser.parse_args()

    torch.set_num_threads(1)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.out or f"{args.root}-trainer",
        per_device_train_batch_size=4,
        num_train_epochs=args.epochs,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        logging_steps=5,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to=args.report_to,
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        enable_jit_checkpoint=args.hf_jit,
    )
    cb = PreemptibleCallback(args.root, save_every=args.save_every, exit_on_notice=not args.no_exit)  # preemptible
    trainer = Trainer(
        model=model, args=training, train_dataset=Tokens(args.samples, 16, 64), callbacks=[cb, Pace(args.step_time)]
    )
    trainer.train(resume_from_checkpoint=args.hf_resume or cb.resume_from)  # preemptible
    if cb.preempted:  # only with --no-exit: otherwise the process has ended with the exit policy's code
        print(f"preempted at global step {trainer.state.global_step}", flush=True)
        return
    print(f"finished at global step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
