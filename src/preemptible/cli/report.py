"""``preemptible report ROOT``: goodput and what each preemption cost, from the journals of every attempt."""

from __future__ import annotations

import argparse
import sys
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
    p.add_argument(
        "--html",
        metavar="FILE",
        help="also write the report as one self-contained HTML page (a timeline of the attempts and the figures "
        "logged with run.log; no script, no network)",
    )
    p.add_argument(
        "--png", metavar="FILE", help="also write the timeline and figures as a PNG (needs preemptible[plot])"
    )


def run(args: argparse.Namespace) -> int:
    from preemptible import report
    from preemptible.store.io import storage_for

    try:
        doc = report.report(storage_for(args.root))
    except (OSError, ValueError) as e:
        return fail("preemptible report", f"could not read the journal under {args.root}: {e}")
    if args.png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return fail("preemptible report", "--png needs matplotlib: pip install 'preemptible[plot]'")
    print(report.to_json(doc) if args.json else report.render(doc))
    from preemptible import report_picture

    for path, kind in ((args.html, "html"), (args.png, "png")):
        if not path:
            continue
        try:
            if kind == "html":
                with open(path, "w", encoding="utf-8") as f:
                    f.write(report_picture.html(doc, args.root))
            else:
                report_picture.png(doc, path)
        except OSError as e:
            return fail("preemptible report", f"could not write {path}: {e}")
        print(f"wrote {path}", file=sys.stderr)
    return 0
