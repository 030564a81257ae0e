"""Notices delivered as POSIX signals: SIGTERM (Kubernetes, GCP, docker, scancel, torchrun), SIGINT (Ctrl-C)
and SIGUSR1 (SLURM ``--signal``).

The handler only records the notice. Previous handlers are kept and put back on ``close``. A repeated SIGTERM
or SIGUSR1 is recorded and otherwise ignored, so it cannot interrupt a save already under way; a second SIGINT
raises ``KeyboardInterrupt`` at once ("Ctrl-C twice means exit now": the save in progress is abandoned, never
committed, and the previous checkpoint stays the newest).

Inside a Slurm job, a SIGUSR1 that came before any source listened was held by ``_preemptible_early`` (installed
with the package, run at interpreter start); `SignalSource.start` takes it over as a notice dated when it came.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from types import FrameType
from typing import Any

from preemptible.errors import NoticeSourceError
from preemptible.notice import Clock, Notice, NoticeKind, NoticeSink

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
DEFAULT_GRACE_S = 30.0
MAX_GRACE_S = 86_400.0


def check_grace(value: object, what: str = "grace") -> float:
    """A grace period in seconds: finite, from 0 ("no time promised": the best attempt) to a day.

    Raises:
        NoticeSourceError: anything else, naming ``what`` (the argument or the environment variable).
    """
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise NoticeSourceError(f"{what}: expected seconds (e.g. 30), found {value!r}") from None
    if isinstance(value, bool) or not 0.0 <= seconds <= MAX_GRACE_S:  # also refuses nan and inf
        raise NoticeSourceError(
            f"{what}: expected a finite number of seconds from 0 to {MAX_GRACE_S:.0f}, found {value!r}"
        )
    return seconds


def parse_signal(value: str | int | signal.Signals) -> signal.Signals:
    """``"TERM"``, ``"SIGTERM"``, ``"sigterm"``, ``15`` and ``signal.SIGTERM`` all name SIGTERM."""
    if isinstance(value, signal.Signals):
        return value
    if isinstance(value, int):
        try:
            return signal.Signals(value)
        except ValueError:
            raise NoticeSourceError(f"expected a signal number, found {value}; use e.g. 15 or 'SIGTERM'") from None
    name = value.strip().upper()
    if name.isdigit():
        return parse_signal(int(name))
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return signal.Signals[name]
    except KeyError:
        raise NoticeSourceError(f"expected a signal name such as SIGTERM, SIGINT or SIGUSR1, found {value!r}") from None


class SignalSource:
    """Turns signals into notices whose deadline is arrival plus ``grace`` seconds.

    Args:
        signals: which signals mean "the end is coming". Default SIGTERM, SIGINT, SIGUSR1.
        grace: seconds from arrival to the hard kill (Kubernetes ``terminationGracePeriodSeconds``, SLURM
            ``--signal`` lead, torchrun's shutdown timeout). None: unknown.
        grace_by_signal: per-signal grace that overrides ``grace`` (SLURM: USR1 at the ``--signal`` lead, TERM
            at KillWait).
        clock: epoch seconds; injected by tests.
    """

    name = "signal"

    def __init__(
        self,
        signals: Iterable[str | int | signal.Signals] = DEFAULT_SIGNALS,
        *,
        grace: float | None = DEFAULT_GRACE_S,
        grace_by_signal: Mapping[signal.Signals, float] | None = None,
        clock: Clock = time.time,
    ) -> None:
        self.signals = tuple(dict.fromkeys(parse_signal(s) for s in signals))
        self.grace = check_grace(grace) if grace is not None else None
        self.grace_by_signal = {s: check_grace(g, f"grace for {s.name}") for s, g in (grace_by_signal or {}).items()}
        self._clock = clock
        self._sink: NoticeSink | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self.received: dict[signal.Signals, int] = {}

    def __repr__(self) -> str:
        names = ",".join(s.name for s in self.signals)
        return f"SignalSource({names}, grace={self.grace})"

    def start(self, sink: NoticeSink) -> None:
        if self._sink is not None:
            raise NoticeSourceError("this SignalSource is already started; close() it before starting again")
        if threading.current_thread() is not threading.main_thread():
            raise NoticeSourceError(
                "signal handlers can only be installed from the main thread, but start() was called from "
                f"thread {threading.current_thread().name!r}; create the Guard/Run on the main thread, or pass "
                "sources without 'signal' and relay notices with guard.trigger()"
            )
        self._sink = sink
        early = sys.modules.get("_preemptible_early")  # src/_preemptible_early.py, when Python started under Slurm
        for sig in self.signals:
            previous = signal.getsignal(sig)
            self._previous[sig] = previous
            signal.signal(sig, self._handle)
            if early is not None and previous == early.hold:
                for arrived in early.take(sig):  # came during start-up: a notice dated when it came
                    self._record(sig, arrived)

    def close(self) -> None:
        for sig, previous in self._previous.items():
            # Put the old handler back only if ours is still installed: someone may have replaced it since.
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        self._sink = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # IMPORTANT: runs as a signal handler: record and return. No I/O, no logging, no locks.
        self._record(signal.Signals(signum), self._clock())

    def _record(self, sig: signal.Signals, now: float) -> None:
        count = self.received.get(sig, 0) + 1
        self.received[sig] = count
        if sig == signal.SIGINT and count > 1:
            raise KeyboardInterrupt("second SIGINT: exiting now without finishing the save")
        sink = self._sink
        if sink is not None:
            grace = self.grace_by_signal.get(sig, self.grace)
            try:
                notice = Notice.at(source=self.name, kind=NoticeKind.TERMINATE, now=now, grace=grace, detail=sig.name)
            except (ValueError, OverflowError):  # IMPORTANT: a handler never raises: an unknown deadline instead
                notice = Notice(
                    source=self.name,
                    kind=NoticeKind.TERMINATE,
                    received_at=datetime.now(timezone.utc),
                    deadline=None,
                    detail=sig.name,
                )
            sink(notice)
