"""Attempts: every process start of a run is numbered in its journal's start event, and diagnose judges one
attempt, the one the logs' timestamps fall in unless told (--attempt N|last), and says which. The case from the
issue: a log of an earlier attempt (stopped by SIGTERM) must not be judged by a later attempt that completed."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from conftest import Trainer, clean_env, journal
from preemptible.diagnose import diagnose

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def two_attempts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("attempts") / "ckpt"
    first = Trainer(root, "--steps", "400", "--step-time", "0.01")
    first.wait_for_step(3)
    first.signal(__import__("signal").SIGTERM)
    code, _, err = first.finish()
    assert code == 0, err
    second = Trainer(root, "--steps", "60")
    assert second.finish()[0] == 0
    start = next(e for e in journal(root) if e["event"] == "start")
    stamp = datetime.fromisoformat(start["t"].replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M:%S")
    log = [f"{stamp} {line}" for line in err.splitlines()]  # attempt 1's own stderr, as a timestamping logger kept it
    return root, log


def test_each_start_is_numbered(two_attempts: tuple[Path, list[str]]) -> None:
    root, _ = two_attempts
    assert [e["attempt"] for e in journal(root) if e["event"] == "start"] == [1, 2]


def test_a_log_of_the_first_attempt_is_judged_against_the_first_attempt(two_attempts: tuple[Path, list[str]]) -> None:
    root, log = two_attempts
    result = diagnose([("attempt1.log", log)], root=str(root))
    assert result.checkpoint["attempt"] == 1 and result.checkpoint["attempt_chosen_by"] == "the logs' time range"
    assert result.verdict == "terminated", result.render()
    assert result.checkpoint["notice_step"] is not None and result.steps_lost == 0
    assert "attempt 1 of 2 (chosen by the logs' time range)" in result.render()


def test_a_log_without_timestamps_is_placed_by_preemptible_s_own_lines(two_attempts: tuple[Path, list[str]]) -> None:
    """Attempt 1's stderr as the process printed it (no timestamps): its "... received; stopping at step N" line
    names the attempt whose journal has that notice."""
    root, log = two_attempts
    bare = [line.split(" ", 2)[2] for line in log]  # the logger's date and time taken off again
    result = diagnose([("attempt1.log", bare)], root=str(root))
    assert result.checkpoint["attempt"] == 1, result.render()
    assert result.checkpoint["attempt_chosen_by"].startswith("preemptible's own lines in the logs (a notice at step")
    assert result.verdict == "terminated" and result.checkpoint["notice_step"] is not None


def test_attempt_last_and_a_number_choose_explicitly(two_attempts: tuple[Path, list[str]]) -> None:
    root, log = two_attempts
    assert diagnose([("attempt1.log", log)], root=str(root), attempt="last").checkpoint["attempt"] == 2
    alone = diagnose(root=str(root))  # no log: the last attempt, and it says why
    assert (
        alone.verdict == "completed"
        and alone.checkpoint["attempt_chosen_by"] == "the last: no logs given to match by time"
    )
    assert diagnose(root=str(root), attempt=1).verdict == "terminated"


def test_the_cli_takes_attempt_and_refuses_one_that_does_not_exist(two_attempts: tuple[Path, list[str]]) -> None:
    root, _ = two_attempts
    run = [sys.executable, "-m", "preemptible", "diagnose", "--root", str(root), "--json"]
    done = subprocess.run([*run, "--attempt", "1"], capture_output=True, text=True, env=clean_env(), check=False)
    assert done.returncode == 0 and json.loads(done.stdout)["checkpoint"]["attempt"] == 1, done.stderr
    bad = subprocess.run([*run, "--attempt", "5"], capture_output=True, text=True, env=clean_env(), check=False)
    assert bad.returncode == 2 and "expected --attempt between 1 and 2" in bad.stderr
