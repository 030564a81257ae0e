"""AzureSource against the loopback Scheduled Events emulator: this VM only, dates, approvals, faults."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from preemptible import NoticeKind
from preemptible.emulate import AzureEmulator
from preemptible.emulate.base import iso_seconds
from preemptible.sources.azure import AzureSource, parse_not_before
from preemptible.sources.http import MetadataError


@pytest.fixture
def events() -> Iterator[AzureEmulator]:
    with AzureEmulator(vm_name="vm-7") as emu:
        yield emu


def call(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, str]:
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=body)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_emulator_protocol_details(events: AzureEmulator) -> None:
    base = events.url + "/metadata/scheduledevents"
    status, body = call(base + "?api-version=2020-07-01")
    assert status == 400 and "Required metadata header not specified" in body
    status, body = call(base, headers={"Metadata": "true"})
    assert status == 400 and "api-version" in body
    status, body = call(base + "?api-version=2020-07-01", headers={"Metadata": "true"})
    assert status == 200 and json.loads(body) == {"DocumentIncarnation": 1, "Events": []}
    status, _ = call(base + "?api-version=2020-07-01", method="DELETE", headers={"Metadata": "true"})
    assert status == 405
    status, _ = call(base + "?api-version=2020-07-01", method="POST", headers={"Metadata": "true"}, body=b"{nope")
    assert status == 400
    event_id = events.notice()
    doc = json.loads(call(base + "?api-version=2020-07-01", headers={"Metadata": "true"})[1])
    assert doc["DocumentIncarnation"] == 2
    (ev,) = doc["Events"]
    assert ev["EventId"] == event_id and ev["EventType"] == "Preempt" and ev["Resources"] == ["vm-7"]
    assert ev["NotBefore"].endswith(" GMT")  # RFC 1123


def test_preempt_for_this_vm_with_not_before_deadline(events: AzureEmulator) -> None:
    src = AzureSource(events.url)
    assert list(src.poll()) == []
    events.notice()
    (notice,) = src.poll()
    assert notice.kind is NoticeKind.PREEMPT and notice.source == "azure"
    assert notice.remaining(time.time()) == pytest.approx(30, abs=1.5)  # type: ignore[arg-type]
    assert src.vm_name == "vm-7"
    assert list(src.poll()) == []  # reported once


def test_events_for_other_vms_and_other_types_are_ignored(events: AzureEmulator) -> None:
    src = AzureSource(events.url)
    events.schedule("Preempt", resources=["vm-8", "vm-9"])
    events.schedule("Freeze")
    assert list(src.poll()) == []
    events.schedule("Terminate", resources=["vm-8", "VM-7"])  # names compare case-insensitively
    (notice,) = src.poll()
    assert notice.kind is NoticeKind.TERMINATE


@pytest.mark.parametrize(
    "not_before", ["Sat, 11 Apr 2026 22:26:58 GMT", "2026-04-11T22:26:58Z", "2026-04-11T22:26:58+00:00"]
)
def test_not_before_in_rfc1123_or_iso8601(not_before: str) -> None:
    assert parse_not_before(not_before).isoformat() == "2026-04-11T22:26:58+00:00"


def test_iso_dates_and_started_events(events: AzureEmulator) -> None:
    src = AzureSource(events.url)
    when = iso_seconds(time.time() + 20)
    events.schedule("Preempt", not_before=when)
    (notice,) = src.poll()
    assert notice.deadline is not None and notice.deadline.strftime("%Y-%m-%dT%H:%M:%SZ") == when
    src2 = AzureSource(events.url)
    events.schedule("Preempt", not_before="")  # already started: it happens now
    notices = list(src2.poll())
    assert min(n.remaining(time.time()) for n in notices) < 1  # type: ignore[type-var]


def test_malformed_not_before_still_stops(events: AzureEmulator) -> None:
    src = AzureSource(events.url)
    events.schedule("Preempt", not_before="next tuesday")
    (notice,) = src.poll()
    assert notice.remaining(time.time()) == pytest.approx(30, abs=1.5)  # type: ignore[arg-type]


def test_approval_after_commit(events: AzureEmulator) -> None:
    src = AzureSource(events.url)
    event_id = events.notice()
    (notice,) = src.poll()
    assert events.approved() == []
    src.acknowledge(notice)
    assert events.approved() == [event_id]
    assert events.events[0]["EventStatus"] == "Started" and events.events[0]["NotBefore"] == ""
    body = [r for r in events.requests if r.method == "POST"][0].body
    assert json.loads(body) == {"StartRequests": [{"EventId": event_id}]}
    AzureSource(events.url, approve=False).acknowledge(notice)
    assert len([r for r in events.requests if r.method == "POST"]) == 1


def test_slow_first_call_is_survived() -> None:
    with AzureEmulator(vm_name="vm-7", first_call_delay=1.0) as emu:
        src = AzureSource(emu.url, timeout=0.3, first_timeout=5.0)
        assert list(src.poll()) == []  # the first call waits out the switch-on
        emu.notice()
        (notice,) = src.poll()
        assert notice.kind is NoticeKind.PREEMPT


@pytest.mark.parametrize(
    ("fault", "kwargs"),
    [("status", {"status": 410}), ("status", {"status": 429}), ("status", {"status": 500}), ("drop", {})],
)
def test_faults_then_notice(events: AzureEmulator, fault: str, kwargs: dict) -> None:  # type: ignore[type-arg]
    src = AzureSource(events.url)
    src.poll()
    events.notice()
    events.fault(fault, path="scheduledevents", **kwargs)
    with pytest.raises(MetadataError):
        src.poll()
    (notice,) = src.poll()
    assert notice.kind is NoticeKind.PREEMPT


def test_malformed_document_then_valid(events: AzureEmulator) -> None:
    src = AzureSource(events.url)
    events.notice()
    events.fault("malformed", path="scheduledevents")
    assert list(src.poll()) == []
    (notice,) = src.poll()
    assert notice.kind is NoticeKind.PREEMPT
