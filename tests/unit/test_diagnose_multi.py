"""diagnose on the logs of several ranks or nodes of one job (tests/corpus/diagnose/multi): the initiating event
(which rank or node, what happened to it) and the collateral failures that followed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from preemptible.diagnose import diagnose

CASES = json.loads(
    (Path(__file__).resolve().parent.parent / "corpus" / "diagnose" / "multi" / "cases.json").read_text()
)["cases"]


def test_there_are_ten_or_more_cases_each_sourced() -> None:
    assert len(CASES) >= 10
    for case in CASES:
        assert case["kind"] in ("real", "assembled", "generated")
        assert set(case["sources"]) == set(case["logs"]), case["id"]
        if case["kind"] != "generated":
            assert all(url.startswith("https://") for url in case["sources"].values()), case["id"]
    assert sum(c["kind"] != "generated" for c in CASES) >= 10


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_initiating_event_and_collateral(case: dict[str, Any]) -> None:
    result = diagnose(list(case["logs"].items()))
    expect = case["expect"]
    assert result.verdict == expect["verdict"]
    assert result.initiating is not None
    assert (result.initiating.who, result.initiating.verdict) == (
        expect["initiating"]["who"],
        expect["initiating"]["verdict"],
    ), result.initiating
    got = [(c.who, c.verdict) for c in result.collateral]
    for who, verdict in expect["collateral"]:
        assert (who, verdict) in got, got
    assert (result.initiating.who, result.initiating.verdict) not in got
    doc = result.to_json()
    assert set(doc["initiating"]) >= {"rank", "node", "verdict", "time", "evidence"}
    assert all(set(c) >= {"rank", "node", "verdict", "time", "evidence"} for c in doc["collateral"])


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_collateral_is_in_time_order_where_timestamps_allow(case: dict[str, Any]) -> None:
    result = diagnose(list(case["logs"].items()))
    times = [c.time for c in result.collateral if c.time is not None]
    assert times == sorted(times)
    untimed = [i for i, c in enumerate(result.collateral) if c.time is None]
    assert untimed == list(range(len(result.collateral) - len(untimed), len(result.collateral)))  # untimed last


def test_the_earlier_of_two_causes_on_two_nodes_is_the_initiating_one() -> None:
    """Two logs each hold a cause (real lines of two threads): torchrun received SIGHUP on 09-20, a task died of a
    bus error on 10-27. The earlier one is what started it, in whatever order the logs are given."""
    hup = (
        "W0920 09:10:41.194000 84933 site-packages/torch/distributed/elastic/agent/server/api.py:719] Received 1 "
        "death signal, shutting down workers"
    )
    bus = "srun: error: Orion-18-69: task 289: Bus error"
    bus_cancel = "slurmstepd: error: *** STEP 3495450.0 ON orion-01-04 CANCELLED AT 2021-10-27T20:22:22 ***"
    for logs in ([("a", [bus, bus_cancel]), ("b", [hup])], [("b", [hup]), ("a", [bus, bus_cancel])]):
        result = diagnose(logs)
        assert result.verdict == "terminated"
        assert result.initiating is not None
        assert (result.initiating.who, result.initiating.verdict) == ("log b", "terminated")
        assert [(c.who, c.verdict) for c in result.collateral][:1] == [("node Orion-18-69", "crashed")]


def test_a_rank_whose_log_says_nothing_while_its_peers_lost_it_is_where_it_started() -> None:
    """A stranger's check: rank 1 was SIGKILLed (its log just stops), rank 0 raised gloo's connection reset."""
    rank0 = [
        "rank 0 step 600 loss 0.0038",
        "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:48841: "
        "Connection reset by peer",
    ]
    rank1 = ["preemptible INFO: [rank=1] no checkpoint under ckpt: starting at step 0", "rank 1 step 600 loss 0.0039"]
    found = diagnose([("rank0.err", rank0), ("rank1.err", rank1)])
    assert found.verdict == "killed" and found.competing == "oom"
    first = found.initiating
    assert first is not None and (first.who, first.log, first.verdict) == ("log rank1.err", "rank1.err", "killed")
    assert [c.log for c in found.collateral] == ["rank0.err"]
    # two silent logs: which one went first is not known
    assert diagnose([("rank0.err", rank0), ("rank1.err", rank1), ("rank2.err", rank1)]).initiating is None
    # the silent rank's log names its own end: that is the initiating event
    killed = diagnose([("rank0.err", rank0), ("rank1.err", [*rank1, "Killed"])])
    assert killed.initiating is not None and killed.initiating.log == "rank1.err" and killed.initiating.line == 3
