"""``preemptible diagnose``: was this run preempted, and what did it lose?"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from preemptible.cli.args import existing_directory, integer


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "diagnose",
        help="tell from logs, an exit code and the journal whether a run was preempted and what it lost",
        description=(
            "Read logs (SLURM, torchrun, kubectl describe/events, docker inspect, dmesg, the training script's own "
            "output; '-' reads stdin), an exit code and the run's journal (--root), and give a verdict: preempted, "
            "time-limit, oom, interrupted (a user's Ctrl-C or a notebook's stop), collective-timeout, crashed, "
            "terminated, killed, completed or unknown, with its confidence and the competing verdict (for unknown: "
            "the most likely cause) and what would decide between them, the "
            "evidence lines, whether a checkpoint committed after the notice, how many steps were lost, how to "
            "confirm, what to fix and the command that verifies the fix. Given the logs of several ranks or nodes "
            "(files, or one log with rank prefixes), it names the initiating event (which rank or node failed first, "
            "and how) and the collateral failures that followed. Logs are streamed: a 1 GiB training log takes "
            "seconds, in bounded memory. With --root, one attempt (process start) of the run is judged: see --attempt. "
            "Exit code: 0 when a verdict was reached, 3 for unknown, 2 for bad arguments."
        ),
    )
    p.add_argument(
        "logs", nargs="*", metavar="LOG", help="log files to read ('-' for stdin); several: one per rank or node"
    )
    p.add_argument(
        "--root",
        type=existing_directory,
        help="the run's checkpoint root (local path or s3://, gs://, az:// URL): reads its journal",
    )
    p.add_argument(
        "--exit-code",
        type=_exit_code,
        default=None,
        metavar="N",
        help="the command's exit code: 0 to 255 as a shell reports it, or minus a signal's number (-1 to -64) as "
        "Python's returncode reports a process a signal ended",
    )
    p.add_argument(
        "--attempt",
        type=_attempt,
        default=None,
        metavar="N|last",
        help="which process start of the run to judge (default: the one the logs' timestamps fall in, else the last)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print JSON (verdict, confidence, competing, deciding, summary, evidence, checkpoint, initiating, "
        "collateral, fix, verify, ...)",
    )


def _exit_code(text: str) -> int:
    """An exit status (0-255) or minus a signal's number (-1 to -64: no signal is numbered above 64)."""
    value = integer(low=-255, high=255)(text)
    if value < -64:
        raise argparse.ArgumentTypeError(
            f"expected 0 to 255 (an exit status) or -1 to -64 (minus a signal's number), found {text!r}: no signal "
            "is numbered above 64; pass the code as the shell or the launcher reported it"
        )
    return value


def _attempt(text: str) -> int | str:
    if text == "last":
        return text
    return integer(low=1, high=1_000_000)(text)


def run(args: argparse.Namespace) -> int:
    from preemptible.diagnose import diagnose, read_log

    if args.attempt is not None and args.root is None:
        print(
            "preemptible diagnose: error: --attempt chooses among the process starts in a run's journal: expected "
            "--root ROOT with it, found none",
            file=sys.stderr,
        )
        return 2
    logs = []
    for path in dict.fromkeys(args.logs):  # (a log named twice is read once)
        try:
            logs.append(read_log(path))
        except OSError as e:
            print(
                f"preemptible diagnose: error: cannot read log {path!r}: {e.strerror or e}; expected a log file "
                "this user can read, or - for standard input",
                file=sys.stderr,
            )
            return 2
    if not logs and args.root is None and args.exit_code is None:
        print("preemptible diagnose: expected at least one of LOG, --root or --exit-code; found none", file=sys.stderr)
        return 2
    try:
        result = diagnose(logs, exit_code=args.exit_code, root=args.root, attempt=args.attempt)
    except ValueError as e:
        print(f"preemptible diagnose: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(result.render())
    return 3 if result.verdict == "unknown" else 0
