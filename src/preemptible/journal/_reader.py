"""The journal's reading side: every line of every journal file under a root, streamed, bounded, and each line
that cannot be an event skipped and counted (a journal may come from a stranger, or be torn by kill -9)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import orjson

from preemptible.store import layout
from preemptible.store.io import Storage

MAX_LINE = 1 << 20
"""The longest journal line `read` parses (bytes); a longer one is skipped and counted. The journal writes lines of
a few hundred bytes."""

MAX_FILE = 1 << 30
"""How much of one journal file `read` reads (bytes); the rest is skipped and counted."""


def read(storage: Storage, *, skipped: dict[str, int] | None = None) -> Iterator[dict[str, Any]]:
    """Every event under ``<root>/journal``, files in name (start-time) order, streamed: memory does not grow with
    a journal's length. Each event gets ``file``, the name of the file it came from (whatever the line says).

    Args:
        storage: the checkpoint root's storage.
        skipped: if given, counts what was left out by why: ``unparsable_lines`` (torn by kill -9, not JSON, not a
            JSON object), ``long_lines`` (longer than `MAX_LINE`), ``files_cut`` (files beyond `MAX_FILE`).
    """
    counts: dict[str, int] = skipped if skipped is not None else {}
    directory = storage.join(storage.root, layout.JOURNAL_DIR)
    for name in sorted(storage.listdir(directory)):
        if not name.endswith(".jsonl"):
            continue
        for line in _lines(storage, storage.join(directory, name), counts):
            record = _parse(line)
            if not isinstance(record, dict):
                counts["unparsable_lines"] = counts.get("unparsable_lines", 0) + 1
                continue
            record["file"] = name
            yield record


def _parse(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass  # NaN, Infinity, ints beyond 64 bits, bytes that are not UTF-8: the standard library's reading, or none
    try:
        return json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None  # a line torn by kill -9 (or one no journal writes: nested too deep to be an event)


def _lines(storage: Storage, path: str, counts: dict[str, int]) -> Iterator[bytes]:
    """The lines of one file, read in chunks; a line longer than `MAX_LINE` is skipped whole."""
    chunk = bytearray(1 << 20)
    view = memoryview(chunk)
    split = _Splitter(counts)
    total = 0
    stream = storage.open_read(path)
    try:
        while True:
            n = stream.readinto(view)
            if not n:
                break
            total += n
            yield from split.lines(chunk, view[:n], n)
            if total >= MAX_FILE:
                counts["files_cut"] = counts.get("files_cut", 0) + 1
                return
    finally:
        with contextlib.suppress(Exception):
            stream.close()
    last = split.end()
    if last is not None:
        yield last


class _Splitter:
    """Cuts chunks into lines: a line split across chunks is kept until its end (``pending``); one longer than
    `MAX_LINE` is dropped as it comes (``too_long``) and counted once, at its end."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.pending = bytearray()
        self.too_long = False

    def lines(self, chunk: bytearray, data: memoryview, n: int) -> Iterator[bytes]:
        """The whole lines that end in ``data`` (``chunk[:n]``); the unfinished rest is kept for the next chunk."""
        start = 0
        while True:
            end = chunk.find(b"\n", start, n)
            if end < 0:
                self._carry(data[start:])
                return
            line = self._line(data, start, end)
            if line is not None:
                yield line
            start = end + 1

    def end(self) -> bytes | None:
        """The last line of the file, when it has no newline."""
        if self.too_long:
            self._long()
            return None
        return bytes(self.pending) if self.pending else None

    def _carry(self, rest: memoryview) -> None:
        if not self.too_long:
            self.pending += rest
            if len(self.pending) > MAX_LINE:
                self.too_long, self.pending = True, bytearray()

    def _line(self, data: memoryview, start: int, end: int) -> bytes | None:
        if self.too_long:
            self._long()
            self.too_long = False
            return None
        if self.pending:
            self.pending += data[start:end]
            line, self.pending = self.pending, bytearray()
            if len(line) > MAX_LINE:
                self._long()
                return None
            return bytes(line)
        if end - start > MAX_LINE:
            self._long()
            return None
        return bytes(data[start:end]) if end > start else None

    def _long(self) -> None:
        self.counts["long_lines"] = self.counts.get("long_lines", 0) + 1
