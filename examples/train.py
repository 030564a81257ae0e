"""A small CPU training run made preemption-safe with preemptible.

Deterministic data derived from the step, dropout (so the RNG state matters), AdamW and an LR schedule: a
resumed run ends bit-identical to one that was never interrupted. Prints one line per step and, at the end,
a digest of the model and optimizer state.

    python examples/train.py --root /tmp/ckpt --steps 300
    # in another shell: kill -TERM <pid>; then run the same command again to resume
"""

from __future__ import annotations

import argparse
import hashlib
import time

import torch

import preemptible
import preemptible.state


def batch(step: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(64, width, generator=g)
    y = (x[:, : width // 2].sum(dim=1, keepdim=True) > 0).float()
    return x, y


def digest(*objects: torch.nn.Module | torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for obj in objects:
        for key, value in preemptible.state.flatten({"x": obj.state_dict()}).tensors.items():
            h.update(key.encode())
            h.update(value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True, help="checkpoint directory")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step (makes a demo watchable)")
    parser.add_argument("--width", type=int, default=32, help="input width")
    parser.add_argument("--hidden", type=int, default=64, help="hidden width (state grows with its square)")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(args.width, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(args.hidden, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(args.hidden, 1),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warmup = 20
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.1, 1 - s / args.steps)
    )
    loss_fn = torch.nn.BCEWithLogitsLoss()

    run = preemptible.Run(args.root, model=model, optimizer=optimizer, scheduler=scheduler, save_every=args.save_every)
    for step in run.steps(args.steps):
        x, y = batch(step, args.width)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 10 == 0:
            run.log(loss=loss.item(), lr=scheduler.get_last_lr()[0])
        print(f"step {step} loss {loss.item():.5f}", flush=True)
        if args.step_time:
            time.sleep(args.step_time)
    print(f"final step={run.step} resumed_from={run.resumed_from} digest={digest(model, optimizer)}", flush=True)


if __name__ == "__main__":
    main()
