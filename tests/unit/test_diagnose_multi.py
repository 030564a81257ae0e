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
