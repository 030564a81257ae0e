"""The ``preemptible`` command: one module per subcommand, dispatched here."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from preemptible._version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="preemptible",
        description=(
            "Make PyTorch training survive spot reclaims, Kubernetes evictions and SLURM preemption. "
            "The library does the work inside your training script (preemptible.Run); this command holds "
            "the tools around it."
        ),
    )
    parser.add_argument("--version", action="version", version=f"preemptible {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first
