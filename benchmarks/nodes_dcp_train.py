"""The baseline of benchmarks/nodes_bench.py: examples/train_ddp.py's model and training under torchrun alone, with
the user's own periodic ``torch.distributed.checkpoint`` saves (the local filesystem reader and writer) and no
preemptible.

Every ``--save-every`` steps all ranks ``dcp.save`` the model, optimizer and scheduler state into
``<root>/step-N/`` (N steps completed), and rank 0 writes ``<root>/step-N/DONE`` once the save has returned (DCP's
own ``.metadata`` is written by then): a directory without it is an incomplete save and is never loaded. At start,
rank 0 picks the newest ``step-N`` with ``DONE`` and broadcasts N; every rank ``dcp.load``s it and goes on at step
N. The process group is ``init_process_group("gloo", timeout=timedelta(seconds=--gloo-timeout))``: torch's default
for gloo is 30 minutes, the time a collective waits for a peer that vanished without closing its connections.

    torchrun ... benchmarks/nodes_dcp_train.py --root DIR [--hidden 65536 --save-every 40 --gloo-timeout 60]

What it prints, for the benchmark (instrumentation only, the training is the same without it): rank 0 ``step N
loss X`` after every step, as the example does; every rank ``restored rank=R step=N bytes_read=B seconds=S
t=EPOCH`` after a load (``rchar`` of ``/proc/self/io`` across ``dcp.load``: every byte its read calls returned),
and, to stderr, ``collective_failed t=EPOCH ...`` when the loop raises (a gloo timeout, say) before re-raising it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

MARKER = "DONE"


def rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def newest_complete(root: Path) -> int | None:
    """The newest ``step-N`` under ``root`` with rank 0's marker in it, or None."""
    steps = []
    for p in root.glob("step-*"):
        tail = p.name[len("step-") :]
        if tail.isdigit() and (p / MARKER).exists():
            steps.append(int(tail))
    return max(steps) if steps else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--gloo-timeout", type=float, default=1800.0, help="seconds (torch's default: 30 minutes)")
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.gloo_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # identical initial weights on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(16, args.hidden), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(args.hidden, 1)
    )
    ddp = DistributedDataParallel(model, find_unused_parameters=world > 2)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.7)
    torch.manual_seed(1000 + rank)  # each rank's own dropout stream (not saved: DCP users rarely do)
    root = Path(args.root)

    def state() -> dict[str, object]:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        return {"model": model_sd, "optim": optim_sd, "scheduler": scheduler.state_dict()}

    start = 0
    found = [newest_complete(root) if rank == 0 else None]
    dist.broadcast_object_list(found)
    if found[0] is not None:
        sd = state()  # a fresh AdamW's state is made by get_state_dict (a step with zero gradients, lr 0)
        before, t0 = rchar(), time.perf_counter()
        dcp.load(sd, storage_reader=dcp.FileSystemReader(root / f"step-{found[0]}"))
        set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        scheduler.load_state_dict(sd["scheduler"])
        seconds, read = time.perf_counter() - t0, rchar() - before
        start = found[0]
        print(
            f"restored rank={rank} step={start} bytes_read={read} seconds={seconds:.3f} t={time.time():.3f}", flush=True
        )

    try:
        for step in range(start, args.steps):
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
            done = step + 1
            if done % args.save_every == 0:
                path = root / f"step-{done}"
                dcp.save(state(), storage_writer=dcp.FileSystemWriter(path))
                if rank == 0:
                    (path / MARKER).write_text(f"{time.time():.3f}\n")
    except BaseException as e:
        print(f"collective_failed t={time.time():.3f} {type(e).__name__}: {str(e)[:300]!r}", file=sys.stderr)
        sys.stderr.flush()
        raise
    if rank == 0:
        print(f"final step={args.steps} resumed_from={start}", flush=True)
    dist.barrier()  # no rank leaves while another still needs the group
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
