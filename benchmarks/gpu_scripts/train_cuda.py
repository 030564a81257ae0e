"""A CUDA training loop under `preemptible.Run` (the README's quickstart), for `benchmarks/gpu_suite.py`'s
``sigterm_resume`` check: dropout on, mixed precision, data derived from the step, a real SIGTERM mid-run.

    python benchmarks/gpu_scripts/train_cuda.py --root DIR --variant bf16|fp16 [--marker FILE --marker-step K]

``bf16``: bf16 autocast, AdamW and a LambdaLR scheduler. ``fp16``: fp16 autocast with ``torch.amp.GradScaler``
(its scale and growth tracker are saved: passed to `Run` as a keyword like the scheduler), an init scale high
enough that the first steps overflow and are skipped. Writes ``--marker`` after step ``--marker-step`` (the
parent then sends SIGTERM), sleeps ``--step-time`` per step so the signal lands mid-run, and prints
``final resumed_from=N digest=HEX scale=S`` at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (before CUDA starts)
os.environ.setdefault("PREEMPTIBLE_SOURCES", "signal")  # no cloud metadata probes on a machine with no network

import torch

import preemptible


def build(device: str, variant: str) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.GELU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(256, 256),
        torch.nn.GELU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(256, 8),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if variant == "bf16":
        extra: Any = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + 0.01 * s))
    else:
        extra = torch.amp.GradScaler(device, init_scale=2.0**24, growth_interval=7)
    return model, optimizer, extra


def batch(step: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(64, 64, generator=g)
    y = x[:, :8] * 3.0
    return x.to(device), y.to(device)


def digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for key, value in model.state_dict().items():
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    for index, entry in sorted(optimizer.state_dict()["state"].items()):
        for name, value in sorted(entry.items()):
            h.update(f"{index}/{name}".encode())
            if isinstance(value, torch.Tensor):
                h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            else:
                h.update(repr(value).encode())
    return h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--variant", choices=("bf16", "fp16"), required=True)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--marker", default=None)
    parser.add_argument("--marker-step", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = args.device
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    model, optimizer, extra = build(device, args.variant)
    dtype = torch.bfloat16 if args.variant == "bf16" else torch.float16
    if args.variant == "bf16":
        run = preemptible.Run(args.root, model=model, optimizer=optimizer, scheduler=extra, save_every=args.save_every)
    else:
        run = preemptible.Run(args.root, model=model, optimizer=optimizer, scaler=extra, save_every=args.save_every)
    skipped = 0
    for step in run.steps(args.steps):
        x, y = batch(step, device)
        with torch.autocast(device_type=device, dtype=dtype):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        optimizer.zero_grad(set_to_none=True)
        if args.variant == "bf16":
            loss.backward()
            optimizer.step()
            extra.step()
        else:
            before = extra.get_scale()
            extra.scale(loss).backward()
            extra.step(optimizer)
            extra.update()
            skipped += extra.get_scale() < before
        run.log(loss=loss)
        print(f"step {step} run", flush=True)
        if args.marker and step == args.marker_step:
            with open(args.marker, "w") as f:
                f.write(str(step))
        if args.step_time:
            time.sleep(args.step_time)
    scale = extra.get_scale() if args.variant == "fp16" else None
    print(
        f"final resumed_from={run.resumed_from} digest={digest(model, optimizer)} scale={scale} skipped_here={skipped}",
        flush=True,
    )


if __name__ == "__main__":
    main()
