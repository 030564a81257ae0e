"""Reading one file on two threads or more, though its checksum must see its bytes in order.

A restore reads its files on a few threads, a file per thread. Nine files of the same size on two threads leave one
thread idle for the whole of the ninth (a warm restore of 1.2 GB here: 34 of 192 ms). A file's checksum (XXH3 of the
whole file, `checksum`) must be fed its bytes in order, but the bytes need not be read in order: an idle thread reads
the file's large-tensor chunks from its end backwards, straight into their tensors, while the file's own thread reads
and hashes from its start. Once the two meet, the file's thread only hashes what the helper read (from memory, at
several times the speed of a read) and the checksum is the whole file's, as before.

The file's own thread decides, per chunk, whether it reads a chunk or a helper has (`Assisted.own`); a helper claims
the last chunk no one has (`Assisted.help`). Both happen under one lock, so a chunk is read once. The file's thread
waits for a helper's chunk before hashing it (`Assisted.wait`), and `Assisted.close` lets no helper start another
and waits for those reading: once the file's read has ended, well or not, no helper writes into its tensors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

PRead = Callable[[memoryview, int], int]
"""``pread(buffer, offset)``: read into ``buffer`` from ``offset`` of the file; how many bytes came (fewer at its
end). It does not move the file's own position."""

HELD_BYTES = 32 << 20
"""The most bytes of runs of small tensors that helpers of one file hold in buffers of their own until the file's
thread has hashed them (a restore of 10,000 tensors in files of 13, 40 and 67 MB on two threads: 7 MB)."""


class Piece(NamedTuple):
    """A piece of a file a helper may read: from ``offset``, straight into ``view`` (part of a large tensor), or,
    when ``view`` is None, ``nbytes`` (a run of small tensors) into a buffer of its own, then spread."""

    offset: int
    view: memoryview | None
    nbytes: int = 0


class ShortRead(Exception):
    """A helper's piece ended early: the file is shorter than its header says."""

    def __init__(self, offset: int, missing: int) -> None:
        super().__init__(f"{missing} bytes missing at byte {offset}")
        self.offset = offset
        self.missing = missing


class Assisted:
    """One file's pieces, in file order, that other threads may read from the end while its own thread reads from
    the start.

    ``spread(k, buffer)``: what a helper does with run ``k`` once read into ``buffer`` (copy its tensors out);
    what it returns, `wait` returns with the buffer. ``on_read``: told the bytes of each piece a helper reads (a
    progress meter).
    """

    def __init__(
        self,
        pread: PRead,
        pieces: Sequence[Piece],
        spread: Callable[[int, torch.Tensor], object],
        on_read: Callable[[int], None],
        *,
        held_bytes: int = HELD_BYTES,
    ) -> None:
        self._pread = pread
        self._pieces = pieces
        self._spread = spread
        self._on_read = on_read
        self._held = held_bytes  # what helpers may still hold of runs
        self._cond = threading.Condition(threading.Lock())
        self._own = 0  # the file's thread has taken pieces [0, _own)
        self._tail = len(pieces)  # helpers have taken pieces [_tail, len)
        self._state: list[object] = [None] * len(pieces)  # a helper's result, or its error
        self._reading = 0
        self._closed = False

    def left(self) -> int:
        """Pieces a helper may still take."""
        return max(0, self._tail - self._own)

    def own(self, k: int) -> bool:
        """The file's thread, at piece ``k`` (in order): True if it reads it, False if a helper has taken it (and every
        piece after it)."""
        with self._cond:
            if k < self._tail:
                self._own = k + 1
                return True
            return False

    def wait(self, k: int) -> object:
        """Once a helper has read piece ``k``: None for part of a large tensor, ``(buffer, what spread returned)`` for
        a run. Raises the helper's error: `ShortRead`, an `OSError`, or spread's."""
        with self._cond:
            while self._state[k] is None:
                self._cond.wait()
            state = self._state[k]
        if isinstance(state, BaseException):
            raise state
        return None if state is True else state

    def help(self) -> bool:
        """Read the last piece no thread has taken; False when none is left, a run would hold more than this file's
        helpers may, or the read has ended."""
        with self._cond:
            if self._closed or self._tail <= self._own:
                return False
            k = self._tail - 1
            piece = self._pieces[k]
            if piece.view is None:
                if piece.nbytes > self._held:
                    self._own = self._tail  # none left to helpers: the file's thread reads the rest
                    return False
                self._held -= piece.nbytes
            self._tail = k
            self._reading += 1
        result: object
        try:
            if piece.view is not None:
                self._read(piece.view, piece.offset)
                result = True
            else:
                buffer = torch.empty(piece.nbytes, dtype=torch.uint8)
                self._read(memoryview(buffer.numpy()), piece.offset)  # type: ignore[arg-type]
                result = (buffer, self._spread(k, buffer))
        except BaseException as e:  # the file's thread raises it, when it comes to this piece
            result = e
        with self._cond:
            self._state[k] = result
            self._reading -= 1
            self._cond.notify_all()
        return True

    def _read(self, view: memoryview, offset: int) -> None:
        got = 0
        while got < len(view):
            n = self._pread(view[got:], offset + got)
            if n <= 0:
                raise ShortRead(offset + got, len(view) - got)
            got += n
        self._on_read(got)

    def close(self) -> None:
        """No helper starts another piece; returns once those reading are done."""
        with self._cond:
            self._closed = True
            while self._reading:
                self._cond.wait()


class Helpers:
    """The files of one read that other threads may help (`Assisted`), for the threads with no file left to start.

    Each of the ``files`` reports once that its chunks are on offer (`offer`), and once that its read has ended
    (`ended`, whether it offered or not), so a thread that asks for help while a file is still finding its chunks
    waits for them rather than leaving.
    """

    def __init__(self, files: int) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._open: list[Assisted] = []
        self._unsettled = files  # files that have neither offered chunks nor ended

    def offer(self, assisted: Assisted) -> None:
        with self._cond:
            self._open.append(assisted)
            self._unsettled -= 1
            self._cond.notify_all()

    def ended(self, assisted: Assisted | None) -> None:
        """A file's read has ended (``assisted``: what it offered, if it did); no helper reads its chunks now."""
        if assisted is not None:
            assisted.close()
        with self._cond:
            if assisted is None:
                self._unsettled -= 1
            else:
                self._open.remove(assisted)
            self._cond.notify_all()

    def help(self) -> bool:
        """Read one chunk of the open file with the most left. False once no file has any left and none may offer
        more; until then, waits for one to offer."""
        while True:
            with self._cond:
                best = max(self._open, key=Assisted.left, default=None)
                if best is None or not best.left():
                    if self._unsettled <= 0:
                        return False
                    self._cond.wait()
                    continue
            if best.help():
                return True
