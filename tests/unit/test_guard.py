from __future__ import annotations

import json
import os
import signal
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from preemptible import Guard, Notice, NoticeKind
from preemptible.errors import NoticeSourceError
from preemptible.notice import Flag, NoticeBoard
from preemptible.sources.signals import SignalSource, parse_signal


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def deliver(sig: signal.Signals) -> None:
    """Send a real signal to this process and let the handler run (handlers run between bytecodes)."""
    os.kill(os.getpid(), sig)
    for _ in range(1000):  # the handler runs at the next bytecode boundary on the main thread
        pass


def test_sigterm_becomes_a_notice_with_deadline_from_grace() -> None:
    clock = FakeClock()
    with Guard([SignalSource(grace=25.0, clock=clock)], clock=clock) as guard:
        assert guard.notice is None
        assert guard.remaining() is None
        assert not guard.should_stop(7)
        deliver(signal.SIGTERM)
        notice = guard.notice
        assert notice is not None
        assert (notice.source, notice.kind, notice.detail) == ("signal", NoticeKind.TERMINATE, "SIGTERM")
        assert notice.received_at.timestamp() == clock.now
        assert notice.deadline == notice.received_at + timedelta(seconds=25)
        assert guard.remaining() == pytest.approx(25.0)
        clock.now += 10
        assert guard.remaining() == pytest.approx(15.0)
        clock.now += 20
        assert guard.remaining() == pytest.approx(-5.0)
        assert guard.should_stop(8)
        assert guard.stop_step == 8
        assert guard.should_stop(8)


def test_sigusr1_and_configurable_signal_set() -> None:
    with Guard([SignalSource(["USR1"], grace=None)]) as guard:
        deliver(signal.SIGUSR1)
        assert guard.notice is not None
        assert guard.notice.detail == "SIGUSR1"
        assert guard.notice.deadline is None
        assert guard.remaining() is None


def test_previous_handlers_are_restored_on_close() -> None:
    calls: list[int] = []

    def previous(signum: int, frame: Any) -> None:
        calls.append(signum)

    old = signal.signal(signal.SIGUSR1, previous)
    try:
        guard = Guard([SignalSource(["SIGUSR1"])])
        with guard:
            assert signal.getsignal(signal.SIGUSR1) is not previous
            deliver(signal.SIGUSR1)
        assert calls == []  # ours ran, not the previous one
        assert signal.getsignal(signal.SIGUSR1) is previous
        deliver(signal.SIGUSR1)
        assert calls == [signal.SIGUSR1]
        assert guard.notice is not None
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_default_sigterm_handler_is_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with Guard("signal"):
        assert signal.getsignal(signal.SIGTERM) != before
    assert signal.getsignal(signal.SIGTERM) == before


def test_repeated_sigterm_is_recorded_and_ignored() -> None:
    with Guard([SignalSource()]) as guard:
        deliver(signal.SIGTERM)
        deliver(signal.SIGTERM)
        deliver(signal.SIGTERM)
        assert len(guard.notices) == 3
        assert guard.notice is guard.notices[0]


def test_second_sigint_raises_keyboard_interrupt() -> None:
    with Guard([SignalSource()]) as guard:
        deliver(signal.SIGINT)  # first Ctrl-C: a notice, training saves and stops
        assert guard.notice is not None
        assert guard.notice.detail == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            deliver(signal.SIGINT)  # second: exit now


def test_signal_source_needs_the_main_thread() -> None:
    errors: list[BaseException] = []

    def start() -> None:
        try:
            Guard("signal").start()
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=start)
    t.start()
    t.join()
    assert len(errors) == 1
    assert isinstance(errors[0], NoticeSourceError)
    assert "main thread" in str(errors[0])


def test_unknown_source_names_are_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREEMPTIBLE_SOURCES", "signal,carrier-pigeon")
    with pytest.raises(NoticeSourceError, match="carrier-pigeon"):
        Guard()
    with pytest.raises(NoticeSourceError, match="expected a signal name"):
        parse_signal("SIGNOPE")
    with pytest.raises(NoticeSourceError, match="grace"):
        SignalSource(grace=-1)


def test_signals_by_name_number_and_enum() -> None:
    assert {parse_signal(x) for x in ("TERM", "sigterm", "SIGTERM", 15, "15", signal.SIGTERM)} == {signal.SIGTERM}


def test_advisory_notice_does_not_stop() -> None:
    guard = Guard([])
    with guard:
        guard.trigger(source="aws", kind=NoticeKind.REBALANCE)
        assert guard.notice is None
        assert guard.advisory is not None
        assert not guard.should_stop(3)
        guard.trigger(source="aws", kind=NoticeKind.TERMINATE, grace=120)
        assert guard.should_stop(4)


def test_manual_trigger_from_another_thread() -> None:
    clock = FakeClock()
    guard = Guard([], clock=clock)
    with guard:
        t = threading.Thread(target=guard.trigger, kwargs={"source": "custom", "grace": 5.0})
        t.start()
        t.join()
        assert guard.notice is not None
        assert guard.notice.source == "custom"
        assert guard.remaining() == pytest.approx(5.0)


def test_flag_can_be_set_by_a_handler_that_interrupts_its_holder() -> None:
    """A signal handler runs on the thread it interrupts; if that thread holds the flag's lock (inside wait or
    set), a non-reentrant lock would deadlock. Simulate it: set() while already holding the lock."""
    flag = Flag()
    done = threading.Event()

    def holder_interrupted_by_handler() -> None:
        with flag._cond:
            flag.set()
        done.set()

    t = threading.Thread(target=holder_interrupted_by_handler, daemon=True)
    t.start()
    assert done.wait(5), "Flag.set() deadlocked when re-entered by the lock holder"
    assert flag.is_set()
    assert flag.wait(0)


def test_notice_json() -> None:
    n = Notice.at(source="signal", kind=NoticeKind.TERMINATE, now=0.0, grace=30.0, detail="SIGTERM")
    doc = n.to_json()
    assert doc["deadline"] == "1970-01-01T00:00:30+00:00"
    assert doc["kind"] == "terminate"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e20", "-1", "86401", "thirty"])
def test_grace_must_be_finite_seconds_from_0_to_a_day_named_in_the_error(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue 14, item 8): nan/inf/1e20 made the signal handler itself raise, and no checkpoint."""
    monkeypatch.setenv("PREEMPTIBLE_GRACE", value)
    with pytest.raises(NoticeSourceError, match=r"\$PREEMPTIBLE_GRACE: expected"):
        Guard("signal")
    monkeypatch.delenv("PREEMPTIBLE_GRACE")
    with pytest.raises(NoticeSourceError, match="grace: expected"):
        Guard("signal", grace=float(value) if value != "thirty" else value)  # type: ignore[arg-type]


def test_a_signal_handler_never_raises_even_when_the_deadline_cannot_be_computed() -> None:
    src = SignalSource(grace=30, clock=lambda: 1e300)  # a clock no datetime can hold
    board = NoticeBoard()
    src.start(board.record)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        src.close()
    (notice,) = board.notices
    assert notice.detail == "SIGTERM" and notice.deadline is None


def test_grace_zero_means_no_time_promised_and_a_committed_save_exits_with_the_policy_code(tmp_path: Path) -> None:
    """Regression (issue 14, item 8): grace 0 committed the step, then logged a failed save and exited 75."""
    from preemptible import Run

    run = Run(tmp_path, grace=0, exit_on_notice=False, model=torch.nn.Linear(2, 1))
    for step in run.steps(10):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
    events = [json.loads(x) for f in (tmp_path / "journal").glob("*.jsonl") for x in f.read_text().splitlines()]
    exit_event = next(e for e in events if e["event"] == "exit")
    assert exit_event["saved"] is True and exit_event["code"] == 0 and exit_event["step"] == 3
    assert (tmp_path / "step-000000000003" / "COMMIT.json").exists()
