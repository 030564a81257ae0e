"""``preemptible run -- CMD``: relay cloud notices as signals, forward signals to the group, reap zombies."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run any training command with cloud notices relayed as signals and signals forwarded to its group",
        description=(
            "Start CMD in its own process group; forward SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 to the whole "
            "group (fixes shell wrappers and PID 1); poll the cloud's metadata service (as the library would: "
            "PREEMPTIBLE_SOURCES, the endpoint variables, or detection) and on a notice write it to "
            "$PREEMPTIBLE_NOTICE_FILE and send --signal to the group at once; reap orphaned zombies; exit with "
            "CMD's exit code (128+N if it died of signal N)."
        ),
    )
    p.add_argument(
        "--sources", default=None, help="e.g. 'aws' or 'gcp,azure' (default: $PREEMPTIBLE_SOURCES or detect)"
    )
    p.add_argument("--signal", default="SIGTERM", help="what a cloud notice becomes (default SIGTERM)")
    p.add_argument("-q", "--quiet", action="store_true", help="do not report relayed notices and forwarded signals")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")


def run(args: argparse.Namespace) -> int:
    from preemptible.errors import PreemptibleError
    from preemptible.sources.signals import parse_signal
    from preemptible.wrapper import Wrapper

    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not args.quiet:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger = logging.getLogger("preemptible")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        wrapper = Wrapper(command, sources=args.sources, relay_signal=parse_signal(args.signal))
    except PreemptibleError as e:
        print(f"preemptible run: {e}", file=sys.stderr)
        return 2
    return wrapper.run()
