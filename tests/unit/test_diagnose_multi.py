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
        assert case["kind"] in ("real", "assembled")
        assert set(case["sources"]) == set(case["logs"]), case["id"]
        assert all(url.startswith("https://") for url in case["sources"].values()), case["id"]


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
