"""A Hugging Face Trainer under PreemptibleCallback, for the crash tests (tests/e2e/test_framework_crash.py): a
2-layer GPT-2 from a config, dropout on, 64 samples of 16 tokens, batch 4 (16 steps an epoch), the Trainer's own
``save_steps`` checkpoints in ``--out``.

``--hang-at K --marker PATH``: at the end of step K (once preemptible's step ``--committed`` is committed, when
given) it writes PATH and waits there to be killed, so a SIGKILL lands at a known step. ``--notice HOOK:K``: a
SIGTERM to itself from the Trainer hook HOOK (``train_begin``, ``step_begin``, ``step_end``) at global step K.
``--save-interval S``: the callback's timed saves, on an injected clock that advances one second per optimizer step.
"""

from __future__ import annotations

import argparse
import os
import signal
from typing import Any

import torch
from _scriptkit import hang_for_kill
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from preemptible.integrations.transformers import PreemptibleCallback


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        self.ids = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Rehearse(TrainerCallback):
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        hook, _, step = (args.notice or ":").partition(":")
        self.notice_hook, self.notice_step = hook, int(step or -1)

    def _notice(self, hook: str, step: int) -> None:
        if hook == self.notice_hook and step == self.notice_step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        print(f"began at global step {state.global_step}", flush=True)
        self._notice("train_begin", state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._notice("step_begin", state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._notice("step_end", state.global_step)
        if state.global_step == self.a.hang_at:
            hang_for_kill(self.a.marker, state.global_step, root=self.a.root, committed=self.a.committed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--out", required=True, help="the Trainer's output_dir")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--save-steps", type=float, default=8, help="the Trainer's own checkpoints; 0: none")
    parser.add_argument("--save-every", type=int, default=None)
    parser.add_argument("--no-fallback", action="store_true")
    parser.add_argument("--hang-at", type=int, default=None)
    parser.add_argument("--committed", type=int, default=None)
    parser.add_argument("--marker", default=None)
    parser.add_argument("--notice", default=None)
    parser.add_argument("--save-interval", type=float, default=None, help="seconds of a clock of one second a step")
    a = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32))
    save_steps = int(a.save_steps) if a.save_steps >= 1 else a.save_steps
    training = TrainingArguments(
        output_dir=a.out,
        per_device_train_batch_size=4,
        max_steps=a.steps,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        logging_steps=5,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    timed: dict[str, Any] = {}
    if a.save_interval:  # an injected clock: one second per optimizer step
        timed = {"save_interval_s": a.save_interval, "monotonic": lambda: float(trainer.state.global_step)}
    cb = PreemptibleCallback(a.root, save_every=a.save_every, framework_fallback=not a.no_fallback, **timed)
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=[cb, Rehearse(a)])
    print(f"resume from {cb.resume_from}", flush=True)
    trainer.train(resume_from_checkpoint=cb.resume_from)
    print(f"finished at global step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
