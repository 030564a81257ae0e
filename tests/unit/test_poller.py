"""The poller thread: pacing, backoff, logging once per kind, shutdown; with an injected wait."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from preemptible import Notice, NoticeKind
from preemptible.emulate import AwsEmulator
from preemptible.notice import NoticeBoard, Poller
from preemptible.sources.aws import AwsSource
from preemptible.sources.http import MetadataError


def test_backoff_doubles_on_service_errors_and_resets() -> None:
    outcomes = [MetadataError("http 503", "x")] * 4 + [False, MetadataError("timeout", "t"), True]
    waits: list[float] = []

    def tick() -> bool:
        result = outcomes.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    poller = Poller("test-poll", tick, interval=1.0, max_backoff=5.0, wait=lambda s: waits.append(s) or False)
    poller._run()  # runs in this thread: the injected wait makes it instantaneous
    assert waits == [2.0, 4.0, 5.0, 5.0, 1.0, 2.0]
    assert outcomes == []


def test_bad_content_keeps_the_pace() -> None:
    outcomes = [MetadataError("malformed", "m", backoff=False)] * 3 + [True]
    waits: list[float] = []

    def tick() -> bool:
        result = outcomes.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    Poller("test-poll", tick, interval=0.5, wait=lambda s: waits.append(s) or False)._run()
    assert waits == [0.5, 0.5, 0.5]


def test_source_thread_logs_each_kind_once_and_finds_the_notice(caplog: pytest.LogCaptureFixture) -> None:
    with AwsEmulator() as emu:
        emu.fault("status", status=503, times=6, path="instance-action")
        board = NoticeBoard()
        src = AwsSource(emu.url, interval=0.01)
        src.max_backoff = 0.02
        with caplog.at_level(logging.INFO, logger="preemptible"):
            src.start(board.record)
            emu.notice()
            assert board.event.wait(10)
            src.close()
        assert caplog.text.count("http 503") == 1
        assert "answering again" in caplog.text
        assert board.first is not None and board.first.source == "aws"


def test_polling_ends_after_a_stop_notice_but_not_after_advisory() -> None:
    with AwsEmulator() as emu:
        board = NoticeBoard()
        src = AwsSource(emu.url, interval=0.01)
        emu.rebalance()
        src.start(board.record)
        assert board.advisory.wait(5)
        time.sleep(0.05)
        assert any(t.name == "preemptible-poll-aws" for t in threading.enumerate())
        emu.notice()
        assert board.event.wait(5)
        deadline = time.monotonic() + 5
        while any(t.name == "preemptible-poll-aws" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(t.name == "preemptible-poll-aws" for t in threading.enumerate())
        src.close()
        assert [n.kind for n in board.notices] == [NoticeKind.REBALANCE, NoticeKind.TERMINATE]


def test_close_is_prompt_between_polls() -> None:
    with AwsEmulator() as emu:
        src = AwsSource(emu.url, interval=30)
        src.start(NoticeBoard().record)
        time.sleep(0.1)
        src.close()  # joins the thread (5 s at most); without the interruptible wait it would sleep out its 30 s
        assert not any(th.name.startswith("preemptible-poll") for th in threading.enumerate())


def test_notice_remaining_uses_the_given_clock() -> None:
    n = Notice.at(source="x", kind=NoticeKind.TERMINATE, now=100.0, grace=30)
    assert n.remaining(110.0) == 20.0
