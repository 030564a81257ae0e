"""A storage that takes writes no faster than a set rate: a slow destination on a fast machine.

Benchmarks and tests use it to stand for a network disk or an object store's per-machine bandwidth (cgroup v1
here has no ``io.max``, and a loop device under ``blkio`` throttling needs privileges CI lacks). One token bucket is
shared by every stream the storage opens, so parallel writers share the rate as they would share a link. Writing
blocks the writer (it sleeps), as a slow device does; reads are not paced.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from preemptible.store.io import Storage, WriteStream

BURST_S = 0.05
"""The bucket holds this many seconds of bytes: short bursts pass at full speed, as on a device with a cache."""


class Pacer:
    """A token bucket of ``rate`` bytes per second (thread-safe)."""

    def __init__(
        self,
        rate: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"expected a rate > 0 bytes/s, found {rate}")
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._free_at = clock()  # when the bucket has room for the next byte
        self.paced_s = 0.0

    def take(self, n: int) -> None:
        with self._lock:
            now = self._clock()
            start = max(self._free_at, now - BURST_S)
            self._free_at = start + n / self.rate
            wait = self._free_at - now - BURST_S
        if wait > 0:
            self.paced_s += wait
            self._sleep(wait)


class _PacedStream:
    def __init__(self, inner: WriteStream, pacer: Pacer) -> None:
        self._inner = inner
        self._pacer = pacer
        self.coalesces = getattr(inner, "coalesces", False)

    def write(self, data: memoryview) -> None:
        self._pacer.take(len(data))
        self._inner.write(data)

    def close(self) -> None:
        self._inner.close()

    def abort(self) -> None:
        self._inner.abort()


class PacedStorage:
    """``inner`` with its writes paced to ``rate`` bytes per second; everything else passes through."""

    def __init__(self, inner: Storage, rate: float) -> None:
        self._inner = inner
        self.pacer = Pacer(rate)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def open_write(self, path: str) -> WriteStream:
        return _PacedStream(self._inner.open_write(path), self.pacer)

    def __repr__(self) -> str:
        return f"PacedStorage({self._inner!r}, {self.pacer.rate / 1e6:.0f} MB/s)"


class PacedProxy:
    """A TCP proxy on loopback that forwards to ``upstream`` (host, port), pacing the bytes sent upstream (uploads)
    to ``rate`` bytes per second across all connections; replies pass unpaced. Put it in front of an S3-compatible
    server on loopback so that a benchmark measures a link's bandwidth, not the server's CPU."""

    def __init__(self, upstream: tuple[str, int], rate: float) -> None:
        import socket

        self.upstream = upstream
        self.pacer = Pacer(rate)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="paced-proxy", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        import socket

        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for src, dst, pace in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pipe, args=(src, dst, pace), daemon=True).start()

    def _pipe(self, src: Any, dst: Any, pace: bool) -> None:
        import socket

        try:
            while data := src.recv(256 << 10):
                if pace:
                    self.pacer.take(len(data))
                dst.sendall(data)
        except OSError:
            return
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()

    def __enter__(self) -> PacedProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
