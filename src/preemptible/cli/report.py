"""``preemptible report ROOT``: goodput and what each preemption cost, from the journals of every attempt."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from preemptible.cli.args import existing_directory, fail
from preemptible.errors import StorageCredentialsError, StorageUnavailableError

PROG = "preemptible report"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="goodput and badput by cause, the preemptions and the runs of steps of every attempt, from the journal",
        description=(
            "Reads every journal under ROOT/journal (every attempt) and splits the wall time, from the first start "
            "to the last event, into goodput (training time of the steps that were kept) and badput: saves, "
            "restore and start-up, steps redone, waiting for the stop step, and the time between attempts. Lists "
            "each preemption (source, notice to commit, window used, steps lost) and each attempt's run of steps. "
            "The journal is read as a stream (memory does not grow with its length); lines it cannot use are "
            "counted under 'skipped', and long figures are drawn from at most a few thousand points."
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
        "--png",
        metavar="FILE",
        help="also write the timeline and figures as a picture (needs preemptible[plot]); its format is the file's "
        "suffix: .png, .svg, .pdf and the others matplotlib writes",
    )


def picture_formats() -> list[str]:
    """The suffixes ``--png`` writes (matplotlib's formats)."""
    import matplotlib  # noqa: F401  (first: a missing matplotlib is an ImportError here, whatever is cached)
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def unwritable(path: str, option: str, formats: list[str] | None = None) -> str | None:
    """Why ``path`` cannot be written as given (a URL, a directory, under a missing directory or a file, a suffix
    matplotlib does not write), or None. Checked before anything is read, so a long report does not end in it."""
    if "://" in path:
        return (
            f"could not write {path}: expected a local file path for {option}, found a URL; write it locally, "
            "then copy it"
        )
    if os.path.isdir(path):
        return f"could not write {path}: expected a file path for {option}, found a directory; name a file in it"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        found = "a file" if os.path.exists(parent) else "nothing"
        probe = parent
        while not os.path.exists(probe) and probe != os.path.dirname(probe):
            probe = os.path.dirname(probe)
        if os.path.exists(probe) and not os.path.isdir(probe):
            found = f"{probe}, which is a file"
        return (
            f"could not write {path}: expected an existing directory {parent}, found {found}; create the directory "
            "or choose another path"
        )
    if formats is not None:
        suffix = os.path.splitext(path)[1].lower().lstrip(".")
        if suffix not in formats:
            listed = ", ".join(f".{f}" for f in formats)
            return (
                f"could not write {path}: expected a file name ending in one of {listed} (the picture's format), "
                f"found {'no suffix' if not suffix else '.' + suffix}"
            )
    return None


def run(args: argparse.Namespace) -> int:
    from preemptible import report
    from preemptible.store.io import storage_for

    formats = None
    if args.png:
        try:
            formats = picture_formats()
        except ImportError:
            return fail(PROG, "--png needs matplotlib: pip install 'preemptible[plot]'")
    for path, option, fmts in ((args.html, "--html", None), (args.png, "--png", formats)):
        why = unwritable(path, option, fmts) if path else None
        if why is not None:
            return fail(PROG, why)
    try:
        doc = report.report(storage_for(args.root))
    except (StorageCredentialsError, StorageUnavailableError):
        raise  # said whole by the command's entry point
    except Exception as e:  # a storage that does not answer, a journal that cannot be listed: one line, no traceback
        text = " ".join(str(e).split())
        return fail(
            PROG,
            f"could not read the journal under {args.root}: {type(e).__name__}: {text}; expected a readable "
            "checkpoint root (check the path, the endpoint and the credentials)",
        )
    print(report.to_json(doc) if args.json else report.render(doc))
    for path, kind in ((args.html, "html"), (args.png, "png")):
        if not path:
            continue
        try:
            if kind == "html":
                page = report.html(doc, args.root)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(page)
            else:
                report.png(doc, path, os.path.splitext(path)[1].lower().lstrip("."))
        except OSError as e:
            return fail(PROG, f"could not write {path}: {e.strerror or e}; expected a writable file path")
        except Exception as e:  # matplotlib refusing what it was given: one line, never a traceback
            text = " ".join(str(e).split())
            return fail(PROG, f"could not draw {path}: {type(e).__name__}: {text}; the --json output has the figures")
        print(f"wrote {path}", file=sys.stderr)
    return 0
