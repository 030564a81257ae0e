"""How often ``preemptible diagnose`` reaches the verdict a real log's own thread establishes.

Reads the sourced corpus (tests/corpus/diagnose/real/{dev,test,...,test4,fresh4}.json: real excerpts, each
with its source and the thread's verdict) and prints the accuracy of each part, per verdict, with the misses, and
the calibration of the confidence each verdict carries: of the verdicts at 0.8 or more, the fraction right, and the
same for each confidence value. Each part's ``about`` says what it was used for: the rules were tuned on dev (and,
from issue 55's second round, on the spent test and fresh; from its third, on the spent test2, fresh2 and holdout;
from its fourth, on the spent test3 and fresh3, then test4 and fresh4); test2, test3 and test4 were looked at twice;
holdout, fresh, fresh2, fresh3, fresh4 and fresh5 were gathered blind and scored once when fresh.
tests/unit/test_diagnose_real.py keeps every part at or above its recorded score.

``--reader FILE`` (tests/corpus/diagnose/reader/*.json: a blind reader's verdicts on some parts' excerpts, from
the log lines alone) compares diagnose with that reader on the same cases: each one's accuracy, and the cases only
one of them reads right.

    python benchmarks/diagnose_corpus.py [--part dev|test|...|fresh4|fresh5|all] [--json]
    python benchmarks/diagnose_corpus.py --reader tests/corpus/diagnose/reader/test3-fresh3.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REAL = Path(__file__).resolve().parent.parent / "tests" / "corpus" / "diagnose" / "real"


PARTS = (
    "dev",
    "test",
    "holdout",
    "fresh",
    "test2",
    "fresh2",
    "test3",
    "fresh3",
    "test4",
    "fresh4",
    "fresh5",
    "test5",
    "fresh6",
    "fresh7",
    "test6",
    "fresh8",
    "fresh9",
    "fresh10",
    "fresh11",
    "fresh12",
    "fresh13",
    "fresh14",
    "fresh15",
    "fresh16",
    "fresh17",
    "fresh18",
    "fresh19",
)


def load(part: str) -> list[dict[str, Any]]:
    parts = [p for p in PARTS if (REAL / f"{p}.json").exists()] if part == "all" else [part]
    cases: list[dict[str, Any]] = []
    for name in parts:
        cases += json.loads((REAL / f"{name}.json").read_text())["cases"]
    return cases


def judge(case: dict[str, Any]) -> tuple[str, float, str | None]:
    """The verdict, its confidence and the competing verdict (for unknown: the most likely cause)."""
    from preemptible.diagnose import diagnose

    result = diagnose([(case["id"], case["log"])], exit_code=case.get("exit_code"))
    return result.verdict, result.confidence, result.competing


CONFIDENT = 0.8


def score(cases: list[dict[str, Any]]) -> dict[str, Any]:
    right: Counter[str] = Counter()
    total: Counter[str] = Counter()
    by_confidence: dict[float, list[int]] = {}
    misses = []
    for case in cases:
        got, confidence, competing = judge(case)
        total[case["verdict"]] += 1
        ok = got == case["verdict"]
        right[case["verdict"]] += ok
        by_confidence.setdefault(confidence, [0, 0])[ok] += 1
        if not ok:
            misses.append({
                "id": case["id"], "expected": case["verdict"], "got": got, "confidence": confidence,
                "competing": competing, "source": case["source"],
            })  # fmt: skip
    confident = [n for c, n in by_confidence.items() if c >= CONFIDENT]
    return {
        "cases": len(cases),
        "right": sum(right.values()),
        "accuracy": sum(right.values()) / len(cases) if cases else 0.0,
        "per_verdict": {v: f"{right[v]}/{total[v]}" for v in sorted(total)},
        "calibration": {
            "confident": sum(sum(n) for n in confident),
            "confident_right": sum(n[1] for n in confident),
            "per_confidence": {f"{c:.2f}": f"{n[1]}/{sum(n)}" for c, n in sorted(by_confidence.items())},
        },
        "misses": misses,
    }


def against_reader(path: Path) -> dict[str, Any]:
    """Diagnose and a blind reader on the same cases: how often each is right, and where only one is."""
    try:
        doc = json.loads(path.read_text())
        parts, answers = list(doc["parts"]), list(doc["answers"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(
            f"{path}: expected a blind reader's answers (JSON with 'parts' and 'answers', as in "
            f"tests/corpus/diagnose/reader/), found {type(e).__name__}: {e}; pass one of those files"
        ) from None
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"{path}: parts {unknown} are not corpus parts (expected some of {list(PARTS)})")
    doc = {"parts": parts, "answers": answers}
    cases = {case["id"]: case for part in parts for case in load(part)}
    missing = [a["id"] for a in doc["answers"] if a["id"] not in cases]
    if missing:
        raise SystemExit(f"{path}: answers for cases the parts {doc['parts']} do not hold: {missing[:5]}")
    rows = []
    for answer in doc["answers"]:
        case = cases[answer["id"]]
        got = judge(case)[0]
        rows.append((answer["id"], case["verdict"], got, answer["verdict"], answer.get("second")))
    n = len(rows)
    return {
        "cases": n,
        "diagnose_right": sum(got == truth for _, truth, got, _, _ in rows),
        "reader_right": sum(read == truth for _, truth, _, read, _ in rows),
        "reader_or_second_right": sum(truth in (read, second) for _, truth, _, read, second in rows),
        "only_reader": [(i, truth, got) for i, truth, got, read, _ in rows if read == truth != got],
        "only_diagnose": [(i, truth, read) for i, truth, got, read, _ in rows if got == truth != read],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=(*PARTS, "all"), default="all")
    p.add_argument("--reader", type=Path, help="a blind reader's verdicts (tests/corpus/diagnose/reader/*.json)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.reader is not None:
        cmp = against_reader(args.reader)
        if args.json:
            print(json.dumps(cmp, indent=2))
            return 0
        n = cmp["cases"]
        print(f"{n} cases: diagnose {cmp['diagnose_right']}/{n}, the reader {cmp['reader_right']}/{n} (its first or "
              f"second guess: {cmp['reader_or_second_right']}/{n})")  # fmt: skip
        for i, truth, got in cmp["only_reader"]:
            print(f"  only the reader: {i}: {truth} (diagnose: {got})")
        for i, truth, read in cmp["only_diagnose"]:
            print(f"  only diagnose: {i}: {truth} (the reader: {read})")
        return 0
    parts = [n for n in PARTS if (REAL / f"{n}.json").exists()] if args.part == "all" else [args.part]
    report = {name: score(load(name)) for name in parts}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for name, r in report.items():
        print(f"{name}: {r['right']}/{r['cases']} = {r['accuracy']:.1%}")
        print("  per verdict: " + ", ".join(f"{v} {s}" for v, s in r["per_verdict"].items()))
        cal = r["calibration"]
        share = cal["confident_right"] / cal["confident"] if cal["confident"] else 0.0
        print(f"  confidence >= {CONFIDENT}: {cal['confident_right']}/{cal['confident']} right ({share:.1%}); per "
              "confidence: " + ", ".join(f"{c} {n}" for c, n in cal["per_confidence"].items()))  # fmt: skip
        for m in r["misses"]:
            print(f"  miss {m['id']}: expected {m['expected']}, got {m['got']} ({m['confidence']:.2f}, "
                  f"else {m['competing']})")  # fmt: skip
    return 0


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    sys.exit(recorded(main, "diagnose-corpus"))
