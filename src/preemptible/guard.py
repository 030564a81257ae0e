"""Guard: runs the notice sources and answers "stop now?" at step boundaries.

The guard never knows which cloud spoke: sources record `Notice` objects on a `NoticeBoard`; the guard reads
the board. Whether *this* boundary is the stop is the `Agreement`'s call (one process: the first boundary after
a notice; several ranks: the agreed step, see ``dist.py``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from preemptible import dist, relay
from preemptible.errors import NoticeSourceError
from preemptible.notice import Clock, Notice, NoticeBoard, NoticeKind, NoticeSource
from preemptible.sources import detect
from preemptible.sources.relayed import RelayedSource
from preemptible.sources.signals import DEFAULT_GRACE_S

log = logging.getLogger("preemptible")


class Guard:
    """Watches for the end of the machine and says when to stop.

    Args:
        sources: None to auto-detect (signals always, a cloud's metadata service when the machine is on that
            cloud; ``$PREEMPTIBLE_SOURCES`` overrides), a comma-separated string such as ``"signal"``, or a list
            of names and `NoticeSource` objects. An empty list watches nothing (use `trigger`).
        grace: seconds from a signal to the hard kill; the deadline of signal notices. None (default): the
            platform's (30 s; SLURM: the ``--signal`` lead for USR1; GKE: 15 s; ``$PREEMPTIBLE_GRACE`` overrides).
        clock: epoch seconds; injected by tests.
        agreement: the cross-rank stop-step protocol; default: under torchrun, agreement through the job's store
            (`preemptible.dist.StoreAgreement`, made by `start`), else one process's own.
        platform: where this runs (`preemptible.sources.detect.Platform`); default: detected.

    Use as a context manager, or call `start` and `close`. Handlers and threads exist only in between.

    Raises:
        NoticeSourceError: a source named wrongly (unknown name, a bad signal) or started off the main thread.

    Examples:
        >>> from preemptible import Guard
        >>> with Guard(sources=[]) as guard:
        ...     before = guard.should_stop(1)
        ...     notice = guard.trigger(source="manual", grace=30.0)  # what a SIGTERM or a cloud's notice does
        ...     after = guard.should_stop(2)
        >>> before, after, notice.source
        (False, True, 'manual')
    """

    def __init__(
        self,
        sources: str | Iterable[str | NoticeSource] | None = None,
        *,
        grace: float | None = None,
        clock: Clock = time.time,
        agreement: dist.Agreement | None = None,
        platform: detect.Platform | None = None,
    ) -> None:
        self._clock = clock
        self.platform = platform or detect.detect_platform()
        """Where this process runs (from local evidence), with its signal grace and exit-code defaults."""
        self.sources = detect.resolve(sources, grace=grace, clock=clock, platform=self.platform)
        self.board = NoticeBoard()
        self._explicit_agreement = agreement is not None
        self._agreement: dist.Agreement = agreement if agreement is not None else dist.LocalAgreement()
        self.coordinator = dist.coordinator() if agreement is None else None
        """The job's store coordinator under torchrun (None in one process): notices travel through it."""
        self._started: list[NoticeSource] = []
        self.beat: Callable[[], None] | None = None
        """Called at every step boundary (`should_stop`): the run's peer watch (`preemptible.dist.PeerWatch`)."""
        relay_path = os.environ.get(relay.NOTICE_FILE_ENV, "").strip() or None
        if relay_path is not None:  # under `preemptible run`: a signal stands for the notice it relays
            self.sources = [RelayedSource(s, relay_path) if s.name == "signal" else s for s in self.sources]

    def __repr__(self) -> str:
        return f"Guard(sources={[s.name for s in self.sources]}, notice={self.notice})"

    # lifecycle -------------------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return bool(self._started) or (not self.sources and self._entered)

    _entered = False

    def start(self) -> Guard:
        """Install handlers and start pollers. Idempotent."""
        if self._started or self._entered:
            return self
        self._entered = True
        try:
            if self.coordinator is not None and not self._explicit_agreement:
                self._agreement = dist.StoreAgreement(
                    self.coordinator,
                    record=self.board.record,
                    local_notice=lambda: self.board.first,
                    local_event=self.board.event,
                )
            for source in self.sources:
                source.start(self.board.record)
                self._started.append(source)
        except BaseException:
            self.close()
            raise
        log.debug("guard started with sources %s", [s.name for s in self.sources])
        return self

    def close(self) -> None:
        """Remove handlers, stop pollers (in reverse order of starting). Idempotent."""
        while self._started:
            source = self._started.pop()
            try:
                source.close()
            except Exception:  # a failing close must not hide the others
                log.exception("closing notice source %s failed", source.name)
        self._agreement.close()
        self._entered = False

    def __enter__(self) -> Guard:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # queries ---------------------------------------------------------------------------------------------
    def wait_for_notice(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for the first notice; True once there is one."""
        return self.board.event.wait(timeout)

    @property
    def notice(self) -> Notice | None:
        """The first notice that calls for a stop, or None.

        Under ``preemptible run`` (``$PREEMPTIBLE_NOTICE_FILE`` set), a signal is the wrapper relaying a cloud's
        notice: the notice it wrote to that file, with its source, kind and deadline, is the one returned.
        """
        first = self.board.first
        if first is None:
            return None
        for source in self.sources:
            resolve = getattr(source, "resolve", None)  # a source that knows more than its signal (RelayedSource)
            if resolve is not None:
                first = resolve(first)
        return first

    @property
    def notices(self) -> list[Notice]:
        """Every notice recorded so far, advisory ones and repeats included, in arrival order."""
        return list(self.board.notices)

    @property
    def advisory(self) -> Notice | None:
        """The first advisory notice (e.g. an AWS rebalance recommendation), or None."""
        for n in self.board.notices:
            if n.kind.advisory:
                return n
        return None

    def should_stop(self, step: int) -> bool:
        """At a step boundary: must training stop now? ``step`` is the number of completed steps.

        Cheap without a notice (a flag read). Every rank that gets True gets it at the same ``step``.
        """
        if self.beat is not None:
            self.beat()
        return self._agreement.should_stop(step, self.board.event.is_set())

    @property
    def stop_step(self) -> int | None:
        """The agreed stop step once known."""
        return self._agreement.stop_step

    @property
    def announcement(self) -> dict[str, Any] | None:
        """The notice that stopped the job as its announcing rank published it (with that rank's ``rank`` and
        ``node``), once the agreement knows it; None in one process or before any notice."""
        return getattr(self._agreement, "announcement", None)

    def remaining(self) -> float | None:
        """Seconds until the notice's deadline (negative once past); None without a notice or a deadline."""
        notice = self.notice
        return notice.remaining(self._clock()) if notice is not None else None

    def acknowledge(self, notice: Notice | None = None) -> None:
        """Tell the sources that the emergency checkpoint of ``notice`` has committed.

        Sources that can act on it do (Azure approves the scheduled event, so the VM is released early).
        Failures are logged, never raised.
        """
        notice = notice or self.notice
        if notice is None:
            return
        for source in self.sources:
            ack = getattr(source, "acknowledge", None)
            if callable(ack):
                try:
                    ack(notice)
                except Exception:
                    log.exception("acknowledging the notice to source %s failed", source.name)

    def trigger(
        self,
        notice: Notice | None = None,
        *,
        source: str = "manual",
        kind: NoticeKind = NoticeKind.TERMINATE,
        grace: float | None = DEFAULT_GRACE_S,
        detail: str = "",
    ) -> Notice:
        """Record a notice by hand (from your own watcher, a callback or a test). Safe from any thread."""
        if notice is None:
            if not source:
                raise NoticeSourceError("expected a non-empty source name for a manual notice")
            notice = Notice.at(source=source, kind=kind, now=self._clock(), grace=grace, detail=detail)
        self.board.record(notice)
        return notice
