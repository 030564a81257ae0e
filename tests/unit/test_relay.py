"""The relayed notice: `preemptible run` writes it, the library reads it as a notice source (`RelayedSource`)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from preemptible import Guard, Notice, NoticeKind
from preemptible.relay import NOTICE_FILE_ENV, read_notice_file, write_notice_file
from preemptible.sources.relayed import RelayedSource


def aws_notice() -> Notice:
    return Notice.at(source="aws", kind=NoticeKind.TERMINATE, now=1000.0, grace=120.0, detail="spot/instance-action")


def test_notice_json_round_trips() -> None:
    n = aws_notice()
    assert Notice.from_json(n.to_json()) == n


@pytest.mark.parametrize("doc", [{}, {"source": "aws"}, {"source": "aws", "kind": "nope", "received_at": "x"}, []])
def test_a_malformed_notice_document_is_a_clear_error(doc: object) -> None:
    with pytest.raises(ValueError, match="expected a notice document with source, kind, received_at"):
        Notice.from_json(doc)


def test_the_file_round_trips_and_malformed_files_are_ignored(tmp_path: Path) -> None:
    path = str(tmp_path / "notice.json")
    assert read_notice_file(path) is None
    write_notice_file(path, aws_notice(), relayed_as="SIGTERM")
    assert read_notice_file(path) == aws_notice()
    Path(path).write_text("{not json")
    assert read_notice_file(path) is None


def test_a_signal_under_the_wrapper_is_the_relayed_cloud_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "notice.json"
    write_notice_file(str(path), aws_notice(), relayed_as="SIGTERM")
    monkeypatch.setenv(NOTICE_FILE_ENV, str(path))
    with Guard("signal", grace=30) as guard:
        assert isinstance(guard.sources[0], RelayedSource)
        os.kill(os.getpid(), signal.SIGTERM)
        notice = guard.notice
        assert notice is not None
        assert (notice.source, notice.deadline) == ("aws", aws_notice().deadline)
        assert "relayed as SIGTERM" in notice.detail
        assert guard.notice is notice  # read once per notice
        assert guard.board.first is not None and guard.board.first.source == "signal"  # the handler did no I/O


def test_without_a_file_the_signal_s_own_notice_stands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NOTICE_FILE_ENV, str(tmp_path / "never-written.json"))
    with Guard("signal", grace=30) as guard:
        os.kill(os.getpid(), signal.SIGTERM)
        notice = guard.notice
        assert notice is not None and notice.source == "signal" and notice.detail == "SIGTERM"
