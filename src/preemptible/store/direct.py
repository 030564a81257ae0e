"""Direct I/O for checkpoint files on local disks: ``O_DIRECT`` writes that bypass the page cache.

Why: on this kind of machine a buffered write followed by fsync reached 0.30 GB/s and spent 2.2-2.5 s of CPU per
1.2 GB (copying into the page cache, then writeback), while ``O_DIRECT`` writes of the same bytes reached
0.6-0.9 GB/s with 0.05 s of CPU. Faster emergency saves, and background saves that leave the CPU to training.

``O_DIRECT`` needs block-aligned memory, file offsets and lengths. Pieces whose memory is already aligned (the
staging arena, laid out so) go straight to the disk, behind any whole blocks the bounce buffer holds (a file's
header) in the same ``writev``; anything else is copied into an aligned bounce buffer first (a memcpy, about 20x
faster than the disk). The last partial block is written padded and the file truncated to its true size. A file
system that refuses ``O_DIRECT`` (tmpfs, some network file systems) gets ordinary buffered
writes instead, decided once per file; ``PREEMPTIBLE_DIRECT_IO=0`` turns it off everywhere.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import io
import mmap
import os
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

ALIGN = 4096
BOUNCE_BYTES = 16 << 20
ENV = "PREEMPTIBLE_DIRECT_IO"
O_DIRECT = getattr(os, "O_DIRECT", 0)


def enabled() -> bool:
    return bool(O_DIRECT) and os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def address(view: memoryview) -> int | None:
    """The memory address of a contiguous writable buffer, or None (read-only buffers: bytes)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError, BufferError):
        return None


BUFFERS_PER_WRITER = 2  # a writer thread holds a bounce buffer, and one that gathers small tensors


class PooledBuffer:
    """An aligned ``BOUNCE_BYTES`` buffer, held by one user at a time and given back: a `DirectWriter`'s bounce
    buffer, `read_pieces`' read buffer, the buffer a tensor file's small tensors are gathered into
    (`format._tensor_pieces`), or the writer's buffer that gathers small writes for a stream that does not (an
    object store's upload, a file system without ``O_DIRECT``).

    Kept for the life of the process (as many as ran at once: with 2 writer threads, 64 MiB). Why: a save's threads
    are new each time, and each made buffers of its own, faulted them page by page and dropped them at every save:
    16,500 page faults and 0.05-0.07 s of system CPU per save here, paid in the emergency save too, which copies
    every byte of the live tensors through one (their memory is seldom page-aligned). A new buffer's pages are
    faulted as they are first used (a save of a few KB touches a few pages); `reserve`, run by a background save
    after its commit, makes and touches whole those an emergency save's threads will need."""

    __slots__ = ("addr", "mapping", "touched", "view")
    _idle: ClassVar[list[PooledBuffer]] = []  # made, and held by nobody now
    _made: ClassVar[int] = 0
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.mapping = mmap.mmap(-1, BOUNCE_BYTES, flags=mmap.MAP_PRIVATE)  # anonymous mappings are page-aligned
        self.view = memoryview(self.mapping)
        addr = address(self.view)
        assert addr is not None
        assert addr % ALIGN == 0
        self.addr = addr
        self.touched = False  # every page faulted in
        with PooledBuffer._lock:
            PooledBuffer._made += 1

    @staticmethod
    def take() -> PooledBuffer:
        with PooledBuffer._lock:
            if PooledBuffer._idle:
                return PooledBuffer._idle.pop()
        return PooledBuffer()

    def give_back(self) -> None:
        with PooledBuffer._lock:
            PooledBuffer._idle.append(self)

    @staticmethod
    def reserve(count: int) -> None:
        """Make buffers until ``count`` exist, and touch every page of the idle ones: an emergency save's
        buffers then fault nothing in their window. Not in a hurry (a background save's writer runs it after its
        commit): 64 MiB once, with 2 writer threads."""
        with PooledBuffer._lock:
            missing = count - PooledBuffer._made
        for _ in range(missing):
            PooledBuffer().give_back()
        with PooledBuffer._lock:  # taken out while touched: nobody else may write into one meanwhile
            cold = [b for b in PooledBuffer._idle if not b.touched]
            PooledBuffer._idle[:] = [b for b in PooledBuffer._idle if b.touched]
        for b in cold:
            ctypes.memset(b.addr, 0, BOUNCE_BYTES)
            b.touched = True
            b.give_back()


def open_direct(path: str) -> int | None:
    """An ``O_DIRECT`` descriptor for writing ``path``, or None where the file system refuses it."""
    if not enabled():
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_DIRECT, 0o644)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            return None
        raise


class DirectWriter:
    """Writes a file with ``O_DIRECT``; see the module docstring. One writer per thread at a time."""

    coalesces = True  # small writes are gathered here already

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        self._bounce: PooledBuffer | None = PooledBuffer.take()
        self._buf, self._buf_addr = self._bounce.view, self._bounce.addr
        self._used = 0
        self._offset = 0  # bytes on disk so far, always a multiple of ALIGN

    def write(self, data: memoryview) -> None:
        assert self._fd is not None, "write after close"
        addr = address(data)
        while data:
            if self._used % ALIGN == 0 and addr is not None and addr % ALIGN == 0 and len(data) >= ALIGN:
                # Straight from where it lies. Whole blocks already in the bounce buffer (a file's header, padded
                # to a block) go first, in the same system call: copied in behind them instead, the first piece
                # of every file (16 MiB) was a memcpy more, made before its write (10,000 tensors: 47 of 121 MB).
                n = len(data) - len(data) % ALIGN
                self._write_all(self._buf[: self._used], data[:n])  # an empty bounce buffer: the piece alone
                self._used = 0
                data = data[n:]
                addr += n
                continue
            take = min(len(self._buf) - self._used, len(data))
            if addr is not None:
                ctypes.memmove(self._buf_addr + self._used, addr, take)  # releases the GIL
                addr += take
            else:
                self._buf[self._used : self._used + take] = data[:take]
            self._used += take
            data = data[take:]
            if self._used == len(self._buf):
                self._write_all(self._buf)
                self._used = 0

    def _write_all(self, *views: memoryview) -> None:
        """Write ``views`` in order, each whole blocks of aligned memory (one ``writev``, unless it comes back
        short: then the rest)."""
        assert self._fd is not None
        pending = [v for v in views if v]
        while pending:
            n = os.writev(self._fd, pending) if len(pending) > 1 else os.write(self._fd, pending[0])
            if n <= 0:  # pragma: no cover - the kernel reports errors by raising
                raise OSError(errno.EIO, f"short direct write to {self.path}")
            self._offset += n
            while n and pending:  # drop what went out; a view cut short goes on from where it stopped
                first = pending[0]
                if n >= len(first):
                    n -= len(first)
                    pending.pop(0)
                else:
                    pending[0] = first[n:]
                    n = 0

    def close(self) -> None:
        if self._fd is None:
            return
        fd = self._fd
        try:
            if self._used:
                size = self._offset + self._used
                padded = -(-self._used // ALIGN) * ALIGN
                ctypes.memset(self._buf_addr + self._used, 0, padded - self._used)
                self._write_all(self._buf[:padded])
                os.ftruncate(fd, size)
                self._used = 0
            os.fsync(fd)
        finally:
            self._fd = None
            os.close(fd)
            self._give_back()

    def abort(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
            self._give_back()

    def _give_back(self) -> None:
        bounce, self._bounce = self._bounce, None
        if bounce is not None:
            bounce.give_back()


def read_pieces(stream: Any, fallback: memoryview) -> Iterator[memoryview]:
    """A whole file's bytes in pieces, for reading back a file just written (to verify it).

    A local file is read with ``O_DIRECT`` into an aligned bounce buffer (`PooledBuffer`), held until the last piece
    is consumed: from the disk itself, as a restore on another machine would, without copying through the page
    cache or filling it with a file nobody reads again. That costs a reader beside training a small share of the
    CPU an ordinary read does. A stream that is not a local file, or a file system that refuses ``O_DIRECT``, is
    read with ordinary reads into ``fallback``.
    """
    fd = stream.fileno() if isinstance(stream, io.FileIO) else None
    if fd is not None and enabled():
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | O_DIRECT)
        except OSError:  # tmpfs and some network file systems
            fd = None
    if fd is None:
        while n := stream.readinto(fallback):
            yield fallback[:n]
        return
    size = os.fstat(fd).st_size
    bounce = PooledBuffer.take()
    view = bounce.view
    try:
        pos, aligned = 0, True
        while pos < size:
            if aligned and pos % ALIGN:  # a short read before the end (the kernel may give one): the rest buffered
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~O_DIRECT)
                aligned = False
            n = os.readv(fd, [view])
            if n <= 0:  # the file shrank since: the caller's checksum tells
                return
            pos += n
            yield view[:n]
    finally:
        bounce.give_back()
