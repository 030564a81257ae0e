"""What every polling source shares: the poller thread, error reporting once per kind, and shutdown."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

from preemptible.notice import Clock, Notice, NoticeSink, Poller
from preemptible.sources.http import HttpClient, MetadataError, parse_endpoint

log = logging.getLogger("preemptible")

STALE_AFTER_S = 600.0
"""A notice whose deadline is further in the past than this is a leftover (a termination that failed), not news."""


def parse_time(text: str) -> datetime:
    """ISO 8601 (``2017-09-18T08:22:00Z``, offsets, fractions) -> aware UTC datetime. Raises ValueError."""
    value = text.strip()
    if not value:
        raise ValueError("empty time")
    dt = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc)


class PollingSource:
    """A `NoticeSource` that asks an HTTP service in a background thread.

    Subclasses implement `poll`: one round of requests that returns the notices it found for the first time
    (and raises `MetadataError` on trouble). Polling ends after the first notice that is not advisory.
    """

    name = "polling"
    default_interval = 1.0

    def __init__(
        self,
        endpoint: str,
        *,
        variable: str,
        interval: float | None = None,
        max_backoff: float = 5.0,
        clock: Clock = time.time,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        host, port = parse_endpoint(endpoint, variable=variable)
        self.endpoint = f"http://{host}:{port}"
        self.http = HttpClient(host, port)
        self.interval = self.default_interval if interval is None else interval
        self.max_backoff = max_backoff
        self._clock = clock
        self._wait = wait
        self._sink: NoticeSink | None = None
        self._poller: Poller | None = None
        self._logged: set[str] = set()
        self._trouble = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint}, interval={self.interval:g})"

    def poll(self) -> Iterable[Notice]:
        raise NotImplementedError

    def start(self, sink: NoticeSink) -> None:
        self._sink = sink
        self.http.reopen()
        self._poller = Poller(
            f"preemptible-poll-{self.name}",
            self._tick,
            interval=self.interval,
            max_backoff=self.max_backoff,
            wait=self._wait,
            on_error=self._report,
        )
        self._poller.start()

    def close(self) -> None:
        if self._poller is not None:
            self.http.interrupt()
            self._poller.stop()
            self._poller = None
        self._sink = None

    def _tick(self) -> bool:
        finished = False
        for notice in self.poll():
            if self._sink is not None:
                self._sink(notice)
            finished = finished or not notice.kind.advisory
        if self._trouble:
            self._trouble = False
            log.info("%s metadata: answering again", self.name)
        return finished

    def _report(self, name: str, error: BaseException) -> None:
        if getattr(error, "backoff", True):
            self._trouble = True
        kind = error.kind if isinstance(error, MetadataError) else type(error).__name__
        if kind in self._logged:
            return
        self._logged.add(kind)
        log.warning(
            "%s metadata (%s): %s; still polling%s (further '%s' errors are not logged)",
            self.name,
            self.endpoint,
            error,
            " with backoff" if getattr(error, "backoff", True) else "",
            kind,
        )

    def soft(self, kind: str, message: str) -> None:
        """Report bad content without stopping this round (logged once per kind, no backoff)."""
        self._report(self.name, MetadataError(kind, message, backoff=False))

    def fresh(self, deadline: datetime | None, what: str) -> bool:
        """False (and logged once) for a deadline so far in the past that it is a leftover, not a notice."""
        if deadline is not None and self._clock() - deadline.timestamp() > STALE_AFTER_S:
            self.soft(
                f"stale {what}",
                f"{what} deadline {deadline.isoformat()} is over {STALE_AFTER_S:.0f} s in the "
                "past: a leftover of a termination that did not happen; ignored",
            )
            return False
        return True
