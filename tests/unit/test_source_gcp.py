"""GcpSource against the loopback metadata-server emulator: hanging GET, ETags, maintenance, faults."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from preemptible import NoticeKind
from preemptible.emulate import GcpEmulator
from preemptible.emulate.gcp import etag
from preemptible.notice import NoticeBoard
from preemptible.sources.gcp import GcpSource
from preemptible.sources.http import MetadataError


@pytest.fixture
def mds() -> Iterator[GcpEmulator]:
    with GcpEmulator() as emu:
        yield emu


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def test_emulator_protocol_details(mds: GcpEmulator) -> None:
    url = mds.url + "/computeMetadata/v1/instance/preempted"
    status, _, body = get(url)
    assert (status, body.strip()) == (403, "Missing Metadata-Flavor:Google header.")
    status, _, _ = get(url, {"Metadata-Flavor": "Google", "X-Forwarded-For": "1.2.3.4"})
    assert status == 403
    status, headers, body = get(url, {"Metadata-Flavor": "Google"})
    assert (status, body) == (200, "FALSE")
    assert headers["Metadata-Flavor"] == "Google" and headers["Content-Type"] == "application/text"
    assert headers["ETag"] == etag("FALSE") and len(headers["ETag"]) == 16
    t = time.monotonic()
    status, _, body = get(
        url + f"?wait_for_change=true&last_etag={etag('FALSE')}&timeout_sec=1", {"Metadata-Flavor": "Google"}
    )
    assert (status, body) == (200, "FALSE") and time.monotonic() - t >= 0.9  # held until its timeout, same value
    status, _, body = get(
        url + "?wait_for_change=true&last_etag=0000000000000000&timeout_sec=5", {"Metadata-Flavor": "Google"}
    )
    assert body == "FALSE"  # a different last_etag returns at once


def test_hanging_get_sees_preemption_the_moment_it_happens(mds: GcpEmulator) -> None:
    src = GcpSource(mds.url, wait_timeout_s=5)
    assert list(src.poll()) == []  # learns the ETag
    threading.Timer(0.3, mds.notice).start()
    (notice,) = src.poll()  # one hanging GET, answered by the change (no timing bound: CI shares its cores)
    assert notice.kind is NoticeKind.TERMINATE and notice.source == "gcp"
    assert notice.remaining(time.time()) == pytest.approx(30, abs=1)  # type: ignore[arg-type]
    waits = [r for r in mds.requests if r.query.get("wait_for_change") == "true"]
    assert len(waits) == 1 and waits[0].query["last_etag"] == etag("FALSE") and waits[0].query["timeout_sec"] == "5"


def test_maintenance_terminate(mds: GcpEmulator) -> None:
    src = GcpSource(mds.url, wait_timeout_s=1)
    assert list(src.poll()) == []
    mds.maintenance("MIGRATE_ON_HOST_MAINTENANCE")
    assert list(src.poll()) == []  # live migration: training goes on
    mds.maintenance()
    (notice,) = src.poll()
    assert notice.kind is NoticeKind.MAINTENANCE


def test_malformed_value_is_ignored_until_valid(mds: GcpEmulator) -> None:
    src = GcpSource(mds.url, wait_timeout_s=1)
    mds.set("instance/preempted", "MAYBE")
    assert list(src.poll()) == []
    mds.notice()
    (notice,) = src.poll()
    assert notice.kind is NoticeKind.TERMINATE


@pytest.mark.parametrize(("fault", "kwargs"), [("status", {"status": 503}), ("drop", {}), ("status", {"status": 500})])
def test_faults_then_notice(mds: GcpEmulator, fault: str, kwargs: dict) -> None:  # type: ignore[type-arg]
    src = GcpSource(mds.url, wait_timeout_s=1)
    mds.fault(fault, path="preempted", **kwargs)
    with pytest.raises(MetadataError):
        src.poll()
    mds.notice()
    (notice,) = src.poll()
    assert notice.kind is NoticeKind.TERMINATE


def test_a_server_that_is_not_google_is_refused() -> None:
    with GcpEmulator() as emu:
        from preemptible.emulate.base import text

        emu.handle = lambda req: text("TRUE")  # type: ignore[method-assign]
        with pytest.raises(MetadataError, match="Metadata-Flavor"):
            GcpSource(emu.url).poll()


def test_close_interrupts_a_hanging_get_at_once(mds: GcpEmulator) -> None:
    board = NoticeBoard()
    src = GcpSource(mds.url, wait_timeout_s=60)
    src.start(board.record)
    deadline = time.monotonic() + 5
    while not any(r.query.get("wait_for_change") for r in mds.requests) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # now hanging for up to 60 s
    src.close()  # returns once the thread has ended (it would wait the GET out, up to 60 s, if not interrupted)
    assert not any(th.name == "preemptible-poll-gcp" for th in threading.enumerate())
