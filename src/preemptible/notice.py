"""What a termination notice is, and how sources hand one over.

A source (a signal handler, a metadata poller) only *records* a notice: it builds a frozen `Notice` and passes
it to a `NoticeSink`, which stores it and sets an event. Everything that takes time (journal, save, exit) happens
later, on the main thread, at a step boundary.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol, runtime_checkable

Clock = Callable[[], float]
"""Seconds since the epoch (``time.time`` in production, a fake in tests)."""


class NoticeKind(str, enum.Enum):
    """What the platform is about to do.

    ``TERMINATE`` (the machine goes: AWS terminate, a SIGTERM), ``STOP`` and ``HIBERNATE`` (AWS), ``PREEMPT`` (Azure
    Spot, GCP), ``MAINTENANCE`` (a host event that may end the VM), ``REBALANCE`` (AWS's advisory rebalance
    recommendation: not an end by itself; see `Run`'s ``on_advisory``).

    Examples:
        >>> from preemptible import NoticeKind
        >>> NoticeKind("preempt") is NoticeKind.PREEMPT
        True
    """

    TERMINATE = "terminate"  # the machine or process goes away (signals, AWS terminate, GCP preempted)
    STOP = "stop"  # AWS spot stop: the instance stops, its disks survive
    HIBERNATE = "hibernate"  # AWS spot hibernate: no 2-minute lead
    PREEMPT = "preempt"  # Azure Scheduled Events Preempt
    MAINTENANCE = "maintenance"  # GCP TERMINATE_ON_HOST_MAINTENANCE
    REBALANCE = "rebalance"  # AWS rebalance recommendation: advisory, save early but keep training

    @property
    def advisory(self) -> bool:
        """True for hints that call for an early save rather than a stop."""
        return self is NoticeKind.REBALANCE


def utc_from_timestamp(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


@dataclass(frozen=True, kw_only=True)
class Notice:
    """A termination notice as one source saw it.

    Attributes:
        source: who spoke: ``signal``, ``aws``, ``gcp``, ``azure`` (or a custom source's name).
        kind: what the platform is about to do.
        received_at: when this process saw it (UTC).
        deadline: when the machine or process goes away (UTC), or None when unknown.
        detail: provider specifics, e.g. ``SIGTERM`` or the AWS action document.

    Examples:
        >>> from datetime import datetime, timedelta, timezone
        >>> from preemptible import Notice, NoticeKind
        >>> now = datetime.now(timezone.utc)
        >>> n = Notice(source="aws", kind=NoticeKind.TERMINATE, received_at=now, deadline=now + timedelta(seconds=120))
        >>> round((n.deadline - n.received_at).total_seconds())
        120
    """

    source: str
    kind: NoticeKind
    received_at: datetime
    deadline: datetime | None
    detail: str = ""

    def remaining(self, now: float) -> float | None:
        """Seconds from ``now`` (epoch seconds) to the deadline; negative once past; None without one."""
        if self.deadline is None:
            return None
        return self.deadline.timestamp() - now

    def to_json(self) -> dict[str, str | None]:
        return {
            "source": self.source,
            "kind": self.kind.value,
            "received_at": self.received_at.isoformat(),
            "deadline": self.deadline.isoformat() if self.deadline else None,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, doc: Any) -> Notice:
        """The inverse of `to_json` (the relayed notice file, a notice announced through the store).

        Raises:
            ValueError: ``doc`` is not a notice document (says what was expected and what was found).
        """
        try:
            deadline = doc.get("deadline")
            return cls(
                source=str(doc["source"]),
                kind=NoticeKind(doc["kind"]),
                received_at=_aware(datetime.fromisoformat(str(doc["received_at"]))),
                deadline=_aware(datetime.fromisoformat(str(deadline))) if deadline else None,
                detail=str(doc.get("detail", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(
                f"expected a notice document with source, kind, received_at and deadline, found {str(doc)[:200]!r} "
                f"({type(e).__name__}: {e})"
            ) from e

    @classmethod
    def at(
        cls,
        *,
        source: str,
        kind: NoticeKind,
        now: float,
        grace: float | None,
        detail: str = "",
    ) -> Notice:
        """A notice received at ``now`` whose deadline is ``grace`` seconds later (None: unknown)."""
        received = utc_from_timestamp(now)
        deadline = received + timedelta(seconds=grace) if grace is not None else None
        return cls(source=source, kind=kind, received_at=received, deadline=deadline, detail=detail)


def _aware(t: datetime) -> datetime:
    """A naive time as UTC (documents written by this library always carry the offset)."""
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


NoticeSink = Callable[[Notice], None]
"""What a source calls with each notice. Safe to call from a signal handler or any thread."""


@runtime_checkable
class NoticeSource(Protocol):
    """Something that can tell that the end is coming: a signal, a metadata endpoint, a file.

    ``start`` begins watching and hands every notice to ``sink``; ``close`` stops watching and undoes whatever
    ``start`` did (restores signal handlers, joins threads). Both are called from the main thread.

    Examples:
        A source of your own (a file a job manager writes, a message queue) passed to `Run` or `Guard`:

        >>> from datetime import datetime, timezone
        >>> from preemptible import Guard, Notice, NoticeKind, NoticeSource
        >>> class Drain(NoticeSource):
        ...     name = "drain"
        ...     def start(self, sink):
        ...         self.sink = sink
        ...     def close(self):
        ...         pass
        >>> drain = Drain()
        >>> now = datetime.now(timezone.utc)
        >>> with Guard(sources=[drain]) as guard:
        ...     drain.sink(Notice(source="drain", kind=NoticeKind.TERMINATE, received_at=now, deadline=None))
        ...     stop = guard.should_stop(1)
        >>> stop
        True
    """

    name: str

    def start(self, sink: NoticeSink) -> None: ...

    def close(self) -> None: ...


class Flag:
    """A set-once event that a signal handler may set even while it interrupts a thread inside ``wait``/``set``.

    ``threading.Event`` guards its state with a plain Lock: a handler that calls ``set()`` while the main thread
    it interrupted holds that lock deadlocks. Here the lock is reentrant, so the handler always gets through.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._cond:
            self._flag = True
            self._cond.notify_all()

    def wait(self, timeout: float | None = None, *, unless: Callable[[], bool] | None = None) -> bool:
        """Wait until the flag is set (returns True) or ``timeout`` passes. ``unless``: checked under the lock
        before waiting; when it holds, return at once. A thread that makes it hold and then calls `wake` cannot
        slip between the check and the wait: one blocking wait with no polling, ended by `wake`."""
        with self._cond:
            if not self._flag and not (unless is not None and unless()):
                self._cond.wait(timeout)
            return self._flag

    def wake(self) -> None:
        """Wake every waiter without setting the flag (they return False and look at their ``unless``)."""
        with self._cond:
            self._cond.notify_all()


@dataclass
class NoticeBoard:
    """Where sources record notices; the only state a signal handler touches.

    IMPORTANT: ``record`` runs inside signal handlers and poller threads. It does no I/O and takes only the
    reentrant lock of a `Flag`; list.append is atomic under the GIL.
    """

    event: Flag = field(default_factory=Flag)
    advisory: Flag = field(default_factory=Flag)
    notices: list[Notice] = field(default_factory=list)

    def record(self, notice: Notice) -> None:
        self.notices.append(notice)
        if notice.kind.advisory:
            self.advisory.set()
        else:
            self.event.set()

    @property
    def first(self) -> Notice | None:
        """The first notice that is not advisory."""
        for n in list(self.notices):
            if not n.kind.advisory:
                return n
        return None


class Poller:
    """Calls ``tick`` in one named background thread until it returns True or `stop` is called.

    Pacing: ``interval`` seconds between ticks; after a failure, exponential backoff up to ``max_backoff``
    (a failure whose ``backoff`` attribute is False keeps the pace). Each kind of failure is logged once, and
    recovery once. ``wait(seconds) -> stopped`` is injected by tests; by default it waits on the stop event,
    so `stop` interrupts a pause at once.
    """

    def __init__(
        self,
        name: str,
        tick: Callable[[], bool],
        *,
        interval: float,
        max_backoff: float = 5.0,
        wait: Callable[[float], bool] | None = None,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.name = name
        self._tick = tick
        self.interval = interval
        self.max_backoff = max(max_backoff, interval)
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self._on_error = on_error
        self._thread: threading.Thread | None = None
        self.failures = 0
        self.delays: list[float] = []
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run_once(self) -> tuple[bool, float]:
        """One tick; returns (finished, delay before the next)."""
        try:
            finished = self._tick()
        except Exception as e:  # every failure is the service's, never the training's
            if self._stop.is_set():
                return True, 0.0
            self.error = e
            if self._on_error is not None:
                self._on_error(self.name, e)
            if getattr(e, "backoff", True):
                self.failures += 1
                return False, min(self.max_backoff, self.interval * 2**self.failures)
            return False, self.interval
        self.failures = 0
        return finished, self.interval

    def _run(self) -> None:
        # Daemonic: losing this thread at interpreter exit loses nothing (it only reads metadata).
        while not self._stop.is_set():
            finished, delay = self.run_once()
            if finished:
                return
            self.delays.append(delay)
            if len(self.delays) > 64:
                del self.delays[:32]
            if self._wait(delay):
                return
