"""The ``preemptible`` command: one module per subcommand, dispatched here."""

from __future__ import annotations

import argparse
import importlib
import io
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from preemptible._version import __version__
from preemptible.cli.args import OneLineParser
from preemptible.errors import PreemptibleError, StorageCredentialsError, StorageUnavailableError

SUBCOMMANDS = ("bench", "diagnose", "drill", "emulate", "export", "inspect", "plan", "report", "run", "verify")
READERS = ("diagnose", "export", "inspect", "report", "verify")
"""Subcommands that print what they read from checkpoints, journals and logs: their text goes out escaped."""

_CHATTY = ("gcsfs", "s3fs", "adlfs", "fsspec", "aiobotocore", "botocore", "azure", "google", "aiohttp", "urllib3")
"""Storage clients' loggers, which print a traceback for each failed retry through logging's last-resort handler."""
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


class _Escaped(io.TextIOBase):
    """A text stream that writes control characters (a terminal's escape sequences, carriage returns, bidi
    overrides) as ``\\xNN`` / ``\\uNNNN``: a value from a hostile checkpoint or journal is shown, never obeyed."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(_CONTROL.sub(lambda m: ascii(m.group())[1:-1], text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return int(self._stream.fileno())

    def isatty(self) -> bool:
        return bool(self._stream.isatty())


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
    for name in _CHATTY:  # their retries' tracebacks on stderr: the one line below says what failed and what to do
        logging.getLogger(name).setLevel(logging.CRITICAL)
    stdout = sys.stdout
    if args.command in READERS:
        sys.stdout = _Escaped(stdout)
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
    finally:
        sys.stdout = stdout
    return code
