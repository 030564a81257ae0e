"""Elastic restore, measured: FSDP2 state (AdamW) saved on N ranks and restored on M, beside the same-size restore
and beside ``torch.distributed.checkpoint`` (``dcp.save``/``dcp.load``) of the same state resharded the same way,
in the same run, interleaved, with the page cache of every checkpoint file dropped before each restore (cold
reads, ``posix_fadvise(DONTNEED)``).

Reported per restore: wall time (the slowest rank, between barriers) and the bytes each rank read (``rchar`` of
``/proc/self/io``: every read syscall of the process during the restore, metadata included), against its share
(the checkpoint's tensor bytes / M).

    python benchmarks/reshard.py [--layers 8 --width 2048 --rounds 3] [--dir DIR]

It launches torchrun itself (gloo, CPU): a save on 2 and on 3 ranks, then restores on 3 and on 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _evict(*dirs: Path) -> None:
    for d in dirs:
        for p in d.rglob("*"):
            if p.is_file():
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from preemptible import Checkpointer

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    base = Path(args.dir)

    def optimizer() -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=1e-3)

    if args.phase == "save":
        opt = optimizer()
        model(torch.randn(4, args.width)).square().mean().backward()
        opt.step()
        Checkpointer(str(base / f"pre{world}"), threads=2).save({"model": model, "optimizer": opt}, 1)
        sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
        dcp.save(sd, checkpoint_id=str(base / f"dcp{world}"))
        dist.barrier()
        dist.destroy_process_group()
        return

    def timed(fn: Any) -> tuple[float, list[int]]:
        if rank == 0:
            _evict(*(p for p in base.iterdir() if p.is_dir()))
        dist.barrier()
        before, t0 = _rchar(), time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
        read = _rchar() - before
        dist.barrier()
        out: list[Any] = [None] * world
        dist.all_gather_object(out, (seconds, read))
        return max(s for s, _ in out), [r for _, r in out]

    def ours(src: int) -> None:
        Checkpointer(str(base / f"pre{src}"), threads=2).restore({"model": model, "optimizer": optimizer()})

    def theirs(src: int) -> None:
        opt = optimizer()
        sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
        dcp.load(sd, checkpoint_id=str(base / f"dcp{src}"))
        set_model_state_dict(model, sd["model"])
        set_optimizer_state_dict(model, opt, sd["optim"])

    rows = []
    for r in range(args.rounds):
        for src in (2, 3):
            tools = [("preemptible", ours), ("dcp", theirs)]
            for tool, fn in tools if r % 2 == 0 else tools[::-1]:
                seconds, read = timed(lambda fn=fn, src=src: fn(src))
                rows.append({"tool": tool, "src": src, "dst": world, "seconds": seconds, "read": read})
    if rank == 0:
        Path(args.out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def launch(script: str, nproc: int, *extra: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc)]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port()), script, "--worker", *extra]
    env = dict(os.environ, PREEMPTIBLE_SOURCES="signal", OMP_NUM_THREADS="1")
    quiet = None if os.environ.get("RESHARD_DEBUG") else subprocess.DEVNULL
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=quiet)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--phase", default="save", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # gloo and FSDP at interpreter shutdown can abort a finished process (see examples/train_fsdp.py)
    base = Path(tempfile.mkdtemp(prefix="reshard-", dir=args.dir))
    shape = ["--layers", str(args.layers), "--width", str(args.width), "--dir", str(base)]
    try:
        for n in (2, 3):
            launch(__file__, n, *shape, "--phase", "save")
        stored = {
            src: sum(
                f["bytes"]
                for f in json.loads((base / f"pre{src}" / "step-000000000001" / "COMMIT.json").read_text())[
                    "files"
                ].values()
            )
            for src in (2, 3)
        }
        rows: list[dict[str, Any]] = []
        for m in (3, 2):
            out = base / f"rows{m}.json"
            launch(__file__, m, *shape, "--phase", "restore", "--out", str(out), "--rounds", str(args.rounds))
            rows += json.loads(out.read_text())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    params = args.layers * (args.width * args.width + args.width)
    what = f"FSDP2 + AdamW, {params / 1e6:.1f}M parameters, {stored[2] / 1e6:.0f} MB checkpoint"
    print(f"{what}; {args.rounds} rounds, cold cache")
    print(f"{'restore':<10} {'tool':<12} {'seconds':>8} {'vs same-size':>13} {'MB read per rank':>24} {'vs share':>14}")
    for src, dst in ((2, 3), (3, 3), (3, 2), (2, 2)):
        for tool in ("preemptible", "dcp"):
            sel = [r for r in rows if r["tool"] == tool and r["src"] == src and r["dst"] == dst]
            same = [r for r in rows if r["tool"] == tool and r["src"] == dst and r["dst"] == dst]
            sec = statistics.median(r["seconds"] for r in sel)
            base_sec = statistics.median(r["seconds"] for r in same)
            read = [statistics.median(r["read"][k] for r in sel) for k in range(dst)]
            share = stored[src] / dst
            ratio = "/".join(f"{x / share:.2f}" for x in read)
            mb = "/".join(f"{x / 1e6:.0f}" for x in read)
            print(f"{src}->{dst:<7} {tool:<12} {sec:8.3f} {sec / base_sec:12.2f}x {mb:>24} {ratio:>14}")


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    recorded(main, "reshard")
