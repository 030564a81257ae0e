"""The journal read back as typed records: each line once parsed into a `Record` (its event as the `Event` member,
its time, step and rank checked), and a run's attempts (rank 0's process starts, one journal file each) grouped
once, by `attempts`, for every reader (report, diagnose, drill, inspect).

A journal may come from a stranger: a value that is not what the journal writes (a time that is not one, a step
that is not a step count, a rank that is not a number) reads as None, never as an error.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from preemptible.events import Event
from preemptible.journal._reader import read
from preemptible.store.io import Storage

MAX_STEP = 1 << 53
"""A step beyond this is not a step count (and would not survive float arithmetic)."""

_MAX_TIME_CHARS = 64
_EVENTS = {e.value: e for e in Event}


def parse_time(value: Any) -> float | None:
    """An event's time (UTC ISO 8601, ``t``) in epoch seconds, None if it is not one."""
    if not isinstance(value, str) or len(value) > _MAX_TIME_CHARS:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def parse_step(value: Any) -> int | None:
    """A step count, None for anything else (a string, a float, a bool, a number beyond any real run)."""
    if isinstance(value, int) and not isinstance(value, bool) and -MAX_STEP < value < MAX_STEP:
        return value
    return None


@dataclass(frozen=True)
class Record:
    """One journal line, read.

    ``event``: the `Event` it records, None for a name this version does not write (``name`` keeps it; None when
    the line's ``event`` is not a string). ``time``: ``t`` in epoch seconds. ``step``: a step count or None.
    ``rank``: the rank that wrote it (0 when the line names none; None when it names one that is not a number).
    ``fields``: the line as written, every field (``t``, ``event``, ... included)."""

    event: Event | None
    name: str | None
    time: float | None
    step: int | None
    rank: int | None
    file: str
    fields: Mapping[str, Any]

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Record:
        """The record of one event as `read` gives it (a JSON object with ``file``)."""
        name = fields.get("event")
        name = name if isinstance(name, str) else None
        rank = fields.get("rank", 0)
        return cls(
            event=_EVENTS.get(name) if name is not None else None,
            name=name,
            time=parse_time(fields.get("t")),
            step=parse_step(fields.get("step")),
            rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
            file=str(fields.get("file")),
            fields=fields,
        )

    def get(self, key: str, default: Any = None) -> Any:
        """A field as written (``default`` when the line has none)."""
        return self.fields.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


def records(storage: Storage, *, skipped: dict[str, int] | None = None) -> Iterator[Record]:
    """`read`, each event as a `Record` (same order, same streaming, same counts in ``skipped``)."""
    for fields in read(storage, skipped=skipped):
        yield Record.of(fields)


@dataclass
class Start:
    """One process start of rank 0 (an attempt): its journal file and its records, in the order written. ``index``:
    its place among the starts read (1-based, file order). ``records`` is an iterator: read it before the next
    start is taken."""

    file: str
    index: int
    records: Iterator[Record]


def attempts(events: Iterable[Record], *, skipped: dict[str, int] | None = None) -> Iterator[Start]:
    """Rank 0's records grouped into its process starts (one journal file each), streamed: a start's records are
    read as the caller reads them, so memory does not grow with a journal's length. Another rank's records are left
    out; a record whose rank is not a number is counted in ``skipped`` as ``events``."""
    counts: dict[str, int] = skipped if skipped is not None else {}

    def rank0(items: Iterable[Record]) -> Iterator[Record]:
        for r in items:
            if r.rank is None:
                counts["events"] = counts.get("events", 0) + 1
            elif r.rank == 0:
                yield r

    for index, (name, group) in enumerate(itertools.groupby(rank0(events), key=lambda r: r.file), start=1):
        yield Start(file=name, index=index, records=group)


def attempt_number(start: Start, records: Iterable[Record]) -> int:
    """The attempt number the start's ``start`` event recorded (``records``: the start's); journals older than
    attempt numbers count by file order."""
    first = next((r for r in records if r.event == Event.START), None)
    number = first.get("attempt") if first is not None else None
    return number if isinstance(number, int) and not isinstance(number, bool) else start.index
