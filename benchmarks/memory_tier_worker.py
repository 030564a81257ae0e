"""One rank of `memory_tier.py`: under torchrun on the simulated nodes, it times the memory tier against the durable
root on S3 (paced per node) and the machine's own ceilings, interleaved, and rank 0 prints one JSON line.

Not a test: the figures go to benchmarks/results/ (see `memory_tier.py`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

import torch
import torch.distributed as dist

from preemptible import Checkpointer
from preemptible.bench import PacedStorage
from preemptible.checkpoint.memtier import MemoryTier, Tier
from preemptible.events import NullSink
from preemptible.store.io import storage_for


def slowest(seconds: float) -> float:
    """The job's time for a collective phase: its slowest rank's."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def timed(fn: object) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return slowest(time.perf_counter() - t0)


def ceilings(shard: torch.Tensor, rank: int, world: int) -> dict[str, float]:
    """This machine's limits for the tier's work, measured the same way: one copy of the shard in memory, and the
    shard sent to the next node over the process group (every node at once, as the replication does)."""
    nbytes = shard.numel() * shard.element_size()
    copy_s = timed(shard.clone)
    buf = torch.empty_like(shard)

    def ring() -> None:
        works = [dist.isend(shard, (rank + 1) % world), dist.irecv(buf, (rank - 1) % world)]
        for w in works:
            w.wait()

    link_s = timed(ring)
    return {"memory_copy_gb_s_per_rank": nbytes / copy_s / 1e9, "process_group_gb_s_per_rank": nbytes / link_s / 1e9}


def train_beside(rank: int, reps: int, every: int, mem_root: str) -> dict[str, float]:
    """Steps of a small model, with a memory-tier save every ``every`` steps or none, in alternating blocks."""
    torch.manual_seed(rank)
    layers = [torch.nn.Linear(1024, 1024) for _ in range(4)]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())])
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(384, 1024)
    state = {"model": model, "optimizer": opt}
    ck = Checkpointer(os.path.join(mem_root, "unused-durable"), per_rank=("model", "optimizer"), compress=False)
    tier = Tier(MemoryTier(dir=os.path.join(mem_root, "train")), ck, events=NullSink())

    cpu: dict[bool, list[float]] = {False: [], True: []}

    def block(save: bool, first: int) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        c0 = time.process_time()  # this process's CPU seconds, every thread's
        for i in range(every):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if save and i == 0:  # a boundary: the save goes on in the background while the next steps run
                tier.save_background(state, first + i + 1, reason="periodic")  # as Run's periodic saves do
        if save:
            tier.wait()  # its seconds count in this block: the next one starts with none in flight
            saves.append(dict(tier.timings))
        cpu[save].append(time.process_time() - c0)
        return slowest(time.perf_counter() - t0)

    saves: list[dict[str, float]] = []
    block(False, 0)  # warm-up: the optimizer's moments exist from here
    plain, saving = [], []
    for r in range(reps):
        plain.append(block(False, 0))
        saving.append(block(True, (r + 1) * every))
    params = sum(p.numel() for p in model.parameters())
    return {
        "model_params": params,
        "state_bytes_per_rank": params * 4 * 3,
        "step_s": sorted(plain)[len(plain) // 2] / every,
        "step_s_with_memory_saves": sorted(saving)[len(saving) // 2] / every,
        "slowdown": sorted(saving)[len(saving) // 2] / sorted(plain)[len(plain) // 2] - 1,
        "every": every,
        "save_phases_rank0": saves,
        "cpu_s_per_block_rank0": {"plain": cpu[False], "with_save": cpu[True]},
        "cores_per_rank": (os.cpu_count() or 1) / dist.get_world_size(),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--shard-mb", type=int, default=512)
    p.add_argument("--rate-mb-s", type=float, default=200.0)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--train-reps", type=int, default=3)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    mem_root = os.environ["PREEMPTIBLE_MEMORY_DIR"]
    shard = torch.randn(args.shard_mb * (1 << 20) // 4, generator=torch.Generator().manual_seed(rank))
    state = {"shard": {"data": shard}}
    url = "s3://memtier/bench"
    opts = {"client_kwargs": {"endpoint_url": args.endpoint}}
    storage = PacedStorage(storage_for(url, opts), args.rate_mb_s * 1e6)
    ck = Checkpointer(url, storage=storage, per_rank=("shard",), compress=False, keep=2)  # type: ignore[arg-type]
    tier = Tier(MemoryTier(dir=os.path.join(mem_root, "tier"), keep=1), ck, events=NullSink())
    out: dict[str, object] = {"world": world, "shard_bytes": shard.numel() * 4, "rate_mb_s_per_node": args.rate_mb_s}
    out["ceilings"] = ceilings(shard, rank, world)
    memory_s, s3_s, restore_mem_s, restore_s3_s = [], [], [], []
    phases: list[dict[str, float]] = []
    for rep in range(args.reps):  # interleaved: memory, S3, then the two restores after node `world - 1` is lost
        step = rep + 1
        memory_s.append(timed(lambda step=step: tier.save(state, step, reason="emergency")))
        phases.append(dict(tier.timings))
        s3_s.append(timed(lambda step=step: ck.save(state, step)))
        if rank == world - 1:  # this node is lost: its tier with it (its replica lives on the next node)
            shutil.rmtree(tier.dir, ignore_errors=True)
        restore_mem_s.append(timed(lambda: tier.restore(state, durable=None)))
        restore_s3_s.append(timed(lambda step=step: ck.restore(state, step=step)))
    gb = world * shard.numel() * 4 / 1e9

    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    out.update(
        {
            "emergency_save_memory_s": memory_s,
            "emergency_save_memory_phases_rank0": phases,
            "emergency_save_s3_s": s3_s,
            "restore_memory_s": restore_mem_s,
            "restore_s3_s": restore_s3_s,
            "s3_achieved_mb_s_per_node": gb / world * 1e3 / med(s3_s),
            "save_speedup": med(s3_s) / med(memory_s),
            "restore_speedup": med(restore_s3_s) / med(restore_mem_s),
        }
    )
    shutil.rmtree(tier.dir, ignore_errors=True)
    out["training"] = train_beside(rank, args.train_reps, 10, mem_root)
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
