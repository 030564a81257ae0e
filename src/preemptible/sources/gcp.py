"""GCP preemption and host-maintenance notices from the metadata server.

On GCP the process usually hears of a Spot preemption as SIGTERM (ACPI soft-off; about 30 s to the hard stop),
so the signal source does most of the work. The metadata server can say it earlier or when signals do not reach
the process: ``instance/preempted`` turns ``TRUE``, and ``instance/maintenance-event`` turns
``TERMINATE_ON_HOST_MAINTENANCE``. ``preempted`` is watched with the hanging GET (``wait_for_change`` with
``last_etag`` and ``timeout_sec``) so a change is seen the moment it happens without polling fast;
``maintenance-event`` is read between waits. Every request carries ``Metadata-Flavor: Google`` and every answer
must carry it back. The deadline is the notice time plus 30 s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping

from preemptible.notice import Clock, Notice, NoticeKind
from preemptible.sources.base import PollingSource
from preemptible.sources.http import MetadataError, Response

ENDPOINT_ENV = "PREEMPTIBLE_GCP_ENDPOINT"
DEFAULT_ENDPOINT = "http://metadata.google.internal"
ROOT = "/computeMetadata/v1/"
PREEMPTED = "instance/preempted"
MAINTENANCE = "instance/maintenance-event"
HEADERS = {"Metadata-Flavor": "Google"}


class GcpSource(PollingSource):
    """Watches ``instance/preempted`` (hanging GET) and ``instance/maintenance-event``.

    Args:
        endpoint: ``http://host:port``; default ``$PREEMPTIBLE_GCP_ENDPOINT`` or http://metadata.google.internal.
        wait_timeout_s: ``timeout_sec`` of each hanging GET (how often maintenance-event is read).
        lead: seconds from notice to the hard stop (30 for Spot).
        interval: pause between rounds (short: the hanging GET does the waiting).
        clock, wait: injected time (tests).
    """

    name = "gcp"
    default_interval = 0.5

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        wait_timeout_s: int = 10,
        lead: float = 30.0,
        interval: float | None = None,
        timeout: float = 2.0,
        clock: Clock = time.time,
        wait: Callable[[float], bool] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        super().__init__(
            endpoint or env.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT,
            variable=ENDPOINT_ENV,
            interval=interval,
            clock=clock,
            wait=wait,
        )
        self.wait_timeout_s = wait_timeout_s
        self.lead = lead
        self.timeout = timeout
        self._etag: str | None = None
        self._done = False

    def get(self, item: str, *, hang: bool = False) -> Response:
        path = ROOT + item
        timeout = self.timeout
        if hang and self._etag is not None:
            path += f"?wait_for_change=true&last_etag={self._etag}&timeout_sec={self.wait_timeout_s}"
            timeout = self.wait_timeout_s + 5.0
        r = self.http.request("GET", path, headers=HEADERS, timeout=timeout)
        if r.status != 200:
            raise MetadataError(f"http {r.status}", f"GET {path}: HTTP {r.status} {r.text[:100]!r}")
        if r.headers.get("metadata-flavor") != "Google":
            raise MetadataError(
                "not google",
                f"GET {path}: the answer lacks 'Metadata-Flavor: Google'; {self.endpoint} is not a GCP "
                "metadata server (set PREEMPTIBLE_SOURCES or PREEMPTIBLE_GCP_ENDPOINT)",
            )
        return r

    def poll(self) -> Iterable[Notice]:
        if self._done:
            return []
        r = self.get(PREEMPTED, hang=True)
        self._etag = r.headers.get("etag", self._etag)
        value = r.text.strip().upper()
        if value == "TRUE":
            return self._notice(NoticeKind.TERMINATE, "instance/preempted TRUE")
        if value != "FALSE":
            self.soft("malformed preempted", f"GET {ROOT}{PREEMPTED}: expected TRUE or FALSE, found {r.text[:60]!r}")
        event = self.get(MAINTENANCE).text.strip().upper()
        if event == "TERMINATE_ON_HOST_MAINTENANCE":
            return self._notice(NoticeKind.MAINTENANCE, "instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE")
        if event not in ("NONE", "MIGRATE_ON_HOST_MAINTENANCE", "") and not event.startswith(("MIGRATE", "NONE")):
            self.soft("malformed maintenance-event", f"GET {ROOT}{MAINTENANCE}: unexpected value {event[:60]!r}")
        return []

    def _notice(self, kind: NoticeKind, detail: str) -> list[Notice]:
        self._done = True
        return [Notice.at(source=self.name, kind=kind, now=self._clock(), grace=self.lead, detail=detail)]
