"""Sharded training (FSDP2 ``fully_shard`` on a CPU mesh with gloo) under torchrun, preemption-safe.

Each rank writes its own shards (no pickled metadata, the project's own format); a restart with the same number
of ranks resumes bit-identically; a restart with another number of ranks reshards: each rank reads only the byte
ranges of the slices it now holds.

    torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29500 examples/train_fsdp.py --root /tmp/ckpt
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import preemptible


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--steps", type=int, default=90)
    parser.add_argument("--save-every", type=int, default=40)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument(
        "--memory-every", type=int, default=None, help="a memory-tier save every N steps (0: on a notice only)"
    )
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(1000 + rank)

    tier = None if args.memory_every is None else preemptible.MemoryTier(every=args.memory_every or None)
    run = preemptible.Run(args.root, model=model, optimizer=optimizer, save_every=args.save_every, memory_tier=tier)
    for step in run.steps(args.steps):
        g = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(32, 16, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x[:, :4].sum(dim=1, keepdim=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.5f}", flush=True)
        if args.step_time:
            time.sleep(args.step_time)
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}  # a collective: every rank takes part
    if rank == 0:
        h = hashlib.sha256()
        for v in full.values():
            h.update(v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        print(f"final step={run.step} resumed_from={run.resumed_from} digest={h.hexdigest()[:16]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("PREEMPTIBLE_SOURCES", "signal")
    try:
        main()
        code = 0
    except SystemExit as stop:  # the emergency exit after a notice: the policy's code (0 by default)
        code = stop.code if isinstance(stop.code, int) else 1
    # Skip interpreter shutdown, on the finished and the preempted path alike: the process group outlives
    # destroy_process_group() here (FSDP and the device mesh keep it), and a gloo worker thread that drops a
    # finished collective's tensors while the interpreter shuts down aborts the process ("terminate called without
    # an active exception", pytorch/pytorch#190489): a clean stop would exit -6. Everything preemptible wrote is
    # already durable (the run closed before the loop ended or the SystemExit was raised).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
