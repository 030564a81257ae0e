"""``preemptible drill -- CMD``: rehearse a preemption of your own command and grade it."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from preemptible.cli.args import directory, fail, integer, number, unrunnable


def _at(value: str) -> float | str:
    if value in ("random", "mid-epoch"):
        return value
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, 'random' or 'mid-epoch', found {value!r}") from None
    if not math.isfinite(seconds) or not 0 <= seconds <= 86400:
        raise argparse.ArgumentTypeError(f"expected seconds from 0 to 86400, 'random' or 'mid-epoch', found {value!r}")
    return seconds


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "drill",
        help="rehearse a preemption of your training command: notice, save, exit, resume, graded PASS/FAIL",
        description=(
            "Start CMD (a script that trains with preemptible.Run), deliver a notice at --at seconds into its loop "
            "(a signal, or a cloud's notice through that cloud's emulator on loopback), measure notice -> boundary "
            "-> commit -> exit against the window, restart CMD and check it resumed from that checkpoint, then stop "
            "it with a second notice. --reference also runs CMD uninterrupted, stops the drilled run in the middle "
            "of an epoch (a loop of run.epochs/run.batches), checks the resumed run ends bit-identical and names "
            "the first step whose run.log figures differ. --kill rehearses a crash: SIGKILL instead of a notice, "
            "then a resume from the last committed checkpoint. --nodes N (2-4, --source aws, as root) rehearses "
            "one node of a multi-node job reclaimed: N simulated nodes in network namespaces of the drill's own "
            "(10.77.0.1..N, nothing leaves loopback or them), an emulator and a torchrun agent per node running CMD "
            "(python SCRIPT ARGS: torchrun runs SCRIPT ARGS under that python), the notice to the last node only "
            "once the first checkpoint commits; it checks every rank stopped at one step with one commit, the "
            "reclaimed node's ranks exit with the platform's code and the others' 76 while their agents restart, "
            "replaces the node, checks the job resumed from that step with nothing lost, and stops it with a second "
            "notice. Exit code 0 when every check passed, 1 otherwise, 2 for bad arguments."
        ),
    )
    p.add_argument("--source", default="signal", choices=["signal", "sigint", "slurm", "aws", "gcp", "azure"])
    p.add_argument(
        "--at",
        type=_at,
        default=None,
        metavar="SECONDS|random|mid-epoch",
        help="when to deliver (default: mid-epoch with --reference, the first checkpoint with --nodes, else 3 s)",
    )
    p.add_argument(
        "--window",
        type=number(low=0, above=True, high=86400),
        default=None,
        metavar="S",
        help="the window to meet (default: the source's)",
    )
    p.add_argument(
        "--root", type=directory, default=None, help="the run's checkpoint root (default: what the run reports)"
    )
    p.add_argument(
        "--reference",
        action="store_true",
        help="also run CMD uninterrupted; compare final states and the figures logged at each step",
    )
    p.add_argument(
        "--kill", action="store_true", help="a crash rehearsal: SIGKILL instead of a notice (no emergency save)"
    )
    p.add_argument(
        "--nodes",
        type=integer(),
        default=None,
        metavar="N",
        help="simulate N nodes (2-4) of a torchrun job and reclaim the last one (--source aws; root, namespaces)",
    )
    p.add_argument(
        "--start-timeout",
        type=number(low=0, above=True, high=86400),
        default=120.0,
        metavar="S",
        help="wait for the Run to start",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")


def run(args: argparse.Namespace) -> int:
    from preemptible.drill import Drill
    from preemptible.errors import PreemptibleError

    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    missing = unrunnable(command)
    if missing is not None:
        return fail("preemptible drill", missing)
    try:
        drill = Drill(
            command,
            source=args.source,
            at=args.at,
            window=args.window,
            root=args.root,
            reference=args.reference,
            kill=args.kill,
            nodes=args.nodes,
            start_timeout=args.start_timeout,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except PreemptibleError as e:
        print(f"preemptible drill: {e}", file=sys.stderr)
        return 2
    report = drill.run()
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render(), flush=True)
    return 0 if report.passed else 1
