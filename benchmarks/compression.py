"""Compression where storage is the bottleneck: emergency-save time compressed vs plain vs torch.save, on a local
directory paced to ~200 MB/s, on moto S3 behind a paced loopback proxy, and on the fast local disk, interleaved.

    python benchmarks/compression.py                      # the full run (about 6 minutes here)
    python benchmarks/compression.py --mb 120 --rounds 1  # a quick look

The slow local destination is `preemptible.bench.PacedStorage`: a token bucket in the storage layer that every
writer thread shares (cgroup v1 here has no io.max, and loop-device blkio throttling needs privileges). torch.save
writes through the same bucket. The S3 destination is moto in its own process behind `PacedProxy`, which paces the
bytes sent to it: moto shares this machine's two cores, so unpaced the figure would measure its CPU, not a link.

States: fp32 weights + AdamW (moments from real AdamW steps) and bf16 weights alone, Gaussian like trained weights.
Ratios are also reported for a small model trained for 300 steps and for the same model at its random init.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from preemptible import Checkpointer
from preemptible.bench import PacedProxy, PacedStorage, Pacer
from preemptible.state import capture, flatten
from preemptible.store import compress
from preemptible.store.io import LocalStorage


def mlp(params: float, dtype: torch.dtype, *, layers: int = 4) -> torch.nn.Sequential:
    side = int((params / layers) ** 0.5)
    model = torch.nn.Sequential(*[torch.nn.Linear(side, side, bias=False) for _ in range(layers)])
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    return model.to(dtype)


def fp32_adamw(nbytes: float) -> dict[str, Any]:
    torch.manual_seed(0)
    model = mlp(nbytes / 12, torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    side = model[0].in_features
    for _ in range(10):  # real moments: a few AdamW steps on real gradients
        x = torch.randn(16, side)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return {"model": model, "optimizer": opt}


def bf16_weights(nbytes: float) -> dict[str, Any]:
    torch.manual_seed(0)
    return {"model": mlp(nbytes / 2, torch.bfloat16)}


def trained_ratios() -> dict[str, float]:
    """The ratio of a small model's weights and moments trained 300 steps, at init, and of Gaussian weights."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 256),
    )
    init = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    target = torch.randn(256, 256) / 16
    for _ in range(300):
        x = torch.randn(64, 256)
        loss = (model(x) - torch.tanh(x @ target)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    def ratio(tensors: list[torch.Tensor], dtype: torch.dtype) -> float:
        m = compress.measure([(t, dtype) for t in tensors])
        assert m is not None
        return m.ratio

    weights = [p.detach() for p in model.parameters()]
    moments = [s[k] for s in opt.state_dict()["state"].values() for k in ("exp_avg", "exp_avg_sq")]
    gauss = [torch.randn(1 << 20) * 0.02]
    return {
        "fp32 weights, trained 300 steps": ratio(weights, torch.float32),
        "fp32 weights, random init": ratio(list(init.values()), torch.float32),
        "fp32 weights, Gaussian (the timed state)": ratio(gauss, torch.float32),
        "fp32 AdamW moments, trained": ratio(moments, torch.float32),
        "bf16 weights, trained 300 steps": ratio(weights, torch.bfloat16),
        "bf16 weights, random init": ratio(list(init.values()), torch.bfloat16),
        "bf16 weights, Gaussian (the timed state)": ratio(gauss, torch.bfloat16),
    }


class PacedFile(io.RawIOBase):
    """A local file written through a `Pacer` (for torch.save)."""

    def __init__(self, path: str, pacer: Pacer | None) -> None:
        self._f = open(path, "wb")  # noqa: SIM115
        self._pacer = pacer

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = len(memoryview(data).cast("B"))
        if self._pacer is not None:
            self._pacer.take(n)
        self._f.write(data)
        return n

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
        super().close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Moto:
    """moto's S3 server in its own process."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto did not start") from None
                time.sleep(0.2)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


Run = Callable[[int], dict[str, Any]]


def destination_contenders(
    state: dict[str, Any], dest: str, work: str, *, rate: float | None, s3: str | None
) -> dict[str, Run]:
    """``name -> fn(round) -> figures`` for one destination."""
    sd = {k: v.state_dict() for k, v in state.items()}
    pacer = Pacer(rate) if rate else None
    opts = {"client_kwargs": {"endpoint_url": s3}} if s3 else None
    if s3:
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)  # type: ignore[arg-type]
        if not fs.exists("bench"):
            fs.mkdir("bench")

    def root(name: str) -> str:
        return f"s3://bench/{dest}-{name}" if s3 else os.path.join(work, f"{dest}-{name}")

    def checkpointer(name: str, setting: bool | str) -> Checkpointer:
        # keep=100: no rotation inside a timed save (each save's directory is removed after it is timed)
        if s3:
            return Checkpointer(root(name), compress=setting, storage_options=opts, keep=100)
        local = LocalStorage(root(name))
        storage = PacedStorage(local, rate) if rate else local
        if pacer is not None:
            storage.pacer = pacer  # type: ignore[union-attr]  # one link: every contender shares it
        return Checkpointer(root(name), compress=setting, storage=storage, keep=100)  # type: ignore[arg-type]

    auto = checkpointer("auto", "auto")
    auto.save(state, 1)  # the first save measures the destination, as in a training run

    def ours(setting: bool | str, ck: Checkpointer | None = None) -> Run:
        def run(r: int) -> dict[str, Any]:
            c = ck if ck is not None else checkpointer(str(setting), setting)
            t = time.perf_counter()
            c.save(state, 10 + r)
            s = time.perf_counter() - t
            d = c.path_of(10 + r)
            stored = sum(i.bytes for i in c.checkpoints() if i.step == 10 + r)
            choice = c.last_choice
            if not s3:
                shutil.rmtree(d, ignore_errors=True)
            return {"seconds": s, "stored": stored, "on": bool(choice and choice.on)}

        return run

    def torch_save(r: int) -> dict[str, Any]:
        t = time.perf_counter()
        if s3:
            with fs.open(f"bench/{dest}-torch-{r}.pt", "wb") as f:
                torch.save(sd, f)
        else:
            p = os.path.join(work, f"{dest}-torch.pt")
            with PacedFile(p, pacer) as f:
                torch.save(sd, f)
            s = time.perf_counter() - t
            size = os.path.getsize(p)
            os.remove(p)
            return {"seconds": s, "stored": size}
        return {"seconds": time.perf_counter() - t, "stored": 0}

    return {"plain": ours(False), "compressed": ours(True), "auto": ours("auto", auto), "torch.save": torch_save}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=600, help="state size in MB (local destinations)")
    ap.add_argument("--s3-mb", type=float, default=300, help="state size in MB for S3")
    ap.add_argument("--rate", type=float, default=200, help="the slow local destination, MB/s")
    ap.add_argument("--s3-rate", type=float, default=50, help="the S3 link, MB/s")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-s3", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    out: dict[str, Any] = {"ratios": trained_ratios(), "rows": []}
    print("compression ratio (stored / raw), sampled as a save samples:")
    for k, v in out["ratios"].items():
        print(f"  {k:<44}{v:6.3f}")
    work = tempfile.mkdtemp(prefix="bench-compress-")
    moto = None if args.no_s3 else Moto()
    proxy = None if moto is None else PacedProxy(("127.0.0.1", moto.port), args.s3_rate * 1e6)
    try:
        dests: list[tuple[str, float | None, str | None, float]] = [
            (f"local paced {args.rate:.0f} MB/s", args.rate * 1e6, None, args.mb),
            ("local disk (unpaced)", None, None, args.mb),
        ]
        if proxy is not None:
            dests.append((f"S3 (moto) paced {args.s3_rate:.0f} MB/s", None, proxy.endpoint, args.s3_mb))
        for i, (label, rate, s3, mb) in enumerate(dests):
            for kind, make in (("fp32+AdamW", fp32_adamw), ("bf16 weights", bf16_weights)):
                state = make(mb * 1e6)
                flat = flatten(capture(state))
                nbytes = flat.tensor_bytes
                tag = f"d{i}-{kind.split()[0]}".replace("+", "")
                fns = destination_contenders(state, tag, work, rate=rate, s3=s3)
                results: dict[str, list[dict[str, Any]]] = {k: [] for k in fns}
                for r in range(args.rounds):
                    for k, fn in fns.items():
                        gc.collect()
                        results[k].append(fn(r))
                med = {k: statistics.median(x["seconds"] for x in v) for k, v in results.items()}
                stored = results["compressed"][0]["stored"]
                plain_stored = results["plain"][0]["stored"]
                ck = Checkpointer(os.path.join(work, "probe"), compress=True)
                ck.save(state, 1)
                stats = ck.compression
                shutil.rmtree(os.path.join(work, "probe"), ignore_errors=True)
                row = {
                    "destination": label,
                    "state": kind,
                    "bytes": nbytes,
                    "median_s": med,
                    "ratio": stored / plain_stored if plain_stored else None,
                    "compress_mb_s_per_core": stats.rate / 1e6 if stats else None,
                    "auto_on": results["auto"][-1]["on"],
                    "speedup_compressed_vs_plain": med["plain"] / med["compressed"],
                    "speedup_auto_vs_plain": med["plain"] / med["auto"],
                    "speedup_compressed_vs_torch_save": med["torch.save"] / med["compressed"],
                }
                out["rows"].append(row)
                print(
                    f"\n{label}, {kind}: {nbytes / 1e6:.0f} MB, {args.rounds} rounds (median s): "
                    + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
                    + f"\n  ratio {row['ratio']:.3f}, compression {row['compress_mb_s_per_core']:.0f} MB/s per core, "
                    f"auto chose {'on' if row['auto_on'] else 'off'}"
                    f"\n  effective throughput compressed/plain {row['speedup_compressed_vs_plain']:.2f}x, "
                    f"auto/plain {row['speedup_auto_vs_plain']:.2f}x, compressed vs torch.save "
                    f"{row['speedup_compressed_vs_torch_save']:.2f}x",
                    flush=True,
                )
                del state, fns
                gc.collect()
    finally:
        if proxy is not None:
            proxy.close()
        if moto is not None:
            moto.close()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    recorded(main, "compression")
