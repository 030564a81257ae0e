"""The journal: one file per rank and process start, every event flushed, torn lines skipped, never fatal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preemptible import journal
from preemptible.events import Event
from preemptible.store.io import LocalStorage


def test_events_are_lines_with_t_event_step_rank(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    j = journal.Journal(storage, rank=3, clock=lambda: 0.0)
    j.event(Event.SAVE_COMMITTED, 7, bytes=10, seconds=float("nan"))
    lines = Path(j.path).read_text().splitlines()  # flushed per event, before close
    rec = json.loads(lines[0])
    assert rec == {
        "t": "1970-01-01T00:00:00.000000Z",
        "event": "save_committed",
        "step": 7,
        "rank": 3,
        "bytes": 10,
        "seconds": "nan",
    }
    assert Path(j.path).name == "19700101T000000.000000Z-r3.jsonl"
    j.close()


def test_read_skips_torn_lines_and_tags_the_file(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    j = journal.Journal(storage, clock=lambda: 0.0)
    j.event(Event.START, None)
    j.close()
    with open(j.path, "a") as f:
        f.write('{"t": "x", "event": "sav')  # kill -9 mid-line
    events = list(journal.read(storage))
    assert [e["event"] for e in events] == ["start"]
    assert events[0]["file"] == Path(j.path).name


def test_an_unwritable_journal_never_stops_training(tmp_path: Path) -> None:
    (tmp_path / "journal").write_text("a file where the directory should be")
    j = journal.Journal(LocalStorage(str(tmp_path)))
    assert j.event(Event.START, None)["event"] == "start"
    j.event(Event.LOG, 1, loss=0.5)  # still fine, logged once
    j.close()


def test_item_13_a_journal_deleted_under_the_run_is_reported_and_started_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 14 item 13: the root deleted while the run writes; the run recreates it and goes on, and says that
    the journal before was lost, in the log and in the new journal."""
    import shutil

    from preemptible.journal import Journal, read
    from preemptible.store.io import LocalStorage

    storage = LocalStorage(str(tmp_path / "root"))
    j = Journal(storage)
    j.event("start", 0)
    j.event("save_committed", 3)
    shutil.rmtree(tmp_path / "root")
    with caplog.at_level("WARNING", logger="preemptible"):
        j.event("save_committed", 6)
    assert "was deleted while this run was writing it" in caplog.text and "2 earlier events are lost" in caplog.text
    events = list(read(storage))
    assert [e["event"] for e in events] == ["journal_lost", "save_committed"]
    assert events[0]["lost_events"] == 2
    j.event("exit", 7)
    assert [e["event"] for e in read(storage)][-1] == "exit"
    j.close()
