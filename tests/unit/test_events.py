"""One vocabulary of events: the log lines preemptible writes are the lines diagnose recognises."""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest
import torch

from preemptible import Run
from preemptible.diagnose import diagnose
from preemptible.events import LOG_VERDICTS, Event, tag


@pytest.mark.parametrize(("key", "verdict"), list(LOG_VERDICTS.items()))
def test_every_tagged_line_gets_its_verdict(key: tuple[Event, str, str], verdict: str) -> None:
    event, field, value = key
    line = f"preemptible WARNING: [rank=0] {tag(event, **{field: value})}: reworded text of any kind"
    assert diagnose([("log", [line])]).verdict == verdict


def test_the_run_s_own_notice_line_is_recognised(tmp_path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """Drift test: the line `Run` really logs on a signal (not a copy of it) must be what diagnose expects."""
    model = torch.nn.Linear(2, 1)
    run = Run(tmp_path, exit_on_notice=False, model=model)
    caplog.set_level(logging.WARNING, logger="preemptible")
    logging.getLogger("preemptible").addHandler(caplog.handler)
    try:
        for step in run.steps(10):
            if step == 2:
                threading.Timer(0, os.kill, (os.getpid(), signal.SIGTERM)).run()
    finally:
        logging.getLogger("preemptible").removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records]
    assert any("event=notice source=signal" in line for line in lines), lines
    assert diagnose([("log", lines)]).verdict == "terminated"


def test_journal_events_are_the_vocabulary(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = Run(tmp_path, model=torch.nn.Linear(2, 1))
    for _ in run.steps(3):
        pass
    import json

    names = {json.loads(x)["event"] for f in (tmp_path / "journal").glob("*.jsonl") for x in f.read_text().splitlines()}
    assert names <= {e.value for e in Event}, names - {e.value for e in Event}
