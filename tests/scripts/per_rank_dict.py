"""The script of the per-rank bug report, as it was written: each rank holds its own counter in a dict given to
`Run`, with no ``per_rank=``. Rank 1 used to come back from a resume with rank 0's values, silently."""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import preemptible

p = argparse.ArgumentParser()
p.add_argument("--root", required=True)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--save-every", type=int, default=None)
p.add_argument("--step-time", type=float, default=0.0)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
mine = {"offset": 1000 * rank}
run = preemptible.Run(args.root, save_every=args.save_every, model=model, optimizer=optimizer, mine=mine)
for step in run.steps(args.steps):
    loss = model(torch.ones(2, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    mine["offset"] += 1
    print(f"step {step} rank {rank} offset {mine['offset']}", flush=True)
    time.sleep(args.step_time)
print(f"final rank {rank} offset {mine['offset']} resumed_from={run.resumed_from}", flush=True)
dist.destroy_process_group()
