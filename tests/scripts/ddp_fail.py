"""A data-parallel script that fails: every rank raises at ``--fail-at`` (the "failed" exit path of the torchrun
stress test: the run must close its threads and store clients before the traceback ends the process)."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import preemptible

p = argparse.ArgumentParser()
p.add_argument("--root", required=True)
p.add_argument("--fail-at", type=int, default=7)
args = p.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
ddp = DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
run = preemptible.Run(args.root, model=model, optimizer=optimizer, save_every=3)
for step in run.steps(100):
    loss = ddp(torch.ones(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == args.fail_at:
        raise RuntimeError(f"the training script's own failure at step {step}")
