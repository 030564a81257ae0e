"""The diagnose rules against the sourced corpus of real logs (tests/corpus/diagnose/real): each part must stay at or
above the accuracy recorded for it. A rule change that loses real cases fails here, whatever it gains elsewhere.

The floors are what each part scored when the rules last changed (see the parts' ``about``).

Issue 55, first round: batch 2 (169 excerpts) was split before tuning, 101 to dev and 68 to test; the test part was
looked at twice: 94/129 (72.9%) before any tuning on batch 2, 101/129 (78.3%) after. The part ``fresh`` (37 excerpts
gathered blind after the rules were frozen) was scored once: 23/37 (62.2%).

Issue 55, second round: test and fresh, spent, became tuning material like dev (their floors are today's scores, no
longer measurements). Batch 4 (89 excerpts gathered blind) was split before anyone looked, per verdict by sha256(id):
33 to dev, 30 to ``test2``, 26 to ``fresh2``; batches 5, 6 and 7 (160 more, gathered blind) went to dev. The part
``test2`` was looked at twice: 21/30 (70.0%) at 0b8f731, 24/30 (80.0%) at c7de135; ``fresh2`` was scored once, at
c7de135 after the last rule change: 17/26 (65.4%). Both are below the issue's 90% bar; neither has been tuned on.

Issue 55, third round: test2, fresh2 and holdout, spent (each looked at more than the issue allows), became tuning
material like dev. Batches 8 and 9 (84 excerpts gathered blind by four helpers) were split before anyone looked, per
verdict by sha256(id): 21 to dev, 33 to ``test3``, 30 to ``fresh3``. The part ``test3`` was looked at, first at
f6c4081 (before any tuning on batches 8 and 9): 23/33 (69.7%); then, by a slip, once more while tuning on dev, in
the working tree after 1e11ad3 (with the next commit's OOM-in-other-languages, LSF, Airflow and AWS Batch rules, and a
shared-memory rule since dropped): 23/33 again. That was its second and last look: it is spent. Batch 10 (59 more
excerpts, gathered blind after that) was split the same way: 22 to dev, 37 to ``fresh3``; batch 11 (13, gathered
blind last) went to ``fresh3`` whole (80 in all). ``fresh3`` was
scored once, at ddc8b59 after the round's last rule change: 55/80 (68.8%); of its verdicts at 0.8 or more, 36/43
right (83.7%). Both are below the issue's 90% bar. Spent by that score, it was then tuned on like the others
(its floor, 57, is today's score).

Issue 55, fourth round: test3 and fresh3, spent, became tuning material. A blind reader (a helper given only their
log lines and the verdict definitions) read them: 98/113 (86.7%) right, where diagnose had read 78/113 at their looks;
what the reader read right and the rules did not became rules (768e9de). Batch 12 (35 excerpts gathered blind by
three helpers) was split before anyone looked, per verdict by sha256(id): 14 to ``test4``, 21 to ``fresh4``; batch
13 (12, gathered blind after) went to ``fresh4`` whole (33 in all). ``test4`` was looked at twice, at 768e9de (5/14)
and at 7e58190 (5/14); ``fresh4`` was scored once, at 7e58190 after the round's last rule change: 13/33 (39.4%); of
its verdicts at 0.8 or more, 12/12 right. A blind reader read the same excerpts: test4 9/14, fresh4 27/33 (81.8%),
all 23 of its confident ones right (tests/corpus/diagnose/reader/). Both parts, spent, were then tuned on (their
floors are today's scores). Batch 14 (4 excerpts, gathered blind last: the gatherers found little the corpus did not
already cite) went to ``fresh5`` whole, scored once at 12dd54c: 3/4, too few to measure a rate.

Issue 55, fifth round: batch 15 (64 excerpts gathered blind by two helpers: O, documentation and troubleshooting files
in public repositories; P, data-processing and orchestration platforms) was split before anyone looked, per verdict
by sha256(id): 16 to dev, 21 to ``test5``, 27 to ``fresh6`` (kept unread, `UNSCORED`). ``test5``'s first look, at
c182ce6 before any tuning on batch 15: 12/21 (57.1%); of its verdicts at 0.8 or more, 9/10 right. The calibration
check then reported 9/11 after the rules from platforms' documented words (not tuned on test5; recorded as it fell).
Its second and last look, at 1b70128 after the round's last rule change: 12/21 (57.1%), 9/11 confident right.
``fresh6`` was scored once, at 1b70128: 17/27 (63.0%); of its verdicts at 0.8 or more, 12/13 right. A blind reader
(tests/corpus/diagnose/reader/test5-fresh6.json, read before either was scored) read test5 19/21 and fresh6 22/27
(81.5%), all 27 of its confident verdicts right. Both parts, spent, were then tuned on: their floors are today's
scores (test5 17/21, fresh6 22/27), no longer measurements.
Batch 19 (23 excerpts gathered blind after test5 and fresh6 were scored: AA, 2025-2026 training threads found by the
users' words; BB, multi-node and multi-GPU endings; the search tools' budget ran out during it) went to ``fresh7``
whole, kept unread, and was scored once at 8b7415c (rules as at 058519b, the round's last rule change): 14/23 (60.9%);
of its verdicts at 0.8 or more, 11/12 right. A blind reader (tests/corpus/diagnose/reader/fresh7.json, read before it
was scored) read it 20/23 (87.0%), its 8 confident verdicts all right.
Spent, it was then tuned on (its floor, 19, is today's score).

Issue 55, sixth round: batch 20 (gathered blind by three helpers) and batch 21 (two more, gathered after batch 20 was
scored), each committed before diagnose was run on it. Pool CC (containers, cloud batch services, CI runners; 31
excerpts) went to ``test6``, looked at once at 566b491 before any tuning: 16/31 (51.6%), its 11 confident verdicts all
right; it was then tuned on (containers' and CI's documented words), so it has no second look: spent. Pools DD (other
locales, desktops, 2022-2024 training threads; 23) and EE (2018-2021 training threads, HPC and science trackers; 15)
went to ``fresh8``, scored once at 35b3120 (rules as at 1e50c0a): 23/38 (60.5%), 17/19 confident right. Pools FF (LLM
post-training threads; 10) and GG (HPC centres' documentation sources, committed job logs, course write-ups; 25) went
to ``fresh9``, scored once at 07fa13c (rules as at a756d2c, the last change before it): 24/35 (68.6%), 19/20
confident right. A blind reader (tests/corpus/diagnose/reader/) read test6 29/31 (after diagnose's first look),
fresh8 34/38 (89.5%) and fresh9 33/35 (94.3%), each before diagnose scored it. All three, spent, were then tuned on:
their floors are today's scores.
Batch 22 (27 excerpts gathered blind after fresh9 was scored: HH, Q&A and forum threads; JJ, GPU cluster and job
tooling threads) went to ``fresh10`` whole, scored once at 15b64e5 (rules as at be2cc0a): 13/27 (48.1%), 10/12
confident right; a blind reader read it 21/27 (77.8%). Spent, it was then tuned on (its floor, 18, is today's score).
Batch 23 (24 excerpts gathered blind after fresh10 was scored: LL, image, video and robotics trainers; MM, speech,
audio and vision toolkits and training wrappers) went to ``fresh11`` whole, scored once at 682bd90 (rules as at
83f3cc7): 16/24 (66.7%), 12/15 confident right; a blind reader read it 23/24 (95.8%). Six of its eight misses are
a SIGKILL the rules read as ``killed`` and the thread found was memory; reading every reported SIGKILL as ``oom`` would
gain 27 cases over the corpus and lose 37, so the verdict stays, but a SIGKILL a launcher reports (torchrun's root
cause) no longer carries a strong verdict's confidence: its sender is unnamed, right 19 times in 26 as ``killed``.
``CALIBRATED`` for dev, test and holdout is recorded after that change (their confident killed verdicts, mostly right,
dropped below 0.8).
Batch 24 (39 excerpts gathered blind after the round's last rule change: NN, classical ML, AutoML and data-science
jobs; OO, JAX and TPU, large-embedding and graph training) went to ``fresh12`` whole, scored once at 9f401ad with the
rules as they were to land (be2b70f): 19/39 (48.7%), 16/20 confident right; a blind reader read it 33/39 (84.6%).
Spent, it was then tuned on (its floor, 29, is today's score).
Batch 16 (53 excerpts gathered blind by two more helpers: S, reinforcement learning, robotics and model serving; T,
bioinformatics, chemistry and physics pipelines) went to dev whole, for tuning; before any tuning on it (at 1725c28)
diagnose read 29/53 of it (54.7%), a measure of the rules on logs they had never seen, taken once.
Batch 17 (17 excerpts gathered blind: V, managed and rented GPU platforms and notebooks; X, community forums) went to
dev whole; before any tuning on it (at 0929479) diagnose read 6/17 of it.
Batch 18 (28 excerpts gathered blind: Y, hyperparameter search, federated, recommendation and graph training; Z,
scientific ML and academic pretraining) went to dev whole; before any tuning on it (at 13fe3fe) diagnose read 14/28.

Issue 55, seventh round: one convention for a SIGKILL. The label is the thread's own verdict: six cases of the first
parts (dev llama-856-exitcode-9, hedwig-70-killed-after-progress, deepspeed-3232-return-code-9; holdout
raisf-11-exitcode-9; test colossalai-3514-exitcode-9, rlvigen-17-dataloader-killed), whose own ``why`` records that
the thread found memory, were relabelled from ``killed`` (what the log alone supports) to ``oom``. And a SIGKILL that
names no sender (torchrun's ``exitcode: -9``, exit 137, ``signal 9``, a tool's ``error code -9``) is now read as the
shell's bare ``Killed`` was already: the OOM killer's, at 0.6, with ``killed`` competing. Over the parts gathered
under the issue's brief (fresh to fresh12, test2 to test6) that reading is right 19 times in 27 and the old one 8;
over the first parts (dev, test, holdout), whose gatherers labelled an unexplained SIGKILL ``killed``, 11 in 35.
Over all parts it loses 2 cases net (1004 to 1002 of 1242): dev 460 to 454, test 113 to 105, holdout 20 to 19,
test2 26 to 24, test5 17 to 16; fresh 27 to 30, fresh3 63 to 67, fresh4 25 to 26, fresh6 22 to 23, fresh9 30 to 31,
fresh11 16 to 22. The floors below are those scores.
Batch 25 (61 excerpts gathered blind by four helpers: PP, training outside PyTorch; QQ, LLM fine-tuning toolkits and
local runners; RR, pages that are not GitHub issues (CI runs, hosted apps' status pages, hosted job logs, FAQ pages);
SS, reinforcement-learning and simulation training, and ML pipeline tools) went to ``fresh13`` whole, committed unread,
read by a blind reader (tests/corpus/diagnose/reader/fresh13.json) and then scored once at 38eae1e (rules as at
e6ae4e9, the round's last rule change before it): 45/61 (73.8%), 26/27 confident right; the reader read it 53/61
(86.9%). The rules of e6ae4e9's predecessor (fec6bc2) read it 45/61 too: none of its cases turns on the SIGKILL
convention. Spent, it was then tuned on (its floor, 56, is today's score).
Batch 26 (10 excerpts gathered blind after that tuning (221a17a): TT, computer-vision training; VV, Kubernetes and
cluster job operators; the gatherers found little the corpus did not already cite) went to ``fresh14`` whole,
committed unread, read by a blind reader (7/10) and scored once at 3a9372c (rules as at 221a17a): 2/10, 1/2 confident
right; too few for a rate. Spent, it was then tuned on (its floor, 7, is today's score).
Batch 27 (15 excerpts gathered blind after the round's last rule change, d278f37: WW, job logs and status pages that
are not issue threads, most of them committed LSF job reports; XX, documentation pages, which gave two) went to
``fresh15`` whole, committed unread, read by a blind reader (14/15) and scored once at 43f32b2 (rules as at d278f37):
12/15, 11/12 confident right. It was not tuned on that round (12 measured the rules as they landed); the
next round read a CI runner's own "Job succeeded" line and LSF's record of a bkill in it (its floor now 14).
Batch 28 (22 excerpts gathered blind after the eighth round's only rule change, c61308b: YY, the launchers and
platforms with few excerpts, which gave four, none of them from those platforms; ZZ, other locales, Windows and macOS)
went to ``fresh16`` whole, committed unread, read by a blind reader (18/22; tests/corpus/diagnose/reader/fresh16.json)
and scored once at aca5b59 (rules as at c61308b): 15/22 (68.2%), 12/12 confident right. Spent, it was then tuned on
(macOS's code-signing SIGKILL in its crash report's and kernel's words, zsh's job lines): its floor, 17, is today's.
Batch 29 (19 excerpts gathered blind after the round's rule changes, as they landed at 0cdf376: AA, scientific batch
jobs on HPC schedulers; BB, Q&A pages outside GitHub, which gave two) went to ``fresh17`` whole, committed unread, read
by a blind reader (17/19; tests/corpus/diagnose/reader/fresh17.json) and scored once at d7414ae (rules as they landed):
15/19 (78.9%), 13/13 confident right. Spent, it was then tuned on (an exit status in "Exit status is 0" words): its
floor, 16, is today's.
Batch 30 (16 excerpts gathered blind after the round's rule changes, as they landed at a0661f0: DD, speech, graph and
tabular training, which gave four; EE, workflow and ML-platform tools and managed training services) went to
``fresh18`` whole, committed unread, read by a blind reader (15/16; tests/corpus/diagnose/reader/fresh18.json) and
scored once at e1b8d30 (rules as they landed): 14/16 (87.5%), 11/11 confident right. Spent, it was then tuned on
(Katib's experiment succeeded): its floor, 15, is today's.
Batch 31 (36 excerpts gathered blind after the round's rule changes, as they landed at 77fa335: HH, model serving and
batch inference; II, data-processing and ETL jobs) went to ``fresh19`` whole, committed unread, read by a blind reader
(28/36; tests/corpus/diagnose/reader/fresh19.json) and scored once at 63f2804 (rules as they landed): 17/36 (47.2%),
10/12 confident right. Spent, it was then tuned on (Dask's and HTTP's closed streams as a lost peer's consequence, the
kernel's OOM task table, kubectl's pod deleted, Dask's scheduler-close, Triton's failed start, Dataflow's DONE,
Prefect's flow Completed, a supervisor's "Sent SIGTERM to process"): its floor, 27, is today's.

The confidence each verdict carries must mean what it says: over all parts, of the verdicts at 0.8 or more, at least
90% are right (447/480, 93.1%, at ddc8b59; 449/481 after), and no part falls below the fraction recorded for it
(`CALIBRATED`: today's; when each was measured: test2 15/17 at its second look, fresh2 15/17 and fresh3 36/43 when
scored, test3 17/17 at its first look, test4 2/5 at its first, fresh4 12/12 when scored).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from preemptible.diagnose import VERDICTS, diagnose

REAL = Path(__file__).resolve().parent.parent / "corpus" / "diagnose" / "real"
FLOORS = {"dev": 457, "test": 105, "holdout": 19, "fresh": 30, "test2": 24, "fresh2": 20, "test3": 31, "fresh3": 68,
          "test4": 8, "fresh4": 26, "fresh5": 3, "test5": 16, "fresh6": 23, "fresh7": 19, "test6": 24, "fresh8": 33,
          "fresh9": 31, "fresh10": 18, "fresh11": 22, "fresh12": 31, "fresh13": 56, "fresh14": 7,
          "fresh15": 14, "fresh16": 17, "fresh17": 16,
          "fresh18": 15, "fresh19": 27}  # fmt: skip
UNSCORED: tuple[str, ...] = ()
"""Parts gathered, split and kept unread: scored once, after the round's last rule change (none now)."""
CONFIDENT, CONFIDENT_RIGHT = 0.8, 0.9
CALIBRATED = {"dev": (306, 331), "test": (70, 75), "holdout": (16, 16), "fresh": (18, 19), "test2": (15, 15),
              "fresh2": (15, 16), "test3": (21, 21), "fresh3": (41, 45), "test4": (3, 6),
              "fresh4": (21, 21), "fresh5": (3, 3), "test5": (12, 13),
              "fresh6": (16, 17), "fresh7": (12, 13), "test6": (13, 13), "fresh8": (25, 27),
              "fresh9": (24, 25), "fresh10": (15, 17), "fresh11": (12, 13),
              "fresh12": (23, 23), "fresh13": (35, 35), "fresh14": (3, 3), "fresh15": (12, 12),
              "fresh16": (13, 13), "fresh17": (13, 13),
              "fresh18": (12, 12), "fresh19": (16, 16)}  # fmt: skip
"""Per part: of the verdicts at `CONFIDENT` or more, how many were right when the rules last changed."""


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


def _confident(part: str) -> list[bool]:
    """For each verdict at `CONFIDENT` or more in ``part``: whether it was right."""
    return [
        result.verdict == case["verdict"]
        for case in _cases(part)
        for result in [diagnose([(case["id"], case["log"])], exit_code=case.get("exit_code"))]
        if result.confidence >= CONFIDENT
    ]


def test_a_confident_verdict_is_right_nine_times_in_ten() -> None:
    confident = [ok for part in FLOORS for ok in _confident(part)]
    assert confident and sum(confident) >= CONFIDENT_RIGHT * len(confident), (sum(confident), len(confident))


@pytest.mark.parametrize("part", sorted(FLOORS))
def test_no_part_s_confident_verdicts_are_right_less_often_than_recorded(part: str) -> None:
    confident = _confident(part)
    right, of = CALIBRATED[part]
    assert confident and sum(confident) * of >= right * len(confident), (part, sum(confident), len(confident))


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
    for part in (*FLOORS, *UNSCORED):
        for case in _cases(part):
            assert case["id"] not in seen, case["id"]
            seen.add(case["id"])
            assert case["verdict"] in VERDICTS, case["id"]
            assert case["source"].startswith(("https://", "http://")), case["id"]
            sources[case["source"]] = sources.get(case["source"], 0) + 1
            assert sources[case["source"]] <= 3, case["source"]
            assert case["why"].strip() and case["log"], case["id"]
            per_part.setdefault(part, set()).add(case["verdict"])
            total += 1
            look_alikes += bool(case["look_alike"])
    assert total >= 400 and look_alikes * 3 >= total
    for part in ("dev", "test"):
        assert set(VERDICTS) - {"unknown"} <= per_part[part], part


def test_a_blind_reader_s_answers_name_the_cases_of_their_parts_once_each() -> None:
    """tests/corpus/diagnose/reader/: a blind reader's verdicts (benchmarks/diagnose_corpus.py --reader compares
    them with diagnose); each answers every case of its parts once, with a known verdict."""
    files = sorted((REAL.parent / "reader").glob("*.json"))
    assert files
    for path in files:
        doc = json.loads(path.read_text())
        ids = sorted(case["id"] for part in doc["parts"] for case in _cases(part))
        answers = doc["answers"]
        assert sorted(a["id"] for a in answers) == ids, path.name
        assert all(a["verdict"] in VERDICTS and 0 <= a["confidence"] <= 1 for a in answers), path.name
