"""First figure: emergency-save throughput of preemptible beside torch.save and the disk's own limit.

State: a ~100M-parameter model with AdamW state (about 1.2 GB). Rounds are interleaved (ours, torch.save,
raw fsync'd write, ...) so the machine's drift hits every contender alike; medians and ratios are reported.

    python benchmarks/save_vs_torch.py --params 100e6 --rounds 3 --dir /path/on/the/disk/to/measure
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

import preemptible


def build(params: int) -> dict[str, object]:
    side = 4096
    layers = max(1, round(params / (side * side)))
    model = torch.nn.Sequential(*[torch.nn.Linear(side, side, bias=False) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    return {"model": model, "optimizer": opt}


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_write(path: str, nbytes: int, block: int = 64 << 20) -> None:
    buf = memoryview(bytearray(os.urandom(1 << 20)) * (block >> 20))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, buf[: min(block, left)])
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=100e6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir under the repository)")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="bench-", dir=args.dir or os.path.join(os.path.dirname(__file__), ".."))
    state = build(int(args.params))
    nbytes = preemptible.state.flatten(preemptible.state.capture(state)).tensor_bytes
    print(f"state: {nbytes / 1e9:.2f} GB of tensors, writing under {base}")

    def ours() -> None:
        d = os.path.join(base, "ours")
        preemptible.Checkpointer(d).save(state, 1)
        shutil.rmtree(d)

    def torch_save() -> None:
        p = os.path.join(base, "torch.pt")
        torch.save({k: v.state_dict() for k, v in state.items()}, p)  # type: ignore[attr-defined]
        fsync_file(p)
        os.remove(p)

    def ceiling() -> None:
        p = os.path.join(base, "raw.bin")
        raw_write(p, nbytes)
        os.remove(p)

    contenders: dict[str, Callable[[], None]] = {
        "preemptible save": ours,
        "torch.save + fsync": torch_save,
        "fsync'd write ceiling": ceiling,
    }
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for r in range(args.rounds):
        for name, fn in contenders.items():
            os.sync()
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ceil = med["fsync'd write ceiling"]
    print(f"\n{'contender':<24}{'median s':>10}{'GB/s':>8}{'/ceiling':>10}")
    for k, v in med.items():
        print(f"{k:<24}{v:>10.2f}{nbytes / v / 1e9:>8.2f}{ceil / v:>10.2f}")
    print(f"\npreemptible vs torch.save: {med['torch.save + fsync'] / med['preemptible save']:.2f}x faster")


if __name__ == "__main__":
    main()
