"""Argument types for every subcommand: a bad path or number is one clear line and exit 2, never a traceback.

Each type raises `argparse.ArgumentTypeError` saying what was expected and what was found; `OneLineParser`
prints it as ``preemptible CMD: error: argument --x: ...`` on one line (argparse's usage block is what ``--help``
is for).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import stat
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from preemptible.store.roots import is_url, local_path


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # "--exit-code=--": argparse drops the "--" and hands the option an empty list, past its type
        if action.nargs is None and action.option_strings and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected one value, found '--'")
        return super()._get_values(action, arg_strings)


def number(*, low: float | None = None, high: float | None = None, above: bool = False) -> Callable[[str], float]:
    """A finite float in [low, high] (or (low, high] with ``above``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, found {text!r}") from None
        lo = "" if low is None else f"{'>' if above else '>='} {low:g}"
        hi = "" if high is None else f"<= {high:g}"
        want = " and ".join(x for x in (lo, hi) if x) or "finite"
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number {want}, found {text!r}")
        if low is not None and (value < low or (above and value == low)):
            raise argparse.ArgumentTypeError(f"expected a number {want}, found {text!r}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"expected a number {want}, found {text!r}")
        return value

    return parse


def integer(*, low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, found {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            span = f"from {low} to {high}" if low is not None and high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"expected a whole number {span}, found {text!r}")
        return value

    return parse


PORT = integer(low=0, high=65535)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return "not a directory"


def directory(text: str) -> str:
    """A checkpoint root or target directory: a URL (checked when used), a directory, or a path not made yet."""
    if is_url(text):
        return text
    path = os.path.expanduser(local_path(text))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise argparse.ArgumentTypeError(f"expected a directory, found {text!r} under a file ({parent})") from None
        return text
    except OSError as e:
        raise argparse.ArgumentTypeError(f"expected a directory, found {text!r} ({e.strerror})") from None
    if not stat.S_ISDIR(mode):
        raise argparse.ArgumentTypeError(f"expected a directory, found {text!r}, which is {_kind(mode)}")
    return text


def local_directory(text: str) -> str:
    """A local directory to write into, there or not yet: its path (``file://``, ``~`` resolved); a URL is refused."""
    checked = directory(text)
    if is_url(checked):
        raise argparse.ArgumentTypeError(f"expected a local directory, found the URL {text!r}")
    return os.path.expanduser(local_path(checked))


def existing_directory(text: str) -> str:
    """A directory that must already be there (a root to read)."""
    checked = directory(text)
    if not is_url(checked) and not os.path.exists(os.path.expanduser(local_path(checked))):
        raise argparse.ArgumentTypeError(f"expected an existing directory, found no {text!r}")
    return checked


def fail(prog: str, message: str, code: int = 2) -> int:
    """Print one line for a failure found after parsing; returns ``code``."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def unrunnable(command: list[str]) -> str | None:
    """Why ``command`` cannot be started (none given, not found, not executable), or None."""
    if not command:
        return "expected a command after --, found none"
    exe = command[0]
    path = exe if os.sep in exe else shutil.which(exe)
    if path is None or not os.path.exists(path):
        return f"cannot start {exe!r}: no such command (expected an executable on PATH or a path to one)"
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        return f"cannot start {exe!r}: it is not an executable file"
    return None
