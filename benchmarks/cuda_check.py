"""The CUDA paths, checked on a machine with a GPU (CI has none): pinned staging, device-to-host copies on a side
stream, bit-exact save/restore of a CUDA model and optimizer, CUDA RNG streams, and the staging stall measured
against the device-to-host copy ceiling and against ``.cpu()`` (what ``torch.save`` does), interleaved.

    PYTHONPATH=src python benchmarks/cuda_check.py --gb 4 --rounds 3 --dir /tmp/ckpt

Prints one PASS/FAIL line per check and a timing table; exits 1 when a check fails. ``--device cpu`` runs the same
code on the CPU with nothing pinned (a smoke test of this script on a machine without a GPU, no CUDA figures).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

# torch.use_deterministic_algorithms(True) makes cuBLAS raise unless this is set before CUDA starts
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch

from preemptible import Checkpointer, RNGState

failures: list[str] = []
DEVICE = "cuda"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}{'  (' + detail + ')' if detail else ''}", flush=True)
    if not ok:
        failures.append(name)


def timed(fn: Callable[[], Any]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(256, 8)
    )
    model = model.to(DEVICE)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(32, 64, device=DEVICE)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def correctness(root: str) -> None:
    torch.use_deterministic_algorithms(True)
    ref_model, ref_opt = model_and_optimizer(0)
    train(ref_model, ref_opt, 10)

    model, opt = model_and_optimizer(0)
    train(model, opt, 5)
    ck = Checkpointer(root, keep=3)
    rng = RNGState()
    ck.save({"model": model, "optimizer": opt, "rng": rng}, 5)  # the blocking (emergency) path
    # asynchronous path: the live tensors change right after save() returns; the checkpoint must not
    handle = ck.save({"model": model, "optimizer": opt, "rng": rng}, 6, blocking=False)
    expected = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    handle.wait()
    check(
        f"staging arena is {'pinned' if DEVICE == 'cuda' else 'not pinned'} by default "
        f"({'with' if DEVICE == 'cuda' else 'without'} CUDA)",
        ck.staging.pin == (DEVICE == "cuda") and ck.staging.nbytes > 0,
    )
    m6, o6 = model_and_optimizer(1)
    ck.restore({"model": m6, "optimizer": o6, "rng": RNGState()}, 6)
    same = all(torch.equal(m6.state_dict()[k], v) for k, v in expected.items())
    check("async save holds the values of save() time, not later in-place updates", same)
    on_device = all(t.device.type == DEVICE for t in m6.state_dict().values()) and all(
        t.device.type == DEVICE
        for s in o6.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor) and t.dim() > 0
    )
    check(f"restore keeps model and optimizer state on the {DEVICE} device", on_device)

    # the blocking (emergency) path, now that an arena of this layout exists: staged on the GPU's side streams
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    result = ck.save({"model": model, "optimizer": opt, "rng": RNGState()}, 7).wait()
    live = {k: v.detach().clone() for k, v in model.state_dict().items()}
    m7, o7 = model_and_optimizer(3)
    ck.restore({"model": m7, "optimizer": o7, "rng": RNGState()}, 7)
    check(
        "an emergency save of CUDA tensors goes through the pinned arena and restores exactly",
        "stage" in result.timings and all(torch.equal(m7.state_dict()[k], v) for k, v in live.items()),
        f"timings {sorted(result.timings)}",
    )

    m5, o5 = model_and_optimizer(2)
    rng5 = RNGState()
    ck.restore({"model": m5, "optimizer": o5, "rng": rng5}, 5)
    train(m5, o5, 5)
    exact = all(
        torch.equal(a, b) for a, b in zip(m5.state_dict().values(), ref_model.state_dict().values(), strict=True)
    )
    check("resume from step 5 on the GPU ends bit-identical to 10 uninterrupted steps", exact)

    torch.manual_seed(7)
    saved = RNGState().state_dict()
    a = torch.randn(4, device=DEVICE)
    RNGState().load_state_dict(saved)
    b = torch.randn(4, device=DEVICE)
    check(f"{DEVICE} RNG state round-trips", torch.equal(a, b))
    torch.use_deterministic_algorithms(False)


def speed(root: str, gb: float, rounds: int) -> None:
    n = int(gb * 1e9 / 4)
    chunk = 64 << 20  # elements per tensor: 256 MB fp32
    tensors = {f"w{i}": torch.randn(min(chunk, n - i * chunk), device=DEVICE) for i in range((n + chunk - 1) // chunk)}
    nbytes = sum(t.numel() * 4 for t in tensors.values())
    flat = torch.empty(n, device=DEVICE)
    host_pinned = torch.empty(n, pin_memory=DEVICE == "cuda")
    ck = Checkpointer(root, keep=2)
    bare = Checkpointer(root + "-bare", keep=2)  # never saves asynchronously: no arena, per-tensor .cpu()
    kinds = ("ceiling", "stage", "cpu()", "save", "save, no arena", "torch.save")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    first_stage = None
    for r in range(rounds):
        times["ceiling"].append(timed(lambda: host_pinned.copy_(flat, non_blocking=True)))
        times["cpu()"].append(timed(lambda: [t.cpu() for t in tensors.values()]))
        handle_t0 = time.perf_counter()
        h = ck.save({"w": tensors}, r + 1, blocking=False)
        stall = time.perf_counter() - handle_t0
        h.wait()
        if first_stage is None:
            first_stage = stall
        else:
            times["stage"].append(stall)
        times["save"].append(timed(lambda r=r: ck.save({"w": tensors}, 100 + r)))
        times["save, no arena"].append(timed(lambda r=r: bare.save({"w": tensors}, 100 + r)))
        path = os.path.join(root, f"torch-{r}.pt")
        times["torch.save"].append(timed(lambda path=path: _torch_save(tensors, path)))
        os.remove(path)
    if not times["stage"]:  # one round: its stall (with the arena's allocation) is all there is
        times["stage"].append(first_stage or 0.0)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    print(f"\n{nbytes / 1e9:.2f} GB of {DEVICE} tensors, {rounds} rounds, medians:")
    for k, v in med.items():
        print(f"  {k:15s} {v:7.3f} s  {nbytes / v / 1e9:7.2f} GB/s")
    print(f"  first async stall (allocates and pins the arena) {first_stage:.3f} s")
    print(
        f"  async stall / D2H ceiling: {med['stage'] / med['ceiling']:.2f}x;  .cpu() / ceiling: "
        f"{med['cpu()'] / med['ceiling']:.2f}x;  blocking save vs torch.save: {med['torch.save'] / med['save']:.2f}x, "
        f"vs the same save without an arena: {med['save, no arena'] / med['save']:.2f}x"
    )
    check(
        "async stall within 2x of the pinned D2H ceiling",
        med["stage"] < 2 * med["ceiling"],
        f"{med['stage']:.3f} s vs {med['ceiling']:.3f} s",
    )


def _torch_save(tensors: dict[str, torch.Tensor], path: str) -> None:
    torch.save(tensors, path)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke test of this script")
    args = ap.parse_args()
    global DEVICE  # noqa: PLW0603 - set once, from the command line
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("cuda_check: expected a CUDA device, found none (torch.cuda.is_available() is False)")
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke test)"
    print(f"torch {torch.__version__}, {name}", flush=True)
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        correctness(os.path.join(root, "correct"))
        speed(os.path.join(root, "speed"), args.gb, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if failures:
        sys.exit(f"cuda_check: {len(failures)} check(s) failed: {', '.join(failures)}")


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    recorded(main, "cuda-check")
