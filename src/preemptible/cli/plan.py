"""``preemptible plan ROOT``: will the emergency checkpoint fit in the window? Measured on ROOT itself."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from preemptible import budget
from preemptible.cli.args import integer, number


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="predict whether the emergency checkpoint fits in the notice window, and what would make it fit",
        description=(
            "Measures the fsync'd write bandwidth of ROOT with a short probe (removed afterwards), sizes the state "
            "from its description, predicts the emergency save (one step to the boundary + write + commit + exit) "
            "and compares it with the window. Fits means the prediction leaves 20% of the window spare."
        ),
    )
    p.add_argument(
        "root",
        help="where checkpoints will be written: a directory (not created: a missing one is measured on the nearest "
        "existing parent) or an s3://, gs://, az:// URL",
    )
    p.add_argument("--params", type=number(low=0, above=True, high=1e15), required=True, help="parameters, e.g. 7e9")
    p.add_argument("--optimizer", choices=sorted(budget.OPTIMIZER_MOMENTS), default="adamw")
    p.add_argument("--dtype", choices=sorted(budget.DTYPE_BYTES), default="fp32", help="parameter dtype")
    p.add_argument("--bf16-moments", action="store_true", help="optimizer moments saved as bfloat16")
    p.add_argument(
        "--world-size", type=integer(low=1, high=10_000_000), default=1, help="data-parallel ranks striping the save"
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--window", type=number(low=0, above=True, high=86400 * 365), help="seconds from notice to hard stop"
    )
    group.add_argument("--platform", choices=["aws", "gcp", "azure", "gke", "k8s", "slurm"])
    p.add_argument(
        "--step-time", type=number(low=0, high=86400 * 365), default=0.0, metavar="S", help="seconds per training step"
    )
    p.add_argument(
        "--mtbf",
        type=number(low=0, above=True, high=1e9),
        default=None,
        metavar="HOURS",
        help="mean time between losses without a usable notice (SIGKILL, OOM, a lost node), for the Young/Daly "
        "interval of periodic saves (default: $PREEMPTIBLE_MTBF_HOURS, else 24, shown as assumed)",
    )
    p.add_argument(
        "--bandwidth",
        type=number(low=0, above=True, high=1e15),
        default=None,
        metavar="BYTES_PER_S",
        help="skip the probe",
    )
    p.add_argument(
        "--probe-mb", type=number(low=0, above=True, high=1e6), default=256, help="probe size in MB (default 256)"
    )
    p.add_argument(
        "--compress",
        choices=("auto", "on", "off"),
        default="auto",
        help="as Run(compress=...): auto (default) predicts whether saves would compress here, from this CPU's "
        "measured compression of weights like these and the measured bandwidth",
    )
    p.add_argument(
        "--memory-tier",
        action="store_true",
        help="also predict the memory tier (Run(memory_tier=...)): this node's memory plus one replica on a peer, "
        "against the window, with each tier's Young/Daly interval",
    )
    p.add_argument(
        "--link-bandwidth",
        type=number(low=0, above=True, high=1e15),
        default=None,
        metavar="BYTES_PER_S",
        help="a node's link to its peers, for --memory-tier (default: 1.25e9, 10 Gb/s, shown as assumed)",
    )
    p.add_argument(
        "--ranks-per-node",
        type=integer(low=1, high=10_000_000),
        default=1,
        help="for --memory-tier: ranks on one node (--world-size counts all of them); a node's share is theirs",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output with stable keys")


def run(args: argparse.Namespace) -> int:
    try:
        result = budget.plan(
            args.root,
            params=args.params,
            optimizer=args.optimizer,
            dtype=args.dtype,
            bf16_moments=args.bf16_moments,
            world_size=args.world_size,
            window=args.window,
            platform=args.platform,
            step_time=args.step_time,
            mtbf_hours=args.mtbf,
            bandwidth=args.bandwidth,
            probe_bytes=int(args.probe_mb * 1e6),
            compress=_SETTINGS[args.compress],
        )
        if args.memory_tier:
            result = budget.with_memory_tier(
                result,
                link_bytes_per_s=args.link_bandwidth,
                step_time=args.step_time,
                ranks_per_node=args.ranks_per_node,
            )
    except (ValueError, OSError) as e:
        print(f"preemptible plan: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(budget.render_plan(result, color=_color()))
    return 0 if result.fits else 1


def _color() -> bool:
    return sys.stdout.isatty() and os.environ.get("NO_COLOR") is None and os.environ.get("TERM") != "dumb"


_SETTINGS: dict[str, bool | str] = {"auto": "auto", "on": True, "off": False}
