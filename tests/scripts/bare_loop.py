"""The custom loop of docs/porting.md as it stands: a `Guard` and a `Checkpointer`, no `Run`, saving only on a
notice (plus a line saying how its save was planned). Deterministic data from the step and dropout (the RNG state
matters), so a resumed run ends bit-identical to one never interrupted. Prints a line per step and, at the end, a
digest of the model and optimizer state.

    python tests/scripts/bare_loop.py --root DIR --steps 200 [--step-time 0.01]
"""

from __future__ import annotations

import argparse
import time

import torch
from _scriptkit import digest

import preemptible
import preemptible.state


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(20_000 + step)
    x = torch.randn(32, 16, generator=g)
    y = (x[:, :8].sum(dim=1, keepdim=True) > 0).float()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-time", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 32), torch.nn.Linear(32, 1)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    total = args.steps

    # From here on, the docs' loop.
    guard = preemptible.Guard()
    ckpt = preemptible.Checkpointer(args.root, keep=3, per_rank=["rng"])
    state = {"model": model, "optimizer": optimizer, "rng": preemptible.RNGState()}
    start = ckpt.restore(state) or 0
    with guard:
        for step in range(start, total):
            train_step(model, optimizer, step)
            if step == start:
                ckpt.prepare(state)
            print(f"step {step} run", flush=True)
            if args.step_time:
                time.sleep(args.step_time)
            if guard.should_stop(step + 1):
                notice = guard.notice
                deadline = notice.deadline.timestamp() if notice and notice.deadline else None
                ckpt.save(state, step + 1, reason="emergency", deadline=deadline)
                guard.acknowledge(notice)
                print(f"saved step={step + 1} plan={ckpt.steady.last}", flush=True)  # not in the docs: for the test
                raise SystemExit(guard.platform.exit_code)
    print(f"final resumed_from={start} digest={digest({'model': model, 'optimizer': optimizer})}", flush=True)


if __name__ == "__main__":
    main()
