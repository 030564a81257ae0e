"""The journal: what happened to a run, as JSON lines, one file per rank and process start.

``<root>/journal/<start-utc>-r<rank>.jsonl``. Every event has ``t`` (UTC ISO 8601), ``event``, ``step`` and
``rank``. On a local file system each event is appended and flushed at once, so the journal survives a
``kill -9`` up to the last event; ``diagnose`` and ``drill`` read it after the fact.

Two sides, one vocabulary: `Journal` writes events (`preemptible.events.Event`); `read` streams them back as
JSON objects and `records` as typed `Record` values, grouped into a run's attempts by `attempts`. What each event
carries is `FIELDS` (`_vocabulary`).
"""

from preemptible.journal._reader import MAX_FILE, MAX_LINE, read
from preemptible.journal._records import (
    MAX_STEP,
    Record,
    Start,
    attempt_number,
    attempts,
    parse_step,
    parse_time,
    records,
)
from preemptible.journal._vocabulary import COMMON, FIELDS, NOT_JOURNALED, OPEN
from preemptible.journal._writer import RESERVED, Journal, clean, user_fields

__all__ = [
    "COMMON",
    "FIELDS",
    "MAX_FILE",
    "MAX_LINE",
    "MAX_STEP",
    "NOT_JOURNALED",
    "OPEN",
    "RESERVED",
    "Journal",
    "Record",
    "Start",
    "attempt_number",
    "attempts",
    "clean",
    "parse_step",
    "parse_time",
    "read",
    "records",
    "user_fields",
]
