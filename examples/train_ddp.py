"""Data-parallel training under torchrun, made preemption-safe with preemptible.

Every rank stops at the same agreed step after any rank's notice, the checkpoint is striped across ranks and
committed once, and a restart resumes bit-identically.

    torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29500 examples/train_ddp.py --root /tmp/ckpt
    # kill -TERM <torchrun pid>  (or one worker, or a cloud notice); then run the same command again
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import preemptible


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument(
        "--memory-every", type=int, default=None, help="a memory-tier save every N steps (0: on a notice only)"
    )
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # identical initial weights on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(16, args.hidden), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(args.hidden, 1)
    )
    # DDP rebuilds its gradient buckets after its first iteration, so the first step of every process sums
    # gradients in another order: with 3+ ranks that changes the last bits. find_unused_parameters=True keeps the
    # first layout for good, so a resumed run is bit-identical (see the README's torchrun section).
    ddp = DistributedDataParallel(model, find_unused_parameters=world > 2)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.7)
    torch.manual_seed(1000 + rank)  # each rank's own dropout stream (saved per rank)

    tier = None if args.memory_every is None else preemptible.MemoryTier(every=args.memory_every or None)
    run = preemptible.Run(
        args.root, model=model, optimizer=optimizer, scheduler=scheduler, save_every=args.save_every, memory_tier=tier
    )
    for step in run.steps(args.steps):
        g = torch.Generator().manual_seed(step * world + rank)  # this rank's shard of this step's data
        x = torch.randn(32, 16, generator=g)
        y = x[:, :4].sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.5f}", flush=True)
        if args.step_time:
            time.sleep(args.step_time)
    if rank == 0:
        h = hashlib.sha256()
        for v in list(model.state_dict().values()) + [
            t for s in optimizer.state_dict()["state"].values() for t in s.values()
        ]:
            h.update(v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        print(f"final step={run.step} resumed_from={run.resumed_from} digest={h.hexdigest()[:16]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("PREEMPTIBLE_SOURCES", "signal")
    main()
