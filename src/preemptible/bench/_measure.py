"""Measuring: peak memory, fsync'd and cold I/O, the fsync'd write ceiling, CPU time by kind."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from preemptible.state import capture, flatten


class PeakRSS:
    """Samples resident memory in a thread; ``peak`` is the highest value above the start, in bytes."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self.base = self.peak = 0
        self._thread = threading.Thread(target=self._run, name="preemptible-bench-rss", daemon=True)

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.rss() - self.base)

    def __enter__(self) -> PeakRSS:
        self.base = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss() - self.base)


def fsync_path(path: str) -> None:
    for root, _, files in os.walk(path) if os.path.isdir(path) else [(os.path.dirname(path), [], [path])]:
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def drop_cache(path: str) -> None:
    """Evict a file's (or a tree's) clean pages from the page cache, for cold reads."""
    walk = os.walk(path) if os.path.isdir(path) else [(os.path.dirname(path), [], [os.path.basename(path)])]
    for root, _, files in walk:
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def raw_write(path: str, views: list[memoryview], block: int = 64 << 20) -> None:
    """The fsync'd write ceiling: the very same bytes, one file, large sequential writes, one thread."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for view in views:
            for start in range(0, len(view), block):
                piece = view[start : start + block]
                while piece:
                    piece = piece[os.write(fd, piece) :]
        os.fsync(fd)
    finally:
        os.close(fd)


_READ_BUFFERS: dict[int, memoryview] = {}


def raw_read(path: str, block: int = 8 << 20) -> None:
    """Read a file through one reused buffer (a fresh buffer per call would time page faults, not reads)."""
    buf = _READ_BUFFERS.get(block)
    if buf is None:
        buf = _READ_BUFFERS[block] = memoryview(bytearray(block))
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def raw_read_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            raw_read(os.path.join(root, name))


def checksum_share(state: dict[str, Any], save_seconds: float) -> float:
    """Seconds to hash every tensor byte with the checkpoint checksum, in the pieces the writer hashes (small
    tensors gathered), as a fraction of the save."""
    from preemptible.store import checksum
    from preemptible.store import format as tensor_format

    items = list(flatten(capture(state)).tensors.items())
    entries = tensor_format.layout(items)
    pieces = [bytes(p) for p in tensor_format._tensor_pieces(entries, dict(items), tensor_format.CHUNK_BYTES)]
    h = checksum.new()
    t = time.perf_counter()
    for piece in pieces:  # the pieces the writer hashes, small tensors gathered
        h.update(piece)
    return (time.perf_counter() - t) / save_seconds


CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times() -> dict[str, float]:
    """Machine-wide CPU seconds by kind (/proc/stat). The background writer runs at nice 10, so its user time shows
    as ``nice``: training's is ``user``, the kernel's work for the save ``system``/``softirq``. ``process``: this
    process's own (training and the save's threads, without a store or proxy running in a process of its own)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:9]
    except OSError:  # pragma: no cover - not Linux
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return {name: int(v) / tick for name, v in zip(CPU_FIELDS, fields, strict=False)} | {
        "process": own.user + own.system
    }
