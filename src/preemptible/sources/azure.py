"""Azure Scheduled Events: ``Preempt`` (Spot eviction, at least 30 s ahead) and ``Terminate`` for this VM.

``GET /metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true`` returns every pending event of
the VM's scale set or availability set; only those whose ``Resources`` name this VM count (its name comes from
``/metadata/instance/compute/name``). ``NotBefore`` (RFC 1123, or ISO 8601 from some tools; empty once an event
has started) is the deadline. After the emergency checkpoint commits the event is approved with
``StartRequests``, so the VM is released at once instead of idling until ``NotBefore``.

The service switches on at the first request, which can take up to two minutes: the first call gets a long
timeout, in the background, and training goes on meanwhile.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from preemptible.notice import Clock, Notice, NoticeKind, utc_from_timestamp
from preemptible.sources.base import PollingSource, parse_time
from preemptible.sources.http import MetadataError

log = logging.getLogger("preemptible")

ENDPOINT_ENV = "PREEMPTIBLE_AZURE_ENDPOINT"
VM_NAME_ENV = "PREEMPTIBLE_AZURE_VM_NAME"
DEFAULT_ENDPOINT = "http://169.254.169.254"
EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
HEADERS = {"Metadata": "true"}
KINDS = {"Preempt": NoticeKind.PREEMPT, "Terminate": NoticeKind.TERMINATE}


def parse_not_before(text: str) -> datetime:
    """RFC 1123 (``Sat, 11 Apr 2026 22:26:58 GMT``) or ISO 8601. Raises ValueError."""
    value = text.strip()
    try:
        dt = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return parse_time(value)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc)


class AzureSource(PollingSource):
    """Polls Scheduled Events for Preempt/Terminate events naming this VM, and approves them after the save.

    Args:
        endpoint: ``http://host:port``; default ``$PREEMPTIBLE_AZURE_ENDPOINT`` or http://169.254.169.254.
        interval: seconds between polls (default 1; the service allows 5 requests/s).
        approve: approve the event once the emergency checkpoint has committed (default True).
        event_types: which EventTypes mean "stop" (default Preempt and Terminate).
        vm_name: this VM's name; default ``$PREEMPTIBLE_AZURE_VM_NAME`` or asked from instance metadata.
        first_timeout: seconds for the first call, which may switch the service on (up to 2 minutes).
        clock, wait: injected time (tests).
    """

    name = "azure"

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        interval: float | None = None,
        approve: bool = True,
        event_types: Sequence[str] = ("Preempt", "Terminate"),
        vm_name: str | None = None,
        first_timeout: float = 120.0,
        timeout: float = 3.0,
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
        unknown = [t for t in event_types if t not in ("Preempt", "Terminate", "Reboot", "Redeploy", "Freeze")]
        if unknown:
            raise ValueError(
                f"expected event types among Preempt, Terminate, Reboot, Redeploy, Freeze; found {unknown}"
            )
        self.approve = approve
        self.event_types = tuple(event_types)
        self.vm_name = vm_name or env.get(VM_NAME_ENV) or None
        self.first_timeout = first_timeout
        self.timeout = timeout
        self.incarnation: int | None = None
        self._answered = False
        self._seen: dict[str, Notice] = {}
        self.approved: list[str] = []

    def _get(self, path: str, timeout: float) -> bytes:
        r = self.http.request("GET", path, headers=HEADERS, timeout=timeout)
        if r.status != 200:
            raise MetadataError(f"http {r.status}", f"GET {path}: HTTP {r.status} {r.text[:120]!r}")
        return r.body

    def _learn_name(self) -> bool:
        if self.vm_name:
            return True
        name = self._get(NAME_PATH, self.timeout).decode("utf-8", errors="replace").strip()
        if not name:
            raise MetadataError("no vm name", f"GET {NAME_PATH}: empty VM name")
        self.vm_name = name
        return True

    def poll(self) -> Iterable[Notice]:
        timeout = self.timeout if self._answered else self.first_timeout
        body = self._get(EVENTS_PATH, timeout)
        self._answered = True
        try:
            doc = json.loads(body)
            incarnation = int(doc["DocumentIncarnation"])
            events = doc["Events"]
            if not isinstance(events, list):
                raise TypeError("Events is not a list")
        except (ValueError, KeyError, TypeError) as e:
            self.soft(
                "malformed events",
                f"GET {EVENTS_PATH}: expected {{DocumentIncarnation, Events: [...]}}, found {body[:120]!r} ({e})",
            )
            return []
        if incarnation == self.incarnation:
            return []  # nothing changed since the last look
        relevant = [ev for ev in events if isinstance(ev, dict) and ev.get("EventType") in self.event_types]
        if relevant and not self._learn_name():
            return []
        found = []
        for ev in relevant:
            notice = self._notice(ev, incarnation)
            if notice is not None:
                found.append(notice)
        self.incarnation = incarnation
        return found

    def _notice(self, ev: dict[str, Any], incarnation: int) -> Notice | None:
        event_id = ev.get("EventId")
        resources = ev.get("Resources")
        if not isinstance(event_id, str) or not isinstance(resources, list):
            self.soft("malformed event", f"scheduled event without EventId/Resources: {str(ev)[:120]}")
            return None
        mine = (self.vm_name or "").casefold()
        if mine not in {str(r).casefold() for r in resources} or event_id in self._seen:
            return None
        now = self._clock()
        not_before = str(ev.get("NotBefore") or "")
        if not_before:
            try:
                deadline = parse_not_before(not_before)
            except ValueError:
                self.soft(
                    "malformed NotBefore",
                    f"event {event_id}: NotBefore {not_before!r} is neither RFC 1123 nor "
                    "ISO 8601; acting on it with a 30 s deadline",
                )
                deadline = utc_from_timestamp(now + 30)
        else:
            deadline = utc_from_timestamp(now)  # started: it is happening now
        ev_type = str(ev["EventType"])
        notice = Notice(
            source=self.name,
            kind=KINDS.get(ev_type, NoticeKind.TERMINATE),
            received_at=utc_from_timestamp(now),
            deadline=deadline,
            detail=f"{ev_type} {event_id} (incarnation {incarnation}, NotBefore {not_before or 'started'})",
        )
        self._seen[event_id] = notice
        return notice

    def acknowledge(self, notice: Notice) -> None:
        """Approve the events behind ``notice`` (after the emergency checkpoint committed). Never raises."""
        if not self.approve or notice.source != self.name:
            return
        ids = [eid for eid, n in self._seen.items() if n is notice and eid not in self.approved]
        if not ids:
            return
        body = json.dumps({"StartRequests": [{"EventId": eid} for eid in ids]}).encode()
        try:
            r = self.http.request(
                "POST",
                EVENTS_PATH,
                headers={**HEADERS, "Content-Type": "application/json"},
                body=body,
                timeout=self.timeout,
            )
        except MetadataError as e:
            log.warning("azure: approving %s failed (%s); the VM will stop at NotBefore instead", ids, e)
            return
        if r.status == 200:
            self.approved += ids
            log.info("azure: approved scheduled event %s; the VM can be released now", ", ".join(ids))
        else:
            log.warning(
                "azure: approving %s got HTTP %d %r; the VM will stop at NotBefore", ids, r.status, r.text[:100]
            )
