"""``preemptible report ROOT``: goodput and what each preemption cost, from the journals of every attempt."""

from __future__ import annotations

import argparse
from typing import Any

from preemptible.cli.args import existing_directory, fail


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="goodput and badput by cause, the preemptions and the runs of steps of every attempt, from the journal",
        description=(
            "Reads every journal under ROOT/journal (every attempt) and splits the wall time, from the first start "
            "to the last event, into goodput (training time of the steps that were kept) and badput: saves, "
            "restore and start-up, steps redone, waiting for the stop step, and the time between attempts. Lists "
            "each preemption (source, notice to commit, window used, steps lost) and each attempt's run of steps."
        ),
    )
    p.add_argument("root", type=existing_directory, help="the checkpoint root (a local directory or a URL)")
    p.add_argument("--json", action="store_true", help="machine-readable output with stable keys")


def run(args: argparse.Namespace) -> int:
    from preemptible import report
    from preemptible.store.io import storage_for

    try:
        doc = report.report(storage_for(args.root))
    except (OSError, ValueError) as e:
        return fail("preemptible report", f"could not read the journal under {args.root}: {e}")
    print(report.to_json(doc) if args.json else report.render(doc))
    return 0
