"""Reading a log as a stream: bounded memory, bounded length, and only the lines a rule could act on."""

from __future__ import annotations

import codecs
import functools
import io
import os
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy

from preemptible.diagnose._match import COLLATERAL_TABLE, CONTEXT_TABLE, EXIT_TABLE, MARK_TABLE, RULE_TABLE
from preemptible.diagnose._rules import COLLECTIVE_FRAME_WORDS, END_HOOK_WORDS, PEER_LOST_TAG, SPAWN_CHILD_WORDS

MAX_LOG_BYTES = 4 << 30
"""What one input may contribute: of a longer file, its last 4 GiB (how a run ended is at its end); of a stream,
its first 4 GiB."""
MAX_LINE_CHARS = 4096
"""A longer line is scanned by its first 4096 characters; the rest is skipped without being kept."""
SCAN_CHUNK = 4 << 20
"""Bytes read at a time. Memory stays a few chunks, whatever the log's length."""
EDGE_LINES = 256
"""Lines at each end of a log whose timestamps bound its time range (`TimeWindow`), whatever rules they match."""


@functools.cache
def scan_keywords() -> tuple[bytes, ...] | None:
    """Lowercase strings one of which is in every line a rule or the scanner's own structure (tracebacks,
    torchrun's summary, mpirun's report, container status) can act on; None if some rule has no needle."""
    words = {"traceback", "error", "exception", "interrupt", "exit", "failure", "root cause", "==========",
             "process name", "oomkilled", "local_rank", "^c", PEER_LOST_TAG, *END_HOOK_WORDS,
             *COLLECTIVE_FRAME_WORDS, *SPAWN_CHILD_WORDS}  # fmt: skip
    for _, found_in in RULE_TABLE + EXIT_TABLE + COLLATERAL_TABLE + CONTEXT_TABLE + MARK_TABLE:
        if found_in is None:
            return None
        words.update(found_in)
    kept: list[str] = []
    for word in sorted(words, key=len):
        if not any(k in word for k in kept):  # finding the shorter one finds this one's lines too
            kept.append(word)
    return tuple(k.encode() for k in kept)


def read_alone(line: str) -> bool:
    """Whether the streamed reader reads ``line`` for itself (one of `scan_keywords` in it, lowercased as the reader
    lowercases bytes: ASCII letters only); any line when some rule has no needle. Other lines it reads only as the line
    before one that has: the scanner skips them inside a traceback, where they are another process's interleaved
    output, so that reading every line and reading the stream agree."""
    keywords = scan_keywords()
    if keywords is None:
        return True
    low = line.encode(errors="replace").lower()
    return any(k in low for k in keywords)


class LogInput:
    """The lines of one log, read as a stream with bounded memory (`SCAN_CHUNK` bytes at a time, each line cut at
    `MAX_LINE_CHARS`) and bounded length (`MAX_LOG_BYTES`). ``note`` says what was left out, once it is read.

    Iterating gives every line. `numbered` gives only the lines a rule could act on (one of `scan_keywords` in
    them, found in each chunk at C speed) with the line before each, and keeps the first and last `EDGE_LINES`
    lines in ``edges`` for their timestamps: how a long log is read in seconds per gigabyte."""

    def __init__(self, name: str, stream: BinaryIO, *, limit: int = MAX_LOG_BYTES, owned: bool = True) -> None:
        self.name = name
        self._stream = stream
        self._limit = limit
        self._owned = owned
        self.note: str | None = None
        self._from_the_end = False  # a regular file longer than ``limit``: only its end is read
        self.edges: list[str] = []

    def __iter__(self) -> Iterator[str]:
        for _, line in self._read(keywords=None):
            yield line

    def numbered(self) -> Iterator[tuple[int, str]]:
        """(1-based line number, line) of the lines any rule could match, and of the line before each."""
        return self._read(keywords=scan_keywords())

    def _read(self, keywords: tuple[bytes, ...] | None) -> Iterator[tuple[int, str]]:
        try:
            yield from self._chunks(keywords)
        finally:
            if self._owned:
                self._stream.close()

    def _start(self) -> int:
        """Seek to the last `limit` bytes of a longer regular file; the byte budget to read."""
        stream, limit = self._stream, self._limit
        try:
            mode = os.fstat(stream.fileno()).st_mode
            size = os.fstat(stream.fileno()).st_size if stat.S_ISREG(mode) else None
        except (OSError, ValueError, io.UnsupportedOperation):
            size = None
        if size is None or size <= limit:
            return limit
        stream.seek(size - limit)
        self.note, self._from_the_end = (
            f"{self.name}: {size / 2**20:.0f} MiB; only its last {limit >> 20} MiB were read",
            True,
        )
        return limit - len(stream.readline(limit))  # the first line is cut: start at the next whole one

    def _chunks(self, keywords: tuple[bytes, ...] | None) -> Iterator[tuple[int, str]]:
        budget = self._start()
        number = 0  # lines before ``buf``
        carry = b""  # the unfinished last line of the previous chunk (at most MAX_LINE_CHARS of it)
        skipping = False  # inside an over-long line: its rest is dropped up to the newline
        tail: list[bytes] = []
        normal = _Normal(self)
        while True:
            raw = self._stream.read(min(SCAN_CHUNK, budget)) if budget > 0 else b""
            budget -= len(raw)
            data = normal(raw)
            if data is None:
                return
            if raw and not data:
                continue  # (a UTF-16 character split across chunks, a "\r" held back: nothing to read yet)
            if skipping:
                nl = data.find(b"\n")
                if nl < 0 and data:
                    continue
                data, skipping = data[nl:] if nl >= 0 else b"", False
            buf = carry + data
            end = len(buf) if not data else buf.rfind(b"\n")  # at the end of input, the rest is a line
            if end < 0:  # no newline yet: the line goes on in the next chunk
                carry = buf
                if len(buf) > MAX_LINE_CHARS:
                    carry, skipping = buf[:MAX_LINE_CHARS], True
                continue
            carry = buf[end + 1 :]
            if len(carry) > MAX_LINE_CHARS:
                carry, skipping = carry[:MAX_LINE_CHARS], True
            if end > 0 or data:
                if not self.edges and number == 0:
                    self.edges = [_decode(b) for b in _first_lines(buf, end, EDGE_LINES)]
                before = tail[-1] if tail else None  # the last line of the previous chunk
                tail = (tail + _last_lines(buf, end, EDGE_LINES))[-EDGE_LINES:]
                yield from _pick(buf, end, number, keywords, before)
                number += buf.count(b"\n", 0, end) + 1
            if not data:
                break
        self.edges += [_decode(b) for b in tail]
        if budget <= 0 and not self._from_the_end and self._stream.read(1):
            stopped = f"stopped after its first {self._limit >> 20} MiB (the rest was not read)"
            self.note = f"{self.name}: {stopped}" if self.note is None else f"{self.note}; {stopped}"


_GZIP = b"\x1f\x8b"
_HEAD = 512
"""Bytes read before the log's kind is decided (compressed, UTF-16, binary)."""
_UNREADABLE = object()
_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
_NULS = re.compile(rb"\x00+")
_CONTROL_BYTES = bytes(set(range(32)) - {9, 10, 12, 13, 27})  # (tab, newlines, form feed and a colour's escape)


def _binary(head: bytes) -> bool:
    """More than one in twenty of the first bytes are control bytes that no text log has."""
    sample = head[:4096]
    return len(sample) - len(sample.translate(None, _CONTROL_BYTES)) > len(sample) // 20


class _Normal:
    """Each chunk of a log as the scanner reads it: UTF-8 (a UTF-16 log, known by its byte-order mark, is decoded),
    its line breaks made plain (`_line_breaks`); None for a log it cannot read (compressed)."""

    def __init__(self, log: LogInput) -> None:
        self.log = log
        self.first = True
        self.utf16: Any = None  # an incremental decoder
        self.held = False  # the last chunk ended in "\r": whether a "\n" follows is this chunk's first byte
        self.head = b""  # the first bytes, until there are enough to know the log's kind

    def __call__(self, data: bytes) -> bytes | None:
        if self.first:
            self.head += data
            if data and len(self.head) < _HEAD:
                return b""  # (too few bytes yet to tell what the log is)
            data, self.head = self.head, b""
            self.first, self.utf16 = False, self._first_chunk(data)
            if self.utf16 is _UNREADABLE:
                return None
        if self.utf16 is not None and data:
            data = self.utf16.decode(data).encode("utf-8")
        data, self.held = _line_breaks(data, self.held)
        return data

    def _first_chunk(self, data: bytes) -> Any:
        """What the first bytes say about the log: a decoder for UTF-16 (its byte-order mark), `_UNREADABLE` for a
        compressed log, else None; with a note for a compressed, an empty or a binary file."""
        name = self.log.name
        if data.startswith(_GZIP):
            self.log.note = (
                f"{name}: gzip-compressed, not read; expected a text log: decompress it first "
                f"(zcat {name} | preemptible diagnose -)"
            )
            return _UNREADABLE
        if data.startswith(_UTF16_BOMS):
            return codecs.getincrementaldecoder("utf-16")(errors="replace")
        if not data:
            self.log.note = f"{name}: empty (0 bytes); expected the text of a log"
        elif _binary(data):
            self.log.note = f"{name}: binary (control bytes, not text); expected the text of a log"
        return None


def _line_breaks(data: bytes, held: bool) -> tuple[bytes, bool]:
    """``data`` with each carriage return that does not end a CRLF line, and each run of NUL bytes, made a line
    break. A progress bar redraws its line with "\r": a terminal shows each redraw, and whatever is written after the
    last, as its own line (else a scheduler's message after a long bar is cut off with the line); a file system
    pads a log with NULs where a crashed node's last writes were lost, and the next write starts a line. ``held``:
    the previous chunk ended in "\r", kept back until this one says whether a "\n" follows; returns whether this
    one's last "\r" is kept back."""
    if held:
        data = b"\r" + data if data else b"\n"  # (at the end of input, the held "\r" ends a line)
    if b"\x00" in data:
        data = _NULS.sub(b"\n", data)
    if b"\r" not in data:
        return data, False
    keep = data.endswith(b"\r")
    if keep:
        data = data[:-1]
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n"), keep


def _decode(line: bytes) -> str:
    return line[:MAX_LINE_CHARS].decode("utf-8", errors="replace").rstrip("\r\n")


def _first_lines(buf: bytes, end: int, n: int) -> list[bytes]:
    lines: list[bytes] = []
    start = 0
    while start <= end and len(lines) < n:
        stop = buf.find(b"\n", start, end)
        stop = end if stop < 0 else stop
        lines.append(buf[start:stop])
        start = stop + 1
    return lines


def _last_lines(buf: bytes, end: int, n: int) -> list[bytes]:
    lines: list[bytes] = []
    stop = end
    while stop >= 0 and len(lines) < n:
        start = buf.rfind(b"\n", 0, stop) + 1
        lines.append(buf[start:stop])
        stop = start - 1
    return lines[::-1]


def _pick(
    buf: bytes, end: int, number: int, keywords: tuple[bytes, ...] | None, before: bytes | None
) -> Iterator[tuple[int, str]]:
    """The lines of ``buf[:end]`` (numbered from ``number`` + 1) that hold a keyword, with the line before each
    (``before``: the line before ``buf``); every line when ``keywords`` is None."""
    if keywords is None:
        for i, line in enumerate(buf[:end].split(b"\n"), start=number + 1):
            yield i, _decode(line)
        return
    low = buf[:end].lower()
    starts: set[int] = set()
    found: set[int] = set()  # the starts of lines with a keyword (``starts`` also has the line before each)
    for at in _gate(keywords).find(low):
        start = low.rfind(b"\n", 0, at) + 1
        if start in found:
            continue
        found.add(start)
        starts.add(start)
        if start > 0:
            starts.add(low.rfind(b"\n", 0, start - 1) + 1)  # the line before: is it a traceback's frame?
    del low
    if 0 in starts and before is not None:
        yield number, _decode(before)
    counted, lines = 0, number
    for start in sorted(starts):
        lines += buf.count(b"\n", counted, start)
        counted = start
        stop = buf.find(b"\n", start, end)
        yield lines + 1, _decode(buf[start : stop if stop >= 0 else end])


_ENGLISH = b"etaoinsrhldcumfpgwybvkxjqz"
_COMMONNESS = {**{c: 30 - i for i, c in enumerate(_ENGLISH)}, ord(" "): 40, **dict.fromkeys(b"0123456789", 25),
               **dict.fromkeys(b"[]:.,-=/_()'", 15)}  # fmt: skip
"""How common a byte is in a training log, roughly (letters by their frequency in English; spaces, digits and a
timestamp's punctuation are everywhere): a keyword is looked for by its rarest 4 bytes."""


def _rarest_window(word: bytes) -> int:
    """The offset of ``word``'s 4-byte window least likely to occur in ordinary log text ("loss for final step:" is
    looked for by "tep:", not by "loss", which is on every line of a training log)."""
    return min(range(len(word) - 3), key=lambda j: sum(_COMMONNESS.get(b, 1) for b in word[j : j + 4]))


class _Gate:
    """Where in a lowercased chunk any of many keywords occurs, in one pass whatever their number: every 4-byte
    window of the chunk (four little-endian uint32 views, one per offset) is hashed into a table of the keywords'
    rarest 4-byte windows, and only the windows it admits are compared with the keywords themselves. A `bytes.find`
    per keyword costs a pass over the chunk each (150 keywords: half a minute per GiB); this costs a few vector
    operations per byte. Keywords shorter than 4 bytes are found with `bytes.find`."""

    _BITS = 20
    _MUL = numpy.uint32(2654435761)  # Knuth's multiplicative hash

    def __init__(self, keywords: tuple[bytes, ...]) -> None:
        self.short = [k for k in keywords if len(k) < 4]
        self.by_window: dict[int, list[tuple[int, bytes]]] = {}  # a window: (its offset in the keyword, keyword)
        for k in keywords:
            if len(k) >= 4:
                j = _rarest_window(k)
                self.by_window.setdefault(int.from_bytes(k[j : j + 4], "little"), []).append((j, k))
        windows = numpy.array(sorted(self.by_window), dtype=numpy.uint32)
        self.table = numpy.zeros(1 << self._BITS, dtype=bool)
        self.table[self._hash(windows)] = True

    def _hash(self, x: Any) -> Any:
        return (x * self._MUL) >> numpy.uint32(32 - self._BITS)

    def find(self, low: bytes) -> Iterator[int]:
        """The offsets in ``low`` where a keyword starts (some of them, at least one in each line that has one)."""
        for word in self.short:
            at = low.find(word)
            while at >= 0:
                yield at
                stop = low.find(b"\n", at)
                at = low.find(word, stop + 1) if stop >= 0 else -1
        for k in range(4):
            count = (len(low) - k) // 4
            if count <= 0:
                continue
            windows = numpy.frombuffer(low, dtype="<u4", offset=k, count=count)
            admitted = numpy.flatnonzero(self.table[self._hash(windows)])
            for i, window in zip(admitted.tolist(), windows[admitted].tolist(), strict=True):
                at = 4 * i + k
                for j, word in self.by_window.get(window, ()):
                    if at >= j and low.startswith(word, at - j):
                        yield at - j
                        break


@functools.cache
def _gate(keywords: tuple[bytes, ...]) -> _Gate:
    return _Gate(keywords)


def read_log(path: str, *, limit: int = MAX_LOG_BYTES) -> LogInput:
    """A log file (or ``-``, standard input) as a `LogInput`. Raises OSError if it cannot be opened."""
    if path == "-":
        return LogInput("stdin", sys.stdin.buffer, limit=limit, owned=False)
    if os.path.isdir(path):
        raise IsADirectoryError(21, "is a directory, expected a log file", path)
    return LogInput(Path(path).name, open(path, "rb"), limit=limit)
