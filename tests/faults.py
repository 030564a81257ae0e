"""Storage that misbehaves on purpose: for faults that cannot be produced for real on this machine (a slow disk,
an I/O error at byte N). Subclasses of the real local storage, so everything else is the real code path."""

from __future__ import annotations

import threading
import time

from preemptible.store.io import LocalStorage, WriteStream


class Boom(OSError):
    """An injected I/O failure."""


class _Writer:
    def __init__(self, inner: WriteStream, storage: FaultyStorage) -> None:
        self._inner = inner
        self._storage = storage

    def write(self, data: memoryview) -> None:
        s = self._storage
        with s.lock:
            s.writes += 1
            s.written += len(data)
            fail = s.fail_after is not None and s.written > s.fail_after
        if fail:
            s.fault()
        if s.seconds_per_mb:
            time.sleep(len(data) / 1e6 * s.seconds_per_mb)
        self._inner.write(data)

    def close(self) -> None:
        self._inner.close()

    def abort(self) -> None:
        self._inner.abort()


class FaultyStorage(LocalStorage):
    """Local storage whose writes can be slowed (``seconds_per_mb``) or fail after ``fail_after`` bytes."""

    def __init__(self, root: str, *, seconds_per_mb: float = 0.0, fail_after: int | None = None) -> None:
        super().__init__(root)
        self.seconds_per_mb = seconds_per_mb
        self.fail_after = fail_after
        self.writes = 0
        self.written = 0
        self.lock = threading.Lock()

    def open_write(self, path: str) -> WriteStream:
        return _Writer(super().open_write(path), self)

    def fault(self) -> None:
        """What happens once ``fail_after`` bytes are written: an I/O error (a subclass may do worse)."""
        raise Boom(5, "injected I/O error")
