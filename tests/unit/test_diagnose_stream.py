"""diagnose reads long logs as a stream: bounded memory, only the lines a rule could act on, and the same evidence
as reading every line."""

from __future__ import annotations

import io
import json
import tracemalloc
from pathlib import Path

import pytest

import preemptible.diagnose as diag
import preemptible.diagnose._input as diag_input
from preemptible.diagnose import (
    COLLATERAL_RULES,
    EXIT_RULES,
    RULES,
    LogInput,
    diagnose,
    needles,
    read_log,
    scan_keywords,
    scan_lines,
)

REAL = Path(__file__).resolve().parent.parent / "corpus" / "diagnose" / "real"
CASES = [c for part in ("dev", "test", "holdout") for c in json.loads((REAL / f"{part}.json").read_text())["cases"]]


def _key(evidence: list[diag.Evidence]) -> list[tuple[object, ...]]:
    return [(e.verdict, e.strength, e.line, e.text, e.actor) for e in evidence]


@pytest.mark.parametrize("chunk", [1, 7, 64, diag.SCAN_CHUNK])
def test_streamed_scan_finds_what_reading_every_line_finds(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every real case, read through `LogInput` in chunks of ``chunk`` bytes (lines split across chunks, a chunk
    inside one line), gives the evidence of scanning the full list of lines."""
    monkeypatch.setattr(diag_input, "SCAN_CHUNK", chunk)
    for case in CASES:
        whole = scan_lines(case["log"], "x")
        for end in ("", "\n"):  # the last line unfinished (read at the end of input) or ended like the others
            streamed = scan_lines(LogInput("x", io.BytesIO(("\n".join(case["log"]) + end).encode())), "x")
            assert _key(streamed) == _key(whole), (case["id"], repr(end))


def test_no_rule_matches_a_line_without_one_of_its_needles() -> None:
    """The prefilter (`logrules.needles`) is a necessary condition: on every line of the corpus, a rule that
    matches has one of its needles in the lowercased line, lowercased as the reader lowercases it (bytes: ASCII
    letters only, so a needle of a capitalised Cyrillic word must leave out its first letter)."""
    patterns = [r.pattern for r in (*RULES, *COLLATERAL_RULES)] + [r.pattern for r in EXIT_RULES]
    assert all(needles(p) for p in patterns), [p.pattern for p in patterns if not needles(p)]
    lines = [line for case in CASES for line in case["log"]]
    for pattern in patterns:
        found_in = needles(pattern)
        assert found_in is not None
        for line in lines:
            if pattern.search(line):
                assert any(n.encode() in line.encode().lower() for n in found_in), (pattern.pattern, line)


@pytest.mark.parametrize(
    "line",
    [
        "[2026-11-30 19:05:07,123] [INFO] [trainer.py:123:train] step 4 loss=0.1234 lr=3e-4",
        "Epoch 3/10:  45%|████▌     | 22/49 [09:57<12:00, 26.90s/it, loss=0.61]",
        "iteration 1200/5000 | elapsed time per iteration (ms): 412.3 | learning rate: 3.0E-04 | lm loss: 2.53",
        "=== EPOCH 199/199 ===",
        "Episode 900 | Training step 5000 | update 12/12 | round 3",
    ],
)
def test_the_streamed_reader_skips_ordinary_training_progress(line: str) -> None:
    """What keeps a gigabyte in seconds (`benchmarks/diagnose_speed.py`): a progress line, the bulk of a training
    log, holds none of the scan keywords, so the reader skips it at C speed. A rule whose only needle is a word on
    every such line ("step", "epoch", "iteration") would make every line read one by one (30 times slower)."""
    assert not diag_input.read_alone(line), [k for k in diag_input.scan_keywords() or () if k in line.lower().encode()]


def test_a_log_larger_than_the_memory_bound_is_read_within_it(tmp_path: Path) -> None:
    """32 MiB of log, read end to end (an early crash and a preemption at the end are both found) while Python's
    allocations peak below 24 MiB: chunks, never the whole file."""
    log = tmp_path / "train.log"
    steps = "".join(
        f"[2026-11-30 19:05:{i % 60:02d},123] step {i} loss=0.123 lr=3e-4 tokens/s=12345\n" for i in range(1000)
    )
    with log.open("w") as f:
        f.write('Traceback (most recent call last):\n  File "train.py", line 1, in <module>\nRuntimeError: early\n')
        while f.tell() < 32 << 20:
            f.write(steps)
        f.write("slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2026-11-30T19:06:00 DUE TO PREEMPTION ***\n")
    tracemalloc.start()
    try:
        result = diagnose([read_log(str(log))])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.verdict == "preempted"
    assert [e.line for e in result.evidence if e.verdict == "crashed"] == [3]
    assert peak < 24 << 20 < log.stat().st_size
    assert result.notes == []


def test_a_line_repeated_100000_times_keeps_bounded_evidence() -> None:
    lines = ["srun: error: node1: task 0: Killed"] * 100_000
    evidence = scan_lines(LogInput("x", io.BytesIO(("\n".join(lines)).encode())), "x")
    assert len(evidence) == diag.MAX_EVIDENCE_PER_KIND + 1
    assert evidence[-1].line == 100_000  # the last one is kept


def test_binary_and_non_utf8_input_is_read_not_refused() -> None:
    blob = (
        bytes(range(256)) * 64
        + b"\xff\xfe slurmstepd: error: *** JOB 9 ON n2 CANCELLED AT 2026-11-30T00:00:00 DUE TO PREEMPTION ***\n"
    )
    result = diagnose([LogInput("core", io.BytesIO(blob + b"\x00" * 10_000))])
    assert result.verdict == "preempted"


def test_a_line_longer_than_a_chunk_is_cut_and_the_next_line_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diag_input, "SCAN_CHUNK", 1024)
    blob = b"x" * 100_000 + b" Killed\n" + b"Segmentation fault (core dumped)\n"
    evidence = scan_lines(LogInput("x", io.BytesIO(blob)), "x")
    assert [(e.line, e.verdict) for e in evidence] == [(2, "crashed")]


def test_every_keyword_but_the_terminal_s_ctrl_c_is_found_by_the_vectorised_gate() -> None:
    """A keyword shorter than 4 bytes costs a `bytes.find` pass over every chunk (the gate hashes 4-byte windows):
    three such ("got", "job", "run") made a 1 GiB log take 8.6 s instead of 6.2 s. A rule's needles must be 4 bytes
    or more; only the terminal's echo of Ctrl-C ("^C") is shorter."""
    assert [k for k in scan_keywords() if len(k) < 4] == [b"^c"]


TIME_LIMIT = b"slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***\n"


@pytest.mark.parametrize("chunk", [1, 7, 64, diag.SCAN_CHUNK])
def test_a_progress_bar_s_carriage_returns_and_a_file_system_s_nul_padding_end_lines(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tqdm redraws its line with "\\r" and never ends it: a scheduler's message written after 200 redraws (14 KB, past
    `MAX_LINE_CHARS`) is its own line, as a terminal shows it; so is one after NULs a crashed node left in the file.
    A CRLF log keeps its line numbers, even where a chunk ends between the "\\r" and the "\\n"."""
    monkeypatch.setattr(diag_input, "SCAN_CHUNK", chunk)
    bar = b"".join(b"Epoch 1:  45%%|####5     | %d/1000 [00:10<00:12, 9.1it/s]\r" % i for i in range(200))
    assert diagnose([LogInput("bar", io.BytesIO(b"step 1\n" + bar + TIME_LIMIT))]).verdict == "time-limit"
    padded = b"step 1 loss 2.0\n" + b"\x00" * 70_000 + TIME_LIMIT
    assert diagnose([LogInput("nul", io.BytesIO(padded))]).verdict == "time-limit"
    crlf = b"step 1\r\nstep 2\r\nKilled\r\n"
    assert [(e.line, e.text) for e in scan_lines(LogInput("crlf", io.BytesIO(crlf)), "crlf")] == [(3, "Killed")]


@pytest.mark.parametrize("chunk", [1, 7, diag.SCAN_CHUNK])
def test_a_utf16_log_is_decoded_and_an_empty_binary_or_compressed_one_says_so(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(diag_input, "SCAN_CHUNK", chunk)
    text = "step 1 loss 2.0\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    for encoding in ("utf-16", "utf-16-be"):
        data = text.encode(encoding) if encoding == "utf-16" else b"\xfe\xff" + text.encode(encoding)
        found = diagnose([LogInput("ps.log", io.BytesIO(data))])  # PowerShell's redirection writes UTF-16
        assert (found.verdict, found.notes) == ("oom", []), encoding
    empty = diagnose([LogInput("e.log", io.BytesIO(b""))])
    assert empty.verdict == "unknown" and empty.notes == ["e.log: empty (0 bytes); expected the text of a log"]
    elf = diagnose([LogInput("a.out", io.BytesIO(b"\x7fELF\x02\x01\x01" + bytes(range(64)) * 8))])
    assert elf.notes == ["a.out: binary (control bytes, not text); expected the text of a log"]
    import gzip

    packed = diagnose([LogInput("j.log.gz", io.BytesIO(gzip.compress(TIME_LIMIT)))])
    assert packed.verdict == "unknown" and packed.notes == [
        "j.log.gz: gzip-compressed, not read; expected a text log: decompress it first "
        "(zcat j.log.gz | preemptible diagnose -)"
    ]
    assert diagnose([LogInput("ok.log", io.BytesIO(TIME_LIMIT))]).notes == []


@pytest.mark.parametrize("chunk", [1, 7, diag.SCAN_CHUNK])
def test_a_timeout_inside_a_collective_is_read_from_the_stream_too(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collective's frame has no rule's keyword but "distributed": the streamed reader must keep it."""
    monkeypatch.setattr(diag_input, "SCAN_CHUNK", chunk)
    log = (
        b"step 1 loss 2.0\n"
        b'  File "train_dist.py", line 171, in pad_data\n'
        b"    dist.all_reduce(num_nodes, dist.ReduceOp.MAX)\n"
        b'  File "/opt/conda/lib/python3.8/site-packages/torch/distributed/distributed_c10d.py", line 1285, in '
        b"all_reduce\n"
        b"    work = default_pg.allreduce([tensor], opts)\n"
        b"RuntimeError: Socket Timeout\n"
    )
    assert diagnose([LogInput("dgl", io.BytesIO(log))]).verdict == "collective-timeout"
