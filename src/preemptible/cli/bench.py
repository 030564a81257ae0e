"""``preemptible bench``: checkpoint throughput beside torch.save, DCP, safetensors and the machine's limits."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

from preemptible.cli.args import fail, integer, local_directory, number

PROG = "preemptible bench"


def bench_directory(text: str) -> str:
    """A local directory to bench in, made if missing (the benchmark's ceilings are a file system's)."""
    try:
        return local_directory(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(
            f"{e}; for an object store, run benchmarks/beside_s3.py, or mount the bucket and bench the mount"
        ) from None


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="measure checkpoint speed here, beside torch.save, DCP, safetensors and the disk's own limits",
        description=(
            "Runs the benchmark scenarios of benchmarks/: a ~1.2 GB state (100M parameters with AdamW) and a state "
            "of ~10,000 small tensors, saved, saved asynchronously and restored by preemptible, interleaved with "
            "torch.save, torch.distributed.checkpoint (1 and 2 threads, async) and safetensors, and with the "
            "fsync'd write, read and memcpy of the same bytes. Reports medians and ratios."
        ),
    )
    p.add_argument(
        "--dir",
        type=bench_directory,
        default=None,
        help="where to write, made if missing (default: the system temp dir; use the real target)",
    )
    p.add_argument(
        "--params",
        type=number(low=0, above=True, high=1e13),
        default=100e6,
        help="parameters of the large model (default 100e6)",
    )
    p.add_argument("--small-tensors", type=integer(low=0, high=10_000_000), default=10_000)
    p.add_argument("--rounds", type=integer(low=1, high=1000), default=3)
    p.add_argument("--quick", action="store_true", help="fewer contenders (CI smoke run)")
    p.add_argument("--no-beside", action="store_true", help="skip the training-beside-a-save measurement")
    p.add_argument(
        "--beside-rounds",
        type=integer(low=1, high=1000),
        default=7,
        help="saves measured beside training, for each destination (default 7; about 8 s each)",
    )
    p.add_argument(
        "--throttle-mb-s",
        type=number(low=0, above=True, high=1e6),
        default=None,
        help="also measure training beside a background save to a destination paced to this many MB/s "
        "(a network disk or object store's bandwidth)",
    )
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")


def run(args: argparse.Namespace) -> int:
    from preemptible import bench
    from preemptible.cli.report import unwritable

    if args.json:  # checked before minutes of measuring, not after
        why = unwritable(args.json, "--json")
        if why is not None:
            return fail(PROG, why)
    if args.dir is not None:
        args.dir = os.path.abspath(args.dir)  # (the scenarios join their own paths under it)
        try:
            os.makedirs(args.dir, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=args.dir, prefix=".bench-probe-"):
                pass
        except OSError as e:
            return fail(
                PROG,
                f"could not write in --dir {args.dir}: {e.strerror or e}; expected a directory this user can create "
                "and write files in",
            )
    out = bench.main(
        params=args.params,
        small_tensors=args.small_tensors,
        small_bytes=args.params * 1.2,
        rounds=args.rounds,
        quick=args.quick,
        beside=not args.no_beside,
        beside_rounds=args.beside_rounds,
        throttle=args.throttle_mb_s * 1e6 if args.throttle_mb_s else None,
        work_dir=args.dir,
    )
    if args.json:
        doc = {
            k: (
                {
                    "bytes": v["bytes"],
                    "tensors": v["tensors"],
                    "ratios": v.get("ratios", {}),
                    "median_s": {n: r.median() for n, r in v["results"].items()},
                }
                if isinstance(v, dict) and "results" in v
                else v
            )
            for k, v in out.items()
        }
        try:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
        except OSError as e:
            return fail(PROG, f"could not write {args.json}: {e.strerror or e}; expected a writable file path")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
