"""The journal's writing side: `Journal` appends a process's events, one JSON line each."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from typing import Any

from preemptible.events import Event
from preemptible.notice import Clock
from preemptible.store import layout
from preemptible.store.io import Storage

log = logging.getLogger("preemptible")


RESERVED = ("t", "event", "step", "rank", "file")
"""The fields the journal writes itself (``file``: the reader adds it, the file an event came from). A field given
to `Journal.event` (and so to ``run.log``) under one of these names is kept under ``user_<name>`` instead."""

_INT_LIMIT = 1 << 63


def clean(value: Any) -> Any:
    """A value as the journal keeps it, in a form every JSON reader accepts: non-finite floats become the strings
    ``"nan"``, ``"inf"`` and ``"-inf"``; an int outside the signed 64-bit range becomes the nearest float, or
    ``"inf"``/``"-inf"`` beyond the float range; dict keys become strings; any other object its ``str()``."""
    if isinstance(value, (float, int)) and not isinstance(value, bool):
        return _clean_number(value)
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if value is None or isinstance(value, (bool, str)):
        return value
    try:
        return str(value)
    except Exception:  # a user's object whose __str__ fails: the journal goes on without it
        return f"<unprintable {type(value).__name__}>"


def _clean_number(value: float) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else str(float(value))
    if -_INT_LIMIT <= value < _INT_LIMIT:
        return int(value)
    try:
        return float(value)
    except OverflowError:
        return "inf" if value > 0 else "-inf"


def user_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with every name the journal writes itself (`RESERVED`) moved to ``user_<name>`` (again, until the
    name is free), so that no event can lose its time, kind, step, rank or file to a figure of the same name."""
    out = {k: v for k, v in fields.items() if k not in RESERVED}
    for k, v in fields.items():
        if k in RESERVED:
            name = f"user_{k}"
            while name in out or name in RESERVED:
                name = f"user_{name}"
            out[name] = v
    return out


class Journal:
    """Appends events for one process. Thread-safe; a failing journal never stops training (it logs once)."""

    def __init__(self, storage: Storage, *, rank: int = 0, clock: Clock = time.time) -> None:
        self._storage = storage
        self._clock = clock
        self.rank = rank
        stamp = layout.now_iso(clock()).replace("-", "").replace(":", "")
        directory = storage.join(storage.root, layout.JOURNAL_DIR)
        self.path = storage.join(directory, f"{stamp}-r{rank}.jsonl")
        self._lock = threading.Lock()
        self._file: Any = None
        self._failed = False
        self._written = 0
        self._directory = directory
        self.report: Any = None
        """A `preemptible.relay.ReportFile` that mirrors the milestones (set by `Run` under ``drill``)."""
        self.last_at: float | None = None
        """When the last event was journaled (the clock's seconds), None before the first."""

    def earlier_starts(self) -> int:
        """How many process starts of rank 0 wrote a journal under this root before this one (their files), for the
        attempt number; 0 when the directory cannot be listed (a first start, or storage that does not answer)."""
        own = self.path.rsplit("/", 1)[-1]
        try:
            names = self._storage.listdir(self._directory)
        except OSError:
            return 0
        return sum(1 for n in names if n.endswith("-r0.jsonl") and n != own and n < own)

    def event(self, event: str, step: int | None, **fields: Any) -> dict[str, Any]:
        now = self._clock()
        self.last_at = now
        record: dict[str, Any] = {"t": layout.now_iso(now), "event": event, "step": step, "rank": self.rank}
        try:
            record.update(clean(user_fields(fields)))
            line = json.dumps(record, allow_nan=False) + "\n"
        except (ValueError, TypeError, RecursionError) as e:  # nested too deep, say: the event without its fields
            record = {**record, "unrecordable": f"{type(e).__name__}: the fields given could not be recorded"}
            line = json.dumps(record, allow_nan=False) + "\n"
        with self._lock:
            if self._failed:
                return record
            try:
                lost = self._lost()
                if self._file is None:
                    self._storage.makedirs(self._directory)
                    self._file = self._storage.append_text(self.path)
                if lost:
                    self._file.write(self._lost_line(lost))
                self._file.write(line)
                self._file.flush()
                self._written += 1
            except OSError as e:
                self._failed = True
                log.warning("journal %s cannot be written (%s); training continues without it", self.path, e)
        if self.report is not None:
            self.report.record(record)
        return record

    def _lost(self) -> int:
        """Local files: if the journal was deleted under the run (the root removed, a cleanup script), say so in
        the log and start it again. Returns how many events were lost with it (0: nothing lost)."""
        if self._file is None or getattr(self._file, "object_store", False):
            return 0
        try:
            if os.fstat(self._file.fileno()).st_nlink > 0:
                return 0
        except (OSError, ValueError):
            return 0
        lost = self._written
        log.warning(
            "the journal %s was deleted while this run was writing it (was the checkpoint root removed?): its %d "
            "earlier events are lost; a new journal starts at the same path with a journal_lost event",
            self.path,
            lost,
        )
        with contextlib.suppress(OSError):
            self._file.close()
        self._file = None
        self._written = 0
        return lost

    def _lost_line(self, lost: int) -> str:
        record = {
            "t": layout.now_iso(self._clock()),
            "event": Event.JOURNAL_LOST.value,
            "step": None,
            "rank": self.rank,
            "lost_events": lost,
            "why": "the journal file was deleted while the run was writing it (the root removed?)",
        }
        self._written += 1
        return json.dumps(record) + "\n"

    def sync(self) -> None:
        """Force the journal to stable storage (called at exit and after saves)."""
        with self._lock:
            if self._file is not None and not self._failed:
                try:
                    if getattr(self._file, "object_store", False):
                        self._file.flush(force=True)  # one PUT of the whole journal so far
                    else:
                        self._file.flush()
                        os.fsync(self._file.fileno())
                except (OSError, AttributeError, ValueError) as e:
                    log.debug("journal sync failed: %s", e)

    def close(self) -> None:
        self.sync()
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None
