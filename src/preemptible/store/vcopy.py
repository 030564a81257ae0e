"""Many small memory copies at once, without the GIL: `scatter`, and `gather` the other way round.

A restore reads each run of small tensors (up to a few MiB of them, back to back in the file) into one buffer,
hashes it there while it is in the CPU's cache, and then copies each tensor's bytes out to its live tensor. Made one
``memmove`` at a time from Python, those copies hold the GIL (letting it go and taking it back per copy costs more
than the copy whenever another thread reads too), so the threads that read take turns at them, and a restore of
10,000 tensors spent about 17 ms of its 100 here in copies made one after the other.

On Linux, ``process_vm_readv`` (man 2 process_vm_readv) aimed at this process itself copies one source range out to
up to ``IOV_MAX`` destinations in one system call, which ctypes makes with the GIL released: the reading threads'
copies overlap, and other threads run meanwhile. A process may always read its own memory this way (the kernel's
ptrace access check passes for its own thread group before any other rule); a destination it cannot write is an
``EFAULT``, not a crash. Where the call is missing (another OS) or refused (a seccomp profile that blocks it:
Docker's default profile allows it from kernel 4.8), the copies are made by memmove, as before, and the call is not
tried again.

A write does the reverse with the same call: a run of small tensors gathered into one buffer, to be hashed and
written (`gather`: many source ranges, one destination; 10,000 tensors of a cold emergency save: 15 ms sooner).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import sys
from collections.abc import Callable, Sequence

import numpy

IOV_MAX = 1024
"""The most destinations of one call (Linux's ``UIO_MAXIOV``)."""
MIN_COPIES = 8
"""Fewer copies than this are made by memmove: a system call and its vector cost a few microseconds."""

memmove: Callable[[int, int, int], int] = ctypes.PYFUNCTYPE(
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
)(int(ctypes.cast(ctypes.memmove, ctypes.c_void_p).value))  # type: ignore[arg-type]
"""memmove(dst, src, n) that keeps the GIL: for copies of microseconds, made 10,000s of times from C (``map``)."""

_REFUSED = frozenset({errno.ENOSYS, errno.EPERM, errno.EACCES})


def _find() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv  # a CDLL call lets the GIL go
    except (AttributeError, OSError):  # a libc without it (older than glibc 2.15)
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    return fn


class _Call:
    readv: Callable[..., int] | None = _find()
    """None where missing, or once refused."""


def available() -> bool:
    """Whether `scatter` copies by system call here (False once the kernel has refused it)."""
    return _Call.readv is not None


def scatter(src: int, dsts: Sequence[int], sizes: Sequence[int]) -> None:
    """Copy the bytes at address ``src`` out in order: the first ``sizes[0]`` to ``dsts[0]``, the next ``sizes[1]``
    to ``dsts[1]``, and so on (the source holds ``sum(sizes)`` bytes; no destination overlaps it).

    IMPORTANT: every address must be valid for its size: the fallback is a raw memmove.

    Raises:
        OSError: the kernel found a destination this process cannot write (``EFAULT``).
    """
    _copy(src, dsts, sizes, out=True)


def gather(dst: int, srcs: Sequence[int], sizes: Sequence[int]) -> None:
    """Copy ``sizes[0]`` bytes from ``srcs[0]`` to address ``dst``, the next ``sizes[1]`` from ``srcs[1]`` right
    after them, and so on: `scatter` the other way round (a write gathering a run of small tensors into one
    buffer; no source overlaps it).

    IMPORTANT: every address must be valid for its size: the fallback is a raw memmove.

    Raises:
        OSError: the kernel found a source this process cannot read (``EFAULT``).
    """
    _copy(dst, srcs, sizes, out=False)


def _copy(one: int, many: Sequence[int], sizes: Sequence[int], *, out: bool) -> None:
    """``out``: from ``one`` to each of ``many`` (`scatter`); otherwise from each of ``many`` to ``one``."""
    n = len(many)
    if n != len(sizes):
        raise ValueError(f"{n} {'destinations' if out else 'sources'} for {len(sizes)} sizes")
    offsets = [0, *itertools.accumulate(sizes)]
    for a in range(0, n, IOV_MAX):
        b = min(n, a + IOV_MAX)
        done = a + _vectored(one + offsets[a], many[a:b], sizes[a:b], out=out) if b - a >= MIN_COPIES else a
        if done < b:
            ones = [one + o for o in offsets[done:b]]
            pairs = (many[done:b], ones) if out else (ones, many[done:b])
            list(map(memmove, *pairs, sizes[done:b]))


def _vectored(one: int, many: Sequence[int], sizes: Sequence[int], *, out: bool) -> int:
    """How many of ``many``, from the first, ``process_vm_readv`` copied (all, unless it is refused or fails for a
    while: the caller copies the rest). ``out``: ``many`` are this process's destinations ("local"), ``one`` the
    source ("remote": this process too); otherwise ``many`` are the sources, ``one`` the destination."""
    readv = _Call.readv
    if readv is None:
        return 0
    vec = numpy.empty((len(many), 2), dtype=numpy.uint64)  # struct iovec {void *base; size_t len}, packed in C
    vec[:, 0] = many
    vec[:, 1] = sizes
    ends = numpy.cumsum(vec[:, 1])
    total, start, done = int(ends[-1]), 0, 0
    pid = os.getpid()
    while done < total:
        single = (ctypes.c_uint64 * 2)(one + done, total - done)
        rest = vec.ctypes.data + start * vec.strides[0], len(many) - start
        if out:
            got = readv(pid, *rest, ctypes.addressof(single), 1, 0)
        else:
            got = readv(pid, ctypes.addressof(single), 1, *rest, 0)
        if got <= 0:
            err = ctypes.get_errno() if got < 0 else errno.EFAULT  # no progress at all: as good as a fault
            if err == errno.EFAULT:
                what = "destination it cannot write, at destination" if out else "source it cannot read, at source"
                raise OSError(err, f"a vectored copy met a {what} {start} (a bug)")
            if err in _REFUSED:
                _Call.readv = None  # refused for good (no such call, or a seccomp profile): memmove from now on
            return start  # a passing failure (ENOMEM): the caller copies the rest
        # A short copy stops after a whole element of the many (the kernel never splits one): the next call goes
        # on from there. One that ever stops inside the first leaves the rest to the caller.
        whole = int(numpy.searchsorted(ends, done + got, side="right"))
        if whole == start:
            return start
        start, done = whole, int(ends[whole - 1])
    return len(many)
