"""`preemptible report` across nodes: one row per attempt (one launch of the whole job, every rank that ran in it),
its ranks and nodes, how it ended across them (a notice on the node that got it, a peer lost, finished) and each
rank's exit code. Read from the journals of real multi-node runs (tests/corpus/report/nodes: test_nodes' scenarios,
trimmed) and from journals the real `Journal` writes the way those runs do."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from preemptible import report
from preemptible.cli import main
from preemptible.events import Event, ExitReason, SaveReason
from preemptible.journal import Journal
from preemptible.store.io import LocalStorage

NODES = Path(__file__).resolve().parent.parent / "corpus" / "report" / "nodes"


def _doc(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    assert main(["report", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["report", str(root)]) == 0
    return doc, capsys.readouterr().out


def _ranks(run: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(r["rank"], r["node"], r["exit_code"], r["role"], r["ended"]) for r in run["ranks"]]


def test_scenario_1_the_notice_is_on_node_1_and_the_elastic_restart_is_one_more_attempt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An AWS notice to group rank 1's node: rank 1 exits 0 (reclaimed), rank 0 exits 76 (survivor); torchrun
    restarts rank 0's node with a replacement node joining: one attempt more, of both ranks, not one per node."""
    doc, text = _doc(NODES / "1-notice-to-node2", capsys)
    assert doc["attempts"] == 2 and [r["ranks_total"] for r in doc["runs"]] == [2, 2]
    first, second = doc["runs"]
    assert _ranks(first) == [(0, 0, 76, "survivor", "notice"), (1, 1, 0, "reclaimed", "notice")]
    assert first["nodes"] == [0, 1] and first["ended"] == "notice (aws) on node 1 (rank 1)"
    assert [r["ended"] for r in second["ranks"]] == ["finished", "finished"] and second["ended"] == "finished"
    (p,) = doc["preemptions"]
    assert (p["attempt"], p["rank"], p["node"], p["commit_journaled_by"]) == (1, 1, 1, 0)
    assert "seen by" not in p["detail"]  # the reclaimed rank's own words, not the survivor's relay
    assert "at step 84 on node 1 (rank 1): notice->commit" in text
    assert "ended: notice (aws) on node 1 (rank 1)" in text
    assert "2 ranks on 2 nodes: exit 76 (survivor): rank 0 (node 0); exit 0 (reclaimed): rank 1 (node 1)" in text


def test_scenario_2_the_store_host_went_after_its_commit_which_the_survivor_journaled(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Rank 0's node got the notice and went at the commit (its journal ends at the notice): the notice is rank 0's,
    the commit is known from rank 1's journal, rank 1 exited 76."""
    doc, text = _doc(NODES / "2-notice-to-store-host", capsys)
    assert doc["attempts"] == 2
    first = doc["runs"][0]
    assert _ranks(first) == [(0, None, None, None, "no exit event"), (1, 1, 76, "survivor", "notice")]
    assert first["ended"] == "notice (aws) on rank 0"
    (p,) = doc["preemptions"]
    assert (p["rank"], p["commit_journaled_by"]) == (0, 1) and p["notice_to_commit_s"] > 0
    assert "as rank 1 journaled it" in text and "no exit event: rank 0; exit 76 (survivor): rank 1 (node 1)" in text


def test_scenario_3_a_node_lost_without_notice_then_one_node_then_two(capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1's node vanished: rank 0's peer watch found it (exit 76), rank 1 journaled no end; then rank 0 alone
    (torchrun's restart at world 1, stopped by a SIGTERM), then both again: three attempts."""
    doc, text = _doc(NODES / "3-node2-lost-without-notice", capsys)
    assert doc["attempts"] == 3 and [r["ranks_total"] for r in doc["runs"]] == [2, 1, 2]
    lost, alone, grown = doc["runs"]
    assert _ranks(lost) == [(0, 0, 76, None, "peer lost"), (1, None, None, None, "no exit event")]
    assert lost["ended"] == "peer lost: rank 1 did not answer rank 0"
    assert (alone["ended"], _ranks(alone)) == ("notice", [(0, None, 0, None, "notice")])
    assert grown["ended"] == "finished"
    assert "2 ranks: exit 76 (peer lost): rank 0 (node 0); no exit event: rank 1" in text
    assert doc["timeline"][0]["ended"] == lost["ended"]  # not drawn as killed without a word: rank 0 said why


def test_scenario_4_a_node_cut_off_both_sides_lost_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    doc, text = _doc(NODES / "4-node2-cut-mid-save", capsys)
    assert doc["attempts"] == 2
    cut = doc["runs"][0]
    assert _ranks(cut) == [(0, 0, 76, None, "peer lost"), (1, 1, 76, None, "peer lost")]
    assert cut["ended"] == "peer lost: node 1 (rank 1) did not answer rank 0"
    assert "2 ranks on 2 nodes: exit 76 (peer lost): ranks 0, 1 (nodes 0, 1)" in text


class _Job:
    """Journals written by the real `Journal`, at the times a test sets, with the events and fields a multi-node
    `Run` gives them (run.py, emergency.py: ``start``, ``notice``, ``save_committed``, ``exit``, ``done``)."""

    def __init__(self, root: Path) -> None:
        self.storage = LocalStorage(str(root))
        self.now = 1.8e9

    def clock(self) -> Callable[[], float]:
        return lambda: self.now

    def rank(self, rank: int, *, at: float, attempt: int | None, node: int | None, world: int = 2) -> Journal:
        self.now = at
        j = Journal(self.storage, rank=rank, clock=self.clock())
        fields: dict[str, Any] = {"attempt": attempt} if attempt is not None else {}
        j.event(Event.START, None, total=100, pid=1000 + rank, host="vm", world_size=world, node=node, **fields)
        return j

    def at(self, t: float) -> None:
        self.now = t


def _notice(j: Journal, step: int, seen_by: int | None) -> None:
    detail = "spot instance-action terminate at 2027-01-15T08:02:00Z"
    detail += f" (seen by rank {seen_by})" if seen_by is not None else ""
    j.event(Event.NOTICE, step, source="aws", kind="terminate", received_at="2027-01-15T08:00:00+00:00",
            deadline="2027-01-15T08:02:00+00:00", detail=detail)  # fmt: skip


def test_an_elastic_restart_with_a_replacement_that_now_holds_rank_0_is_one_attempt_across_both_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Launch 1: ranks 0 and 1 on nodes 0 and 1; a notice to node 1. Launch 2 (torchrun's restart): the surviving
    node's rank restarts first (as rank 1 now, restart count 1), the replacement's rank 0 (restart count 0)
    starts 4 s later at its own time. Two attempts of two ranks each, by the attempt number every rank of a
    launch journals, not by file names or start times."""
    job = _Job(tmp_path)
    t0 = 1.8e9
    a0, a1 = job.rank(0, at=t0, attempt=1, node=0), job.rank(1, at=t0 + 0.002, attempt=1, node=1)
    for j, seen_by in ((a1, None), (a0, 1)):
        job.at(t0 + 30)
        _notice(j, 50, seen_by)
        j.event(Event.SAVE_COMMITTED, 50, reason=SaveReason.EMERGENCY, seconds=0.1)
    job.at(t0 + 31)
    a0.event(Event.EXIT, 50, code=76, reason=ExitReason.NOTICE, saved=True, node=0, role="survivor", agent_pid=None)
    a1.event(Event.EXIT, 50, code=0, reason=ExitReason.NOTICE, saved=True, node=1, role="reclaimed", agent_pid=9)
    b1 = job.rank(1, at=t0 + 40, attempt=2, node=1)  # the survivor's restart, now group rank 1
    b0 = job.rank(0, at=t0 + 44, attempt=2, node=0)  # the replacement: group rank 0, its own start time
    for j in (b0, b1):
        job.at(t0 + 60)
        j.event(Event.RESUME, 50, seconds=0.1)
        j.event(Event.DONE, 100, total=100)
    doc, text = _doc(tmp_path, capsys)
    assert doc["attempts"] == 2 and doc["finished"] is True
    first, second = doc["runs"]
    assert _ranks(first) == [(0, 0, 76, "survivor", "notice"), (1, 1, 0, "reclaimed", "notice")]
    assert _ranks(second) == [(0, 0, None, None, "finished"), (1, 1, None, None, "finished")]
    assert [r["journal"] for r in second["ranks"]] == [b0.path.rsplit("/", 1)[-1], b1.path.rsplit("/", 1)[-1]]
    assert first["ended"] == "notice (aws) on node 1 (rank 1)" and second["ended"] == "finished"
    assert "2 ranks on 2 nodes: finished: ranks 0, 1 (nodes 0, 1)" in text


def test_journals_without_attempt_numbers_go_to_the_nearest_start_and_a_rank_never_counts_as_an_attempt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Journals written before attempt numbers (and nodes): another rank's file belongs to the launch whose rank 0
    started nearest to it; only rank 0's files are attempts, however many ranks there are."""
    job = _Job(tmp_path)
    t0 = 1.8e9
    for launch in range(2):
        start = t0 + 100 * launch
        files = [job.rank(r, at=start + 0.5 * r, attempt=None, node=None, world=4) for r in range(4)]
        job.at(start + 20)
        for j in files:
            if launch == 0:
                j.event(Event.EXIT, 10, code=1, reason=ExitReason.LEFT_LOOP, saved=False)
            else:
                j.event(Event.DONE, 10, total=10)
    doc, text = _doc(tmp_path, capsys)
    assert doc["attempts"] == 2 and [r["ranks_total"] for r in doc["runs"]] == [4, 4]
    assert [r["ended"] for r in doc["runs"]] == ["left the loop", "finished"]
    assert [[x["exit_code"] for x in r["ranks"]] for r in doc["runs"]] == [[1, 1, 1, 1], [None] * 4]
    assert "4 ranks: exit 1: ranks 0-3" in text


def test_hostile_rank_fields_are_shown_bounded_and_never_break_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nodes, codes, roles and missing ranks that are not what a `Run` writes: read as nothing or as bounded text,
    in the text, the JSON and the page."""
    (tmp_path / "journal").mkdir()
    evil = "<script>alert(1)</script>" * 40
    lines = {
        "20270101T000000.000000Z-r0.jsonl": [
            {"t": "2027-01-01T00:00:00Z", "event": "start", "step": None, "rank": 0, "attempt": "x", "node": evil},
            {
                "t": "2027-01-01T00:00:05Z",
                "event": "peer_lost",
                "step": 3,
                "rank": 0,
                "missing": evil,
                "how": [1],
                "node": True,
                "code": {"a": 1},
            },
        ],
        "20270101T000000.100000Z-r1.jsonl": [
            {"t": "2027-01-01T00:00:00Z", "event": "start", "step": None, "rank": 1, "attempt": 10**30, "node": -1},
            {"t": "2027-01-01T00:00:04Z", "event": "notice", "step": 3, "rank": 1, "source": evil, "detail": 7},
            {
                "t": "2027-01-01T00:00:05Z",
                "event": "exit",
                "step": 3,
                "rank": 1,
                "code": evil,
                "role": [evil],
                "reason": None,
                "node": 10**30,
            },
        ],
    }
    for name, events in lines.items():
        (tmp_path / "journal" / name).write_text("".join(json.dumps(e) + "\n" for e in events))
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path), "--json", "--html", str(page)]) == 0
    doc = json.loads(capsys.readouterr().out)
    (run,) = doc["runs"]
    assert run["ranks_total"] == 2 and run["nodes"] == [-1]
    assert all(len(str(v)) <= 300 for r in run["ranks"] for v in r.values())
    assert "<script>" not in page.read_text()
    assert main(["report", str(tmp_path)]) == 0
    assert "2 ranks" in capsys.readouterr().out
    doc = report.report(LocalStorage(str(tmp_path)))
    assert doc["runs"][0]["ended"].startswith("notice (")


def test_the_attempt_number_a_rank_journaled_decides_before_its_start_time() -> None:
    """A rank's file goes to the launch whose number it recorded, even when another launch's rank 0 started nearer
    to it; without a number (or with one no launch has), to the nearest start."""
    from preemptible.journal import Record
    from preemptible.report._ranks import Ranks

    ranks = Ranks({})
    for name, rank, at, attempt in (("a", 1, "00:01:30", 1), ("b", 1, "00:01:30", None), ("c", 2, "00:00:10", 7)):
        start = {"t": f"2027-01-01T{at}Z", "event": "start", "step": None, "rank": rank, "file": name}
        ranks.add(Record.of(start | ({"attempt": attempt} if attempt is not None else {})))
    t0 = Record.of({"t": "2027-01-01T00:00:00Z", "file": "x"}).time
    assert t0 is not None
    groups = ranks.assign(["r0-1", "r0-2"], [1, 2], [t0, t0 + 100])
    assert [[e.file for e in g] for g in groups] == [["a", "c"], ["b"]]  # a: its number; b, c: the nearest start
