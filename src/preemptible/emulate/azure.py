"""Emulator of Azure Scheduled Events (and the bit of instance metadata that names the VM).

Faithful to the reference: 400 ``{"error": "Bad request. Required metadata header not specified"}`` without
``Metadata: true``; 400 without ``api-version``; 405 for other verbs; the document
``{"DocumentIncarnation": n, "Events": [...]}`` whose incarnation grows whenever events change; ``NotBefore`` in
RFC 1123 (``Sat, 11 Apr 2026 22:26:58 GMT``, or ISO 8601 on request) and empty once an event has started;
approvals by POST ``{"StartRequests": [{"EventId": ...}]}`` (200, also for an id already approved; 400 if
malformed). Events can name other VMs of a scale set. The first call can be made slow, as the real service is
while it switches on.
"""

from __future__ import annotations

import email.utils
import json
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from preemptible.emulate.base import Emulator, Reply, Request, iso_seconds, text

EVENT_TYPES = ("Reboot", "Redeploy", "Freeze", "Preempt", "Terminate")


def rfc1123(ts: float) -> str:
    return email.utils.formatdate(int(ts), usegmt=True)


class AzureEmulator(Emulator):
    """Azure IMDS Scheduled Events on loopback.

    Args:
        vm_name: this VM's name (``/metadata/instance/compute/name``).
        lead: seconds from the event to its NotBefore (Preempt: 30).
        notice_after: schedule the Preempt event this many seconds after start (None: only on `notice`).
        first_call_delay: seconds the first Scheduled Events call takes (the service switching on).
        date_format: ``rfc1123`` (the service's) or ``iso`` (some tools).
    """

    provider = "azure"

    def __init__(
        self,
        *,
        vm_name: str = "preemptible-vm",
        lead: float = 30.0,
        notice_after: float | None = None,
        first_call_delay: float = 0.0,
        date_format: str = "rfc1123",
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(host=host, port=port, **({"clock": clock} if clock else {}))
        self.vm_name = vm_name
        self.lead = lead
        self.notice_after = notice_after
        self.first_call_delay = first_call_delay
        self.date_format = date_format
        self.incarnation = 1
        self.events: list[dict[str, Any]] = []
        self.approvals: list[tuple[str, float]] = []
        self._first_done = False
        self._auto_sent = False

    # scenario ----------------------------------------------------------------------------------------------
    def schedule(
        self,
        event_type: str = "Preempt",
        *,
        resources: Sequence[str] | None = None,
        lead: float | None = None,
        not_before: str | None = None,
    ) -> str:
        """Add an event (for this VM unless ``resources`` says otherwise); returns its EventId."""
        if event_type not in EVENT_TYPES:
            raise ValueError(f"expected an event type among {EVENT_TYPES}, found {event_type!r}")
        when = self.clock() + (self.lead if lead is None else lead)
        if not_before is None:
            not_before = rfc1123(when) if self.date_format == "rfc1123" else iso_seconds(when)
        event_id = str(uuid.uuid4()).upper()
        with self.changed:
            self.events.append(
                {
                    "EventId": event_id,
                    "EventType": event_type,
                    "ResourceType": "VirtualMachine",
                    "Resources": list(resources) if resources is not None else [self.vm_name],
                    "EventStatus": "Scheduled",
                    "NotBefore": not_before,
                    "Description": "",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            )
            self.incarnation += 1
            self.changed.notify_all()
        return event_id

    def notice(self) -> str:
        return self.schedule("Preempt")

    def approved(self) -> list[str]:
        return [eid for eid, _ in self.approvals]

    def state(self) -> dict[str, Any]:
        return {**super().state(), "incarnation": self.incarnation, "events": self.events, "approvals": self.approvals}

    # protocol ----------------------------------------------------------------------------------------------
    def _tick(self) -> None:
        if (
            self.notice_after is not None
            and not self._auto_sent
            and self.clock() - self.started_at >= self.notice_after
        ):
            self._auto_sent = True
            self.notice()

    @staticmethod
    def _json(doc: Any, status: int = 200) -> Reply:
        return text(json.dumps(doc), status, "application/json; charset=utf-8")

    def handle(self, req: Request) -> Reply:
        self._tick()
        refused = self._refuse(req)
        if refused is not None:
            return refused
        if req.path == "/metadata/scheduledevents":
            return self._scheduled_events(req)
        if req.method != "GET":
            return self._json({"error": "Method not allowed"}, 405)
        if req.path == "/metadata/instance/compute/name":
            return text(self.vm_name)
        if req.path == "/metadata/instance":
            return self._json(
                {
                    "compute": {
                        "name": self.vm_name,
                        "vmId": "00000000-0000-0000-0000-000000000001",
                        "priority": "Spot",
                        "location": "eastus",
                    }
                }
            )
        return self._json({"error": "Not found"}, 404)

    def _refuse(self, req: Request) -> Reply | None:
        """IMDS's 400 for a request without its header (or through a proxy) or without an api-version, else None."""
        if (req.header("Metadata") or "").lower() != "true" or req.header("X-Forwarded-For"):
            return self._json({"error": "Bad request. Required metadata header not specified"}, 400)
        if "api-version" not in req.query:
            return self._json(
                {
                    "error": "Bad request. api-version was not specified in the request. For more "
                    "information refer to aka.ms/azureimds",
                    "newest-versions": ["2021-02-01"],
                },
                400,
            )
        return None

    def _scheduled_events(self, req: Request) -> Reply:
        """``/metadata/scheduledevents``: GET the events, POST approvals."""
        if not self._first_done:
            self._first_done = True
            if self.first_call_delay:
                time.sleep(self.first_call_delay)
        if req.method == "GET":
            with self._lock:
                return self._json({"DocumentIncarnation": self.incarnation, "Events": self.events})
        if req.method == "POST":
            return self._approve(req)
        return self._json({"error": "Method not allowed"}, 405)

    def _approve(self, req: Request) -> Reply:
        try:
            doc = json.loads(req.body)
            ids = [str(item["EventId"]) for item in doc["StartRequests"]]
        except (ValueError, KeyError, TypeError):
            return self._json({"error": "Bad request. StartRequests is malformed"}, 400)
        with self.changed:
            for event in self.events:
                if event["EventId"] in ids and event["EventStatus"] != "Started":
                    event["EventStatus"] = "Started"
                    event["NotBefore"] = ""
                    self.approvals.append((event["EventId"], self.clock()))
            self.incarnation += 1
            self.changed.notify_all()
        return text("", 200)
