"""The ``preemptible`` command: one module per subcommand, dispatched here."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from preemptible._version import __version__
from preemptible.cli.args import OneLineParser
from preemptible.errors import PreemptibleError, StorageCredentialsError, StorageUnavailableError

SUBCOMMANDS = ("bench", "diagnose", "drill", "emulate", "export", "inspect", "plan", "report", "run", "verify")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="preemptible",
        description=(
            "Make PyTorch training survive spot reclaims, Kubernetes evictions and SLURM preemption. "
            "The library does the work inside your training script (preemptible.Run); this command holds "
            "the tools around it."
        ),
    )
    parser.add_argument("--version", action="version", version=f"preemptible {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"preemptible.cli.{name}")
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    module = importlib.import_module(f"preemptible.cli.{args.command}")
    try:
        code: int = module.run(args)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a process ended by SIGPIPE
    except (StorageCredentialsError, StorageUnavailableError) as e:  # set-up to fix, said whole: no traceback
        print(f"preemptible {args.command}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a read or write that failed where the subcommand did not expect it: one line, never a trace
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(
            f"preemptible {args.command}: error: {e.strerror or e}{where}; expected a path this process can read "
            "and write, or storage that answers: check it and try again",
            file=sys.stderr,
        )
        return 1
    except PreemptibleError as e:  # a checkpoint or journal that a subcommand did not expect to refuse: one line
        print(f"preemptible {args.command}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    return code
