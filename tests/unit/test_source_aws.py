"""AwsSource against the loopback IMDS emulator: token flow, notices, faults, malformed input."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import pytest

from preemptible import NoticeKind
from preemptible.emulate import AwsEmulator
from preemptible.emulate.base import iso_seconds
from preemptible.sources.aws import AwsSource
from preemptible.sources.http import MetadataError


@pytest.fixture
def imds() -> Iterator[AwsEmulator]:
    with AwsEmulator() as emu:
        yield emu


def puts(emu: AwsEmulator) -> int:
    return sum(r.method == "PUT" for r in emu.requests)


def test_no_notice_then_terminate_with_fixed_deadline(imds: AwsEmulator) -> None:
    src = AwsSource(imds.url)
    assert list(src.poll()) == []
    doc = imds.notice()
    (notice,) = src.poll()
    assert notice.source == "aws" and notice.kind is NoticeKind.TERMINATE
    assert notice.deadline is not None and notice.deadline.strftime("%Y-%m-%dT%H:%M:%SZ") == doc["time"]
    assert 118 <= notice.remaining(time.time()) <= 120.5  # type: ignore[operator]
    assert list(src.poll()) == []  # reported once


@pytest.mark.parametrize(("action", "kind"), [("stop", NoticeKind.STOP), ("hibernate", NoticeKind.HIBERNATE)])
def test_stop_and_hibernate(imds: AwsEmulator, action: str, kind: NoticeKind) -> None:
    src = AwsSource(imds.url)
    imds.notice(action)
    (notice,) = src.poll()
    assert notice.kind is kind
    if action == "hibernate":  # no two-minute lead
        assert notice.remaining(time.time()) < 1.5  # type: ignore[operator]


def test_one_token_serves_many_requests_and_is_refreshed_before_expiry(imds: AwsEmulator) -> None:
    now = [1_900_000_000.0]
    src = AwsSource(imds.url, token_ttl=300, clock=lambda: now[0])
    for _ in range(5):
        src.poll()
    assert puts(imds) == 1
    now[0] += 250  # under a minute of the 300 s left: refresh before it expires
    src.poll()
    assert puts(imds) == 2
    assert all(r.header("X-aws-ec2-metadata-token") for r in imds.requests if r.method == "GET")


def test_401_gets_a_new_token_and_retries_once(imds: AwsEmulator) -> None:
    src = AwsSource(imds.url)
    src.poll()
    imds.revoke_tokens()
    imds.notice()
    (notice,) = src.poll()
    assert notice.kind is NoticeKind.TERMINATE
    assert puts(imds) == 2


def test_token_put_timeout_falls_back_to_imdsv1() -> None:
    with AwsEmulator(require_token=False, token_put="hang", hang_s=1.0) as emu:
        src = AwsSource(emu.url, put_timeout=0.2)
        assert list(src.poll()) == []
        assert src.mode == "v1"
        emu.notice()
        (notice,) = src.poll()
        assert notice.kind is NoticeKind.TERMINATE
        assert puts(emu) == 1  # no new PUT on every poll while in v1 mode
        gets = [r for r in emu.requests if r.method == "GET"]
        assert not any(r.header("X-aws-ec2-metadata-token") for r in gets)


def test_imds_v2_required_refuses_tokenless_requests(imds: AwsEmulator) -> None:
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(imds.url + "/latest/meta-data/instance-id", timeout=2)
    assert info.value.code == 401
    req = urllib.request.Request(
        imds.url + "/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "0"}
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=2)
    assert info.value.code == 400
    req = urllib.request.Request(
        imds.url + "/latest/api/token",
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "1.2.3.4"},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=2)
    assert info.value.code == 403


def test_json_is_served_as_text_plain(imds: AwsEmulator) -> None:
    imds.notice()
    src = AwsSource(imds.url)
    response = src.get("/latest/meta-data/spot/instance-action")
    assert response is not None
    assert response.headers["content-type"] == "text/plain"
    assert json.loads(response.body)["action"] == "terminate"


def test_legacy_termination_time_alone(imds: AwsEmulator) -> None:
    src = AwsSource(imds.url)
    when = iso_seconds(time.time() + 90)
    imds.termination_time = "not-a-time"  # documented: a non-time value means no notice
    assert list(src.poll()) == []
    imds.termination_time = when
    (notice,) = src.poll()
    assert notice.deadline is not None and notice.deadline.strftime("%Y-%m-%dT%H:%M:%SZ") == when


def test_rebalance_is_advisory_and_optional(imds: AwsEmulator) -> None:
    imds.rebalance()
    (notice,) = AwsSource(imds.url).poll()
    assert notice.kind is NoticeKind.REBALANCE and notice.kind.advisory and notice.deadline is None
    assert list(AwsSource(imds.url, rebalance=False).poll()) == []


@pytest.mark.parametrize(
    "body",
    [
        "{not json",
        json.dumps({"action": "terminate"}),
        json.dumps({"action": "explode", "time": "2030-01-01T00:00:00Z"}),
        json.dumps({"action": "terminate", "time": "18 September 2017"}),
        json.dumps(["terminate"]),
    ],
)
def test_malformed_instance_action_is_ignored_until_valid(
    imds: AwsEmulator, body: str, caplog: pytest.LogCaptureFixture
) -> None:
    src = AwsSource(imds.url)
    imds.instance_action = {"raw": "x"}  # replaced below by a raw body
    imds.items["spot/instance-action"] = body
    imds.instance_action = None
    original = imds._item

    def serve(item: str):  # type: ignore[no-untyped-def]
        if item == "spot/instance-action":
            from preemptible.emulate.base import text

            return text(body)
        return original(item)

    imds._item = serve  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="preemptible"):
        assert list(src.poll()) == []
        assert list(src.poll()) == []
    assert caplog.text.count("malformed instance-action") == 1  # logged once, not per poll
    imds._item = original  # type: ignore[method-assign]
    imds.notice()
    (notice,) = src.poll()
    assert notice.kind is NoticeKind.TERMINATE


def test_notice_time_in_the_past(imds: AwsEmulator) -> None:
    src = AwsSource(imds.url)
    imds.notice(lead=-30)  # already past: still a notice (the save gets its best attempt)
    (notice,) = src.poll()
    assert notice.remaining(time.time()) < 0  # type: ignore[operator]
    stale = AwsSource(imds.url)
    imds.notice(lead=-3600)  # an hour ago: a leftover of a termination that failed
    assert list(stale.poll()) == []


@pytest.mark.parametrize(
    ("fault", "kwargs"),
    [
        ("status", {"status": 500}),
        ("status", {"status": 503}),
        ("status", {"status": 429}),
        ("drop", {}),
        ("slow", {"delay": 0.5}),
    ],
)
def test_faults_raise_for_backoff_then_the_notice_is_seen(imds: AwsEmulator, fault: str, kwargs: dict) -> None:  # type: ignore[type-arg]
    src = AwsSource(imds.url, timeout=0.3)
    src.poll()
    imds.notice()
    imds.fault(fault, path="spot/instance-action", **kwargs)
    with pytest.raises(MetadataError) as info:
        src.poll()
    assert info.value.backoff
    (notice,) = src.poll()
    assert notice.kind is NoticeKind.TERMINATE


def test_imds_disabled_is_a_clear_error() -> None:
    with AwsEmulator(token_put="forbid") as emu, pytest.raises(MetadataError, match="disabled"):
        AwsSource(emu.url).poll()


def test_redirects_are_not_followed() -> None:
    with AwsEmulator() as emu:
        from preemptible.emulate.base import Reply

        emu.handle = lambda req: Reply(302, b"", headers={"Location": "http://example.invalid/"})  # type: ignore[method-assign]
        with pytest.raises(MetadataError, match="redirect"):
            AwsSource(emu.url).poll()
