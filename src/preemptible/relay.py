"""Files through which the operator tools talk to a `Run` inside the command they wrap.

- ``PREEMPTIBLE_NOTICE_FILE``: ``preemptible run`` writes the notice it relays (JSON: source, kind, deadline, ...)
  to this path *before* it signals the command. When the signal arrives, the library reads the file at the next
  step boundary and budgets with the real notice (AWS's 2 minutes) rather than a signal's default grace.
- ``PREEMPTIBLE_REPORT_FILE``: a `Run` on rank 0 mirrors its journal's milestones (start, resume, notice, saves,
  exit) to this path, rewritten whole and atomically at each one, so ``preemptible drill`` can follow a command
  whose checkpoint root it was not told.
- ``PREEMPTIBLE_DRILL_AIM=mid-epoch``: set by ``preemptible drill`` beside the report file. A `Run` looping with
  ``run.epochs``/``run.batches`` holds at one boundary in the middle of an epoch (`preemptible.loaders.MidEpochAim`),
  reports it (a ``progress`` event with ``held``) and waits there for the drill's notice or kill, so that the stop
  lands mid-epoch whatever the machine's speed. A loop of another shape reports ``held: false`` at its first boundary.

Both are plain local files; neither is read or written inside a signal handler.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from typing import Any

from preemptible.events import Event
from preemptible.notice import Notice

log = logging.getLogger("preemptible")

NOTICE_FILE_ENV = "PREEMPTIBLE_NOTICE_FILE"
REPORT_FILE_ENV = "PREEMPTIBLE_REPORT_FILE"
AIM_ENV = "PREEMPTIBLE_DRILL_AIM"
MID_EPOCH = "mid-epoch"
"""The one value of `AIM_ENV`: hold in the middle of an epoch."""


def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` so a reader sees the old file or the new one, never a torn one."""
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_notice_file(path: str, notice: Notice, *, relayed_as: str) -> None:
    write_json_atomic(path, {**notice.to_json(), "relayed_as": relayed_as, "relayed_by": os.getpid()})


def read_notice_file(path: str) -> Notice | None:
    """The notice a wrapper left at ``path``; None when there is none. A malformed file is logged and ignored
    (the signal's own deadline then stands)."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("cannot read the relayed notice at %s (%s); using the signal's own deadline", path, e)
        return None
    if not raw.strip():
        return None
    try:
        return Notice.from_json(json.loads(raw))
    except ValueError as e:
        log.warning(
            "the relayed notice at %s is malformed: expected JSON with source, kind, received_at and deadline "
            "(as preemptible run writes it), found %r (%s); using the signal's own deadline",
            path,
            raw[:200],
            e,
        )
        return None


class ReportFile:
    """Rank 0's milestones, for ``preemptible drill``: ``{"pid", "root", "journal", "events": [...]}``."""

    MILESTONES = frozenset(
        e.value
        for e in (
            Event.START,
            Event.FRESH,
            Event.RESUME,
            Event.FRAMEWORK_FALLBACK,
            Event.FRESH_AFTER_CORRUPTION,
            Event.NOTICE,
            Event.ADVISORY,
            Event.PROGRESS,
            Event.SAVE_COMMITTED,
            Event.SAVE_FAILED,
            Event.SAVE_SKIPPED,
            Event.EXIT,
            Event.DONE,
            Event.REQUEUE,
        )
    )
    """The events the drill reads (by their journal names)."""

    def __init__(self, path: str, *, root: str, journal: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._doc: dict[str, Any] = {"pid": os.getpid(), "root": root, "journal": journal, "events": []}
        self._failed = False
        self._write()

    @classmethod
    def from_env(cls, *, root: str, journal: str) -> ReportFile | None:
        path = os.environ.get(REPORT_FILE_ENV, "").strip()
        return cls(path, root=root, journal=journal) if path else None

    def record(self, event: dict[str, Any]) -> None:
        if event.get("event") not in self.MILESTONES:
            return
        with self._lock:
            self._doc["events"].append(event)
            self._write()

    def _write(self) -> None:
        if self._failed:
            return
        try:
            write_json_atomic(self.path, self._doc)
        except OSError as e:
            self._failed = True
            with contextlib.suppress(Exception):
                log.warning(
                    "the drill report file %s cannot be written (%s); the drill will not see this run", self.path, e
                )
