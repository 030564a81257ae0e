"""A small model trained with AdamW under FSDP2, DDP or in one process, for the elastic-resume tests.

Run under torchrun (any number of ranks; gloo, CPU), or with plain ``python`` for a single process without a
process group. Dimensions do not divide by 2 or 3, so shards are uneven. Rank 0 writes ``--out`` (JSON): a digest
of every full (gathered) tensor of the model and optimizer state, taken right after the loop's end (``--phase
save``: the state the final checkpoint holds) or right after the restore (``--phase restore``: before any step
of the resumed run), plus the step it resumed from. A restore then trains two more steps and saves again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

import preemptible


def full(t: Any) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t  # a collective for a DTensor


def digests(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, str]:
    out = {}
    tensors = {f"model/{k}": v for k, v in model.state_dict().items()}
    for pid, st in optimizer.state_dict()["state"].items():
        tensors |= {f"optimizer/{pid}/{k}": v for k, v in st.items() if isinstance(v, torch.Tensor)}
    for name, t in sorted(tensors.items()):
        f = full(t).detach().contiguous()
        data = f.reshape(-1).view(torch.uint8).numpy().tobytes()
        out[name] = f"{list(f.shape)}:{hashlib.sha256(data).hexdigest()[:16]}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--wrap", choices=["fsdp", "ddp", "plain"], required=True)
    parser.add_argument("--phase", choices=["save", "restore"], required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=37)
    parser.add_argument("--out", required=True)
    parser.add_argument("--compress", action="store_true", help="save compressed tensor files (.safetensors.zst)")
    args = parser.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(  # the last layer's one row leaves some ranks' shards empty
        torch.nn.Linear(16, args.width),
        torch.nn.ReLU(),
        torch.nn.Linear(args.width, 11),
        torch.nn.ReLU(),
        torch.nn.Linear(11, 1),
    )
    module: torch.nn.Module = model
    if args.wrap == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif args.wrap == "ddp" and distributed:
        module = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    storage_options = json.loads(os.environ.get("RESHARD_STORAGE_OPTIONS", "null"))
    run = preemptible.Run(
        args.root,
        model=model,
        optimizer=optimizer,
        save_every=1000,
        storage_options=storage_options,
        compress=True if args.compress else "auto",
    )
    total = args.steps if args.phase == "save" else args.steps + 2
    record: dict[str, Any] = {"world": world, "wrap": args.wrap}
    for step in run.steps(total):
        if "restored" not in record:
            record["resumed_from"] = run.resumed_from
            record["restored"] = digests(model, optimizer) if args.phase == "restore" else None
        g = torch.Generator().manual_seed(step * 101 + rank)
        x = torch.randn(8, 16, generator=g)
        loss = module(x).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    record["final"] = digests(model, optimizer)
    record["step"] = run.step
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(record, f)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("PREEMPTIBLE_SOURCES", "signal")
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except Exception as e:  # the refusal a test expects: one line on stderr, exit 3
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        code = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # see examples/train_fsdp.py: gloo and FSDP at interpreter shutdown
