"""The diagnose rules against the sourced corpus of real logs (tests/corpus/diagnose/real): each part must stay at or
above the accuracy recorded for it. A rule change that loses real cases fails here, whatever it gains elsewhere.

The floors are what each part scored when the rules last changed (see the parts' ``about``). Before issue 55: the
test part 58/61, the dev part 116/119, the second held-out part 19/21 when fresh (never tuned on). Issue 55 added
batch 2 (169 excerpts, split before tuning: 101 to dev, 68 to test) and the verdict ``interrupted``; the test part
was looked at twice, as the issue allows: 94/129 (72.9%) before any tuning on batch 2, 101/129 (78.3%) after
(below the issue's 90% bar: not tuned on since). The dev part is at 198/220. The part ``fresh`` (37 excerpts
gathered blind after the rules were frozen) was scored once: 23/37 (62.2%); its misses are listed in issue 55's
closing note, and it has not been tuned on.

The confidence each verdict carries must mean what it says: on every part, of the verdicts at 0.8 or more, at least
90% are right (dev 97%, test 93% at the second look, holdout 100%, fresh 15/16 when scored).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from preemptible.diagnose import VERDICTS, diagnose

REAL = Path(__file__).resolve().parent.parent / "corpus" / "diagnose" / "real"
FLOORS = {"dev": 198, "test": 101, "holdout": 19, "fresh": 23}
CONFIDENT, CONFIDENT_RIGHT = 0.8, 0.9


def _cases(part: str) -> list[dict[str, Any]]:
    doc = json.loads((REAL / f"{part}.json").read_text())
    assert doc["part"] == part
    return list(doc["cases"])


def _misses(cases: list[dict[str, Any]]) -> list[str]:
    misses = []
    for case in cases:
        got = diagnose([(case["id"], case["log"])], exit_code=case.get("exit_code")).verdict
        if got != case["verdict"]:
            misses.append(f"{case['id']}: expected {case['verdict']}, got {got} ({case['source']})")
    return misses


@pytest.mark.parametrize("part", sorted(FLOORS))
def test_a_confident_verdict_is_right_nine_times_in_ten(part: str) -> None:
    confident = [
        (result.verdict == case["verdict"], case["id"])
        for case in _cases(part)
        for result in [diagnose([(case["id"], case["log"])], exit_code=case.get("exit_code"))]
        if result.confidence >= CONFIDENT
    ]
    right = sum(ok for ok, _ in confident)
    assert confident and right >= CONFIDENT_RIGHT * len(confident), (part, right, len(confident))


@pytest.mark.parametrize("part", sorted(FLOORS))
def test_part_stays_at_or_above_its_recorded_accuracy(part: str) -> None:
    cases = _cases(part)
    misses = _misses(cases)
    right = len(cases) - len(misses)
    assert right >= FLOORS[part], f"{part}: {right}/{len(cases)} right, floor {FLOORS[part]}; misses:\n" + "\n".join(
        misses
    )


def test_corpus_is_well_formed() -> None:
    """Every case has a source, a reason and a known verdict; ids are unique across parts; no source gives more than
    3 excerpts; the split holds at least 400 excerpts, a third of them look-alikes, and every verdict but 'unknown'
    in both dev and test."""
    seen: set[str] = set()
    sources: dict[str, int] = {}
    total = look_alikes = 0
    per_part: dict[str, set[str]] = {}
    for part in FLOORS:
        for case in _cases(part):
            assert case["id"] not in seen, case["id"]
            seen.add(case["id"])
            assert case["verdict"] in VERDICTS, case["id"]
            assert case["source"].startswith("https://"), case["id"]
            sources[case["source"]] = sources.get(case["source"], 0) + 1
            assert sources[case["source"]] <= 3, case["source"]
            assert case["why"].strip() and case["log"], case["id"]
            per_part.setdefault(part, set()).add(case["verdict"])
            total += 1
            look_alikes += bool(case["look_alike"])
    assert total >= 400 and look_alikes * 3 >= total
    for part in ("dev", "test"):
        assert set(VERDICTS) - {"unknown"} <= per_part[part], part
