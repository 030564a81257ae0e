"""Progress you can see: a bar on a terminal (tqdm, only when stderr is a TTY), log lines at intervals elsewhere.

`Meter` is fed byte counts from any thread. On a terminal it draws a tqdm bar on stderr; otherwise (a log file, CI,
a pipe) it logs one line every `LOG_EVERY_S` seconds once the work has run longer than `QUIET_S`: bytes done,
throughput, and time left (against the deadline, when there is one). Work shorter than that logs nothing.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("preemptible")

QUIET_S = 3.0
"""Work that ends sooner than this logs no progress."""
LOG_EVERY_S = 5.0


def on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def describe(done: int, total: int, elapsed: float, *, deadline_left: float | None = None) -> str:
    """``"512.0 of 1200.0 MB (43%), 180 MB/s, 3.8 s left"`` (and the deadline's margin when there is one)."""
    rate = done / elapsed if elapsed > 0 else 0.0
    share = f" ({100 * done / total:.0f}%)" if total else ""
    text = f"{done / 1e6:.1f} of {total / 1e6:.1f} MB{share}, {rate / 1e6:.0f} MB/s"
    if rate > 0 and total >= done:
        left = (total - done) / rate
        text += f", {left:.1f} s left"
        if deadline_left is not None:
            text += f" ({deadline_left - left:+.1f} s to spare before the deadline)"
    return text


class Meter:
    """Counts bytes of one piece of work and shows how it goes.

    Args:
        what: e.g. ``"save of step 1200"``.
        total: bytes expected.
        bar: draw a tqdm bar (default: when stderr is a terminal).
        deadline: epoch seconds the work must end by, if any.
    """

    def __init__(
        self,
        what: str,
        total: int,
        *,
        bar: bool | None = None,
        deadline: float | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self.what = what
        self.total = total
        self.done = 0
        self.deadline = deadline
        self._clock = clock
        self._monotonic = monotonic
        self._log = logger
        self._started = monotonic()
        self._next_log = self._started + QUIET_S
        self._lock = threading.Lock()
        self.lines: list[str] = []
        self._bar: Any = None
        if bar if bar is not None else on_terminal():
            try:
                from tqdm import tqdm
            except ImportError:  # pragma: no cover - a declared dependency
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(
                    total=total, unit="B", unit_scale=True, unit_divisor=1000, desc=what, leave=False, file=sys.stderr
                )

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(n)
                return
            now = self._monotonic()
            if now < self._next_log:
                return
            self._next_log = now + LOG_EVERY_S
            left = self.deadline - self._clock() if self.deadline is not None else None
            line = f"{self.what}: {describe(self.done, self.total, now - self._started, deadline_left=left)}"
        self.lines.append(line)
        self._log.info("%s", line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
