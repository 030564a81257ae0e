"""How often ``preemptible diagnose`` reaches the verdict a real log's own thread establishes.

Reads the sourced corpus (tests/corpus/diagnose/real/{dev,test,holdout}.json: real excerpts, each with its source
and the thread's verdict) and prints the accuracy of each part, per verdict, with the misses. Each part's ``about``
says what it was used for: the rules were tuned on dev; holdout was gathered after tuning and scored once, fresh.
tests/unit/test_diagnose_real.py keeps every part at or above its recorded score.

    python benchmarks/diagnose_corpus.py [--part dev|test|holdout|all] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REAL = Path(__file__).resolve().parent.parent / "tests" / "corpus" / "diagnose" / "real"


def load(part: str) -> list[dict[str, Any]]:
    parts = ("dev", "test", "holdout") if part == "all" else (part,)
    cases: list[dict[str, Any]] = []
    for name in parts:
        cases += json.loads((REAL / f"{name}.json").read_text())["cases"]
    return cases


def judge(case: dict[str, Any]) -> str:
    from preemptible.diagnose import diagnose

    return diagnose([(case["id"], case["log"])], exit_code=case.get("exit_code")).verdict


def score(cases: list[dict[str, Any]]) -> dict[str, Any]:
    right: Counter[str] = Counter()
    total: Counter[str] = Counter()
    misses = []
    for case in cases:
        got = judge(case)
        total[case["verdict"]] += 1
        if got == case["verdict"]:
            right[case["verdict"]] += 1
        else:
            misses.append({"id": case["id"], "expected": case["verdict"], "got": got, "source": case["source"]})
    return {
        "cases": len(cases),
        "right": sum(right.values()),
        "accuracy": sum(right.values()) / len(cases) if cases else 0.0,
        "per_verdict": {v: f"{right[v]}/{total[v]}" for v in sorted(total)},
        "misses": misses,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("dev", "test", "holdout", "all"), default="all")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    parts = ("dev", "test", "holdout") if args.part == "all" else (args.part,)
    report = {name: score(load(name)) for name in parts}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for name, r in report.items():
        print(f"{name}: {r['right']}/{r['cases']} = {r['accuracy']:.1%}")
        print("  per verdict: " + ", ".join(f"{v} {s}" for v, s in r["per_verdict"].items()))
        for m in r["misses"]:
            print(f"  miss {m['id']}: expected {m['expected']}, got {m['got']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
