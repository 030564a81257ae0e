"""Distributed costs, measured under torchrun (gloo, CPU):

1. The per-step cost of asking "stop now?": preemptible's `Guard.should_stop` (a local flag read, the agreement
   runs beside the loop) versus an all_reduce of a flag every step (the pattern of Megatron, NeMo, Lightning).
2. A striped save (each rank writes a share) versus a rank-0-only save of the same replicated state.

    torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29500 benchmarks/dist_bench.py --dir /path
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from preemptible import Checkpointer, Guard
from preemptible.bench import large_state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--params", type=float, default=35e6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    os.environ.setdefault("PREEMPTIBLE_SOURCES", "signal")
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    with Guard() as guard:
        times = []
        for i in range(args.steps):
            t = time.perf_counter_ns()
            guard.should_stop(i)
            times.append(time.perf_counter_ns() - t)
    flag = torch.zeros(1)
    reduce_times = []
    for _ in range(args.steps):
        t = time.perf_counter_ns()
        dist.all_reduce(flag)
        reduce_times.append(time.perf_counter_ns() - t)
    if rank == 0:
        print(
            f"per-step stop check: should_stop median {statistics.median(times) / 1e3:.2f} us, "
            f"all_reduce of a flag median {statistics.median(reduce_times) / 1e3:.1f} us "
            f"({statistics.median(reduce_times) / max(statistics.median(times), 1):.0f}x)"
        )

    state = large_state(args.params, side=2048)
    work = tempfile.mkdtemp(prefix="dist-bench-", dir=args.dir) if rank == 0 else ""
    holder = [work]
    dist.broadcast_object_list(holder)
    work = holder[0]
    striped, single = [], []
    for r in range(args.rounds):
        dist.barrier()
        t = time.perf_counter()
        Checkpointer(os.path.join(work, f"striped{r}")).save(state, 1)
        dist.barrier()
        striped.append(time.perf_counter() - t)
        t = time.perf_counter()
        if rank == 0:
            ck = Checkpointer(os.path.join(work, f"single{r}"))
            ck._coordinator = None  # rank 0 writes everything, as most frameworks do
            ck.save(state, 1)
        dist.barrier()
        single.append(time.perf_counter() - t)
    if rank == 0:
        nbytes = sum(p.numel() * 12 for p in state["model"].parameters())
        s, o = statistics.median(striped), statistics.median(single)
        print(
            f"save of {nbytes / 1e9:.2f} GB: striped across {dist.get_world_size()} ranks {s:.2f} s, "
            f"rank 0 only {o:.2f} s ({o / s:.2f}x)"
        )
        shutil.rmtree(work, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    recorded(main, "dist-bench")
