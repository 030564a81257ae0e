"""Issue 50 items 5, 10, 11 and 12: `report` and `run.log` against hostile journals and paths.

A journal value never becomes markup (item 5); nothing a user logs ends training or breaks `report` (item 10);
every failure to read or write is one line and a non-zero exit, and "wrote X" means X was written (item 11); the
journal is read in bounded memory, whatever its length (item 12).
"""

from __future__ import annotations

import json
import os
import socket
import tracemalloc
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from preemptible.cli import main

EVIL = "<script>alert(1)</script>\"'</svg>--><b x=y>"
JOURNAL = "20260101T000000.000000Z-r0.jsonl"


class Structure(HTMLParser):
    """The (tag, attribute names) a page holds, and whether any text would run as a script."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: set[tuple[str, tuple[str, ...]]] = set()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.shapes.add((tag, tuple(sorted(k for k, _ in attrs))))
        self.tags.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)


def structure(html: str) -> Structure:
    s = Structure()
    s.feed(html)
    s.close()
    return s


def write_journal(root: Path, events: list[Any], name: str = JOURNAL, raw: bytes = b"") -> None:
    (root / "journal").mkdir(parents=True, exist_ok=True)
    lines = b"".join(json.dumps(e).encode() + b"\n" if not isinstance(e, bytes) else e + b"\n" for e in events)
    (root / "journal" / name).write_bytes(lines + raw)


def shaped(v: Any, step: Any = None) -> list[dict[str, Any]]:
    """A preempted attempt whose every free field holds ``v`` (steps ``step``, when given, too)."""
    s = (lambda n: n) if step is None else (lambda n: step)
    return [
        {"t": "2026-01-01T00:00:00Z", "event": "start", "step": None, "rank": 0, "host": v, "pid": v},
        {"t": "2026-01-01T00:00:01Z", "event": "fresh", "step": s(0), "rank": 0},
        {"t": "2026-01-01T00:00:02Z", "event": "log", "step": s(0), "rank": 0, v: 1.0, "loss": 2.0},
        {"t": "2026-01-01T00:00:03Z", "event": "log", "step": s(1), "rank": 0, v: 0.5, "loss": 1.0},
        {"t": "2026-01-01T00:00:04Z", "event": "save_started", "step": s(2), "rank": 0, "reason": v},
        {"t": "2026-01-01T00:00:05Z", "event": "save_committed", "step": s(2), "rank": 0, "reason": v, "seconds": 1},
        {
            "t": "2026-01-01T00:00:06Z",
            "event": "notice",
            "step": s(2),
            "rank": 0,
            "source": v,
            "kind": v,
            "detail": v,
            "received_at": "2026-01-01T00:00:06Z",
            "deadline": "2026-01-01T00:00:36Z",
        },
        {"t": "2026-01-01T00:00:07Z", "event": "save_started", "step": s(3), "rank": 0, "reason": "emergency"},
        {
            "t": "2026-01-01T00:00:08Z",
            "event": "save_committed",
            "step": s(3),
            "rank": 0,
            "reason": "emergency",
            "seconds": 1.0,
            "error": v,
        },
        {"t": "2026-01-01T00:00:09Z", "event": "exit", "step": s(3), "rank": 0, "code": v, "reason": v},
    ]


def test_item5_no_journal_value_becomes_markup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 50 item 5: every field of a journal holds ``<script>``, quotes, ``</svg>`` and ``-->``; the page
    has exactly the elements and attributes the same journal with plain values gives, and no ``<script``."""
    pages = {}
    for name, value, step in (("benign", "plain", None), ("evil", EVIL, None), ("evil-steps", EVIL, EVIL)):
        root = tmp_path / name
        write_journal(root, shaped(value, step))
        out = tmp_path / f"{name}.html"
        assert main(["report", str(root), "--html", str(out)]) == 0, name
        pages[name] = out.read_text()
    capsys.readouterr()
    benign = structure(pages["benign"])
    for name in ("evil", "evil-steps"):
        page = structure(pages[name])
        assert page.shapes <= benign.shapes, page.shapes - benign.shapes
        assert "script" not in page.tags
        assert "<script" not in pages[name].lower()
    assert "&lt;script&gt;" in pages["evil"]  # shown, as text


def test_item10_what_a_user_logs_neither_ends_training_nor_breaks_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 50 item 10: huge and non-finite figures under keep_best, and figures named like the journal's own
    fields: training goes on, the journal keeps its fields, every reader reads it, `report` works."""
    import orjson
    import torch

    from conftest import make_model
    from preemptible import Run

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = Run(tmp_path, model=model, optimizer=opt, save_every=2, async_save=False, keep_best=("val", "min"))
    huge = [10**400, -(10**400), float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 10**5000, 0.5]
    for step in run.steps(len(huge)):
        run.log(val=huge[step])
        run.log(t="not a time", event="not an event", step="x", rank=7, file="f", user_t=1)
    lines = [x for p in (tmp_path / "journal").glob("*.jsonl") for x in p.read_text().splitlines()]
    logs = [json.loads(x) for x in lines if '"event": "log"' in x]
    for x in lines:
        assert orjson.loads(x) == json.loads(x)  # stable JSON every reader accepts: no NaN, no 400-digit ints
    named = [e for e in logs if "user_t" in e]
    assert len(named) == len(huge)
    for e in named:
        assert e["event"] == "log" and e["rank"] == 0 and isinstance(e["step"], int)
        assert e["user_user_t"] == "not a time" and e["user_event"] == "not an event" and e["user_step"] == "x"
        assert e["user_rank"] == 7 and e["user_file"] == "f" and e["user_t"] == 1  # the user's own user_t kept
    assert [e["val"] for e in logs if "val" in e] == ["inf", "-inf", "nan", "inf", "-inf", 1e308, -1e308, "inf", 0.5]
    assert main(["report", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["attempts"] == 1 and doc["finished"] is True
    assert [v for _, v, _ in doc["figures"]["val"]] == [1e308, -1e308, 0.5]


HOSTILE_VALUES: list[Any] = [
    "x",
    None,
    True,
    [1, 2],
    {"a": 1},
    -1,
    1e308,
    -1e308,
    "NaN",
    "2026-13-45T99:00:00Z",
]


def test_item11_hostile_values_in_every_field_never_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 50 item 11: figures of +-1e308 and 10^400, non-numeric steps, stall_s and t, times that go
    backwards or are missing, notices whose step is a string: `report` in every form, exit 0, no traceback."""
    events: list[Any] = shaped("src", None)
    events += [{**e, "t": "2026-01-01T00:00:00.5Z"} for e in shaped("back")]  # times going backwards
    events += [{k: v for k, v in e.items() if k != "t"} for e in shaped("no-t")]  # no time
    events.append({"t": "2026-01-01T00:00:10Z", "event": "log", "step": 4, "rank": 0, "loss": 1e308})
    events.append({"t": "2026-01-01T00:00:11Z", "event": "log", "step": 5, "rank": 0, "loss": -1e308})
    events.append(b'{"t": "2026-01-01T00:00:12Z", "event": "log", "step": 6, "rank": 0, "loss": 1' + b"0" * 400 + b"}")
    events.append(b'{"t": "2026-01-01T00:00:12Z", "event": "log", "step": 6, "rank": 0, "loss": NaN, "x": Infinity}')
    for i, v in enumerate(HOSTILE_VALUES):
        for field in ("t", "step", "stall_s", "seconds", "received_at", "deadline", "rank", "event", "asynchronous"):
            base = {"t": f"2026-01-01T00:01:{i:02d}Z", "event": "save_started", "step": 7, "rank": 0}
            for kind in ("save_started", "save_committed", "notice", "fresh", "resume", "log", "exit", "done"):
                events.append({**base, "event": kind, field: v, "asynchronous": True})
    write_journal(tmp_path / "root", events)
    write_journal(tmp_path / "root", shaped(7, EVIL), name="20260102T000000.000000Z-r0.jsonl")
    root = str(tmp_path / "root")
    for extra in ([], ["--json"], ["--html", str(tmp_path / "r.html")], ["--png", str(tmp_path / "r.png")]):
        code = main(["report", root, *extra])
        out, err = capsys.readouterr()
        assert code == 0, (extra, err)
        assert "Traceback" not in out + err
    assert (tmp_path / "r.html").stat().st_size > 0 and (tmp_path / "r.png").stat().st_size > 0
    main(["report", root, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["skipped"]["events"] > 0  # those without a usable time, counted
    assert doc["figures"]["loss"]  # the finite ones, including +-1e308


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_line_failure(capsys: pytest.CaptureFixture[str], code: int) -> str:
    out, err = capsys.readouterr()
    assert code != 0, (out, err)
    assert "Traceback" not in out + err and "wrote" not in out + err
    assert err.count("\n") == 1, err
    return err


def test_item11_report_writes_exactly_where_told_or_says_why_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 50 item 11: an unknown picture suffix, a directory, a path through a regular file: one line,
    non-zero, nothing written; "wrote X" only once X itself exists."""
    root = tmp_path / "root"
    write_journal(root, shaped("plain"))
    a_file = tmp_path / "file"
    a_file.write_text("a regular file")
    before = sorted(p.name for p in tmp_path.iterdir())
    err = one_line_failure(capsys, main(["report", str(root), "--png", str(tmp_path / "out.xyz")]))
    assert ".png" in err and ".svg" in err  # the suffixes it can write
    for bad in (str(tmp_path), str(a_file / "sub.png"), str(root / "journal")):
        one_line_failure(capsys, main(["report", str(root), "--png", bad]))
        one_line_failure(capsys, main(["report", str(root), "--html", bad]))
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no out.xyz.png, nothing else
    for name in ("r.png", "r.pdf", "r.svg"):
        assert main(["report", str(root), "--png", str(tmp_path / name)]) == 0
        assert f"wrote {tmp_path / name}" in capsys.readouterr().err
        assert (tmp_path / name).stat().st_size > 0


def test_item11_report_on_an_unreachable_object_store_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    from objkit import set_env

    set_env(monkeypatch, f"http://127.0.0.1:{closed_port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    one_line_failure(capsys, main(["report", "s3://bucket/root", "--png", str(tmp_path / "r.png")]))
    assert not (tmp_path / "r.png").exists()
    root = tmp_path / "root"
    write_journal(root, shaped("plain"))
    one_line_failure(capsys, main(["report", str(root), "--png", "s3://bucket/r.png"]))
    assert not Path("s3:").exists()


def test_item11_bench_refuses_bad_output_paths_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from preemptible import bench

    ran: list[str] = []
    monkeypatch.setattr(bench, "main", lambda **kw: ran.append("ran") or {"x": 1})
    a_file = tmp_path / "file"
    a_file.write_text("a regular file")
    for argv in (
        ["bench", "--dir", "/proc/xx", "--quick"],
        ["bench", "--json", str(tmp_path), "--quick"],
        ["bench", "--json", str(a_file / "out.json"), "--quick"],
        ["bench", "--json", str(tmp_path / "no" / "out.json"), "--quick"],
    ):
        try:
            code = main(argv)
        except SystemExit as e:
            code = int(e.code or 0)
        one_line_failure(capsys, code)
    assert ran == []
    assert main(["bench", "--json", str(tmp_path / "out.json"), "--quick"]) == 0
    assert json.loads((tmp_path / "out.json").read_text()) == {"x": 1}
    assert f"wrote {tmp_path / 'out.json'}" in capsys.readouterr().err


def long_journal(root: Path, lines: int) -> None:
    (root / "journal").mkdir(parents=True, exist_ok=True)
    with open(root / "journal" / JOURNAL, "w") as f:
        f.write('{"t": "2026-01-01T00:00:00Z", "event": "fresh", "step": 0, "rank": 0}\n')
        for i in range(lines):
            s, us = divmod(i, 1000)
            f.write(
                f'{{"t": "2026-01-01T{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{us:03d}000Z", "event": "log", '
                f'"step": {i}, "rank": 0, "loss": {1.0 / (i + 1)}, "lr": 0.1}}\n'
            )
            if i % 100 == 99:
                f.write(f'{{"t": "2026-01-01T00:00:00Z", "event": "save_committed", "step": {i}, "seconds": 0.1}}\n')
        f.write("not json\n" + "[1, 2]\n" + '{"event": "log"}\n' + '{"t": "' + "x" * (2 << 20) + '"}\n')


def test_item12_memory_does_not_grow_with_the_journal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 50 item 12: peak memory of `report` on 200,000 lines within a few MB of its peak on 20,000; what
    it skipped (unparsable, too long, no time) counted in the text and the JSON; figures downsampled, said so."""
    from preemptible import report
    from preemptible.store.io import LocalStorage

    peaks = []
    for n in (20_000, 200_000):
        root = tmp_path / str(n)
        long_journal(root, n)
        tracemalloc.start()
        doc = report.report(LocalStorage(str(root)))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert doc["runs"][0]["to_step"] == n
        assert doc["skipped"] == {"unparsable_lines": 2, "long_lines": 1, "events": 1}, doc["skipped"]
        assert len(doc["figures"]["loss"]) <= report.MAX_POINTS
    assert peaks[1] - peaks[0] < 4 << 20, peaks
    assert doc["figures_downsampled"] == {"loss": 200_000, "lr": 200_000}
    assert main(["report", str(root)]) == 0
    out = capsys.readouterr().out
    assert "skipped: 2 unparsable line(s), 1 line(s) too long (over 1048576 bytes), 1 event(s) of unknown shape" in out
    assert f"at most {report.MAX_POINTS} points" in out


def test_item12_the_reader_streams(tmp_path: Path) -> None:
    """A journal of more than the reader's line limit in one line, non-UTF-8 bytes, a torn last line."""
    from preemptible import journal
    from preemptible.store.io import LocalStorage

    write_journal(
        tmp_path,
        [{"t": "2026-01-01T00:00:00Z", "event": "start", "step": None, "rank": 0, "file": "other"}],
        raw=b'{"t": "\xff\xfe", "event": "x"}\n' + b"y" * (journal.MAX_LINE + 10) + b'\n{"t": "2026',
    )
    skipped: dict[str, int] = {}
    events = list(journal.read(LocalStorage(str(tmp_path)), skipped=skipped))
    assert [e["event"] for e in events] == ["start", "x"]
    assert {e["file"] for e in events} == {JOURNAL}  # the reader's own field, whatever a line says
    assert skipped == {"long_lines": 1, "unparsable_lines": 1}
    assert os.path.getsize(tmp_path / "journal" / JOURNAL) > journal.MAX_LINE
