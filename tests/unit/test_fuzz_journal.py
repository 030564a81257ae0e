"""Generated hostile journals (issue 50): hypothesis writes journal files by hand, as a stranger or a broken disk
could: any JSON type in every field, huge and non-finite numbers, markup and unicode, missing fields, torn lines,
lines past the reader's limit, bytes that are not UTF-8. Whatever it writes, ``report`` (text, ``--json``,
``--html``, ``--png``) and ``diagnose --root`` must exit with a code and at most one line of error, never a
traceback; write nothing but the file they were given; and the page must hold only the elements and attributes its
template writes, with no ``<script``.

Examples: ``PREEMPTIBLE_JOURNAL_FUZZ_EXAMPLES`` (default 30, a few seconds; it falls back to
``PREEMPTIBLE_FUZZ_EXAMPLES``, so the documented long fuzz run widens this one too), e.g.
``PREEMPTIBLE_JOURNAL_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest tests/unit/test_fuzz_journal.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preemptible import journal
from preemptible.cli import main
from preemptible.report._picture import _TEMPLATES

EXAMPLES = int(os.environ.get("PREEMPTIBLE_JOURNAL_FUZZ_EXAMPLES", os.environ.get("PREEMPTIBLE_FUZZ_EXAMPLES", "30")))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples on every run in CI; the long run widens the net
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

# Writes recorded while a command runs: audit hooks cannot be removed, so one hook for the module, on only while
# `_recording` holds a list.
_recording: list[list[str]] = []
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not _recording:
        return
    path, mode, flags = args
    writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITE_FLAGS)
    if writes and isinstance(path, (str, bytes, os.PathLike)):
        _recording[-1].append(os.fsdecode(path))


sys.addaudithook(_audit)


def _template_shapes() -> dict[str, set[str]]:
    """Every tag the page's templates write, with every attribute name they may give it."""
    shapes: dict[str, set[str]] = {}
    source = re.sub(r"\{\{.*?\}\}", "V", "".join(_TEMPLATES.values()), flags=re.S)
    source = re.sub(r"\{%-?.*?-?%\}", " ", source, flags=re.S).replace("\\\n", "")
    for tag, attrs in re.findall(r"<([a-zA-Z][\w-]*)([^<>]*)>", source):
        shapes.setdefault(tag.lower(), set()).update(a.lower() for a in re.findall(r"([\w-]+)=", attrs))
    return shapes


SHAPES = _template_shapes()


class Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, set[str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k for k, _ in attrs}))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)


def assert_only_template_markup(page: str) -> None:
    assert "<script" not in page.lower()
    p = Elements()
    p.feed(page)
    p.close()
    for tag, attrs in p.found:
        assert tag in SHAPES, f"an element the template never writes: <{tag}>"
        assert attrs <= SHAPES[tag], f"<{tag}> with attributes the template never writes: {attrs - SHAPES[tag]}"


HOSTILE_TEXT = st.sampled_from(
    ["<script>alert(1)</script>", '"', "'", "</svg>", "-->", "<!--", "$\\frac{1}{", "\u202e", "\x00", "]]>", "&amp;"]
)
TEXT = HOSTILE_TEXT | st.text(max_size=12)
NUMBERS = (
    st.integers(min_value=-(10**30), max_value=10**30)
    | st.sampled_from([10**400, -(10**400), 2**63, 2**53 + 1, 0, 1, -1])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1e308, -1e308, 5e-324])
)
TIMES = st.sampled_from(
    ["2026-01-01T00:00:00Z", "2026-01-01T00:00:05.5Z", "2025-12-31T23:59:59Z", "2026-01-01T00:01:00+02:00", "x", ""]
) | st.datetimes().map(lambda d: d.isoformat())
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT | TIMES
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=6
)
KINDS = st.sampled_from(
    ["start", "fresh", "resume", "log", "progress", "save_started", "save_committed", "notice", "exit", "done"]
)
FIELD = {
    "t": TIMES | VALUES,
    "event": KINDS | VALUES,
    "step": st.integers(min_value=-3, max_value=50) | VALUES,
    "rank": st.just(0) | VALUES,
    "received_at": TIMES | VALUES,
    "deadline": TIMES | VALUES,
    "stall_s": NUMBERS | VALUES,
    "seconds": NUMBERS | VALUES,
    "reason": st.just("emergency") | VALUES,
    "asynchronous": VALUES,
    "source": VALUES,
    "kind": VALUES,
    "detail": VALUES,
    "code": VALUES,
    "error": VALUES,
    "file": VALUES,
}


@st.composite
def events(draw: Any) -> dict[str, Any]:
    event: dict[str, Any] = {}
    for name, values in FIELD.items():
        if draw(st.integers(0, 3)):  # a quarter of the fields missing
            event[name] = draw(values)
    for _ in range(draw(st.integers(0, 3))):  # figures, named anything
        event[draw(TEXT)] = draw(NUMBERS | VALUES)
    return event


@st.composite
def lines(draw: Any) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:  # torn by kill -9
        whole = json.dumps(draw(events())).encode()
        return whole[: draw(st.integers(0, len(whole)))]
    if kind == 1:  # not UTF-8
        return b'{"t": "2026-01-01T00:00:01Z", "event": "log", "step": 1, "\xff\xfe": 1, "x": "\xc3"}'
    if kind == 2:  # past the reader's limit
        return b'{"t": "2026-01-01T00:00:01Z", "event": "log", "x": "' + b"y" * journal.MAX_LINE + b'"}'
    if kind == 3:  # JSON that is not an object, a number no float holds, the standard library's NaN
        return draw(st.sampled_from([b"[1, 2]", b"null", b'"x"', b'{"step": 1' + b"0" * 400 + b"}", b'{"x": NaN}']))
    return json.dumps(draw(events())).encode()


@st.composite
def roots(draw: Any) -> dict[str, bytes]:
    files = {}
    for i in range(draw(st.integers(1, 3))):
        rank = draw(st.sampled_from(["r0", "r0", "r1"]))
        body = b"\n".join(draw(st.lists(lines(), min_size=0, max_size=12)))
        files[f"2026010{i}T000000.000000Z-{rank}.jsonl"] = body + draw(st.sampled_from([b"", b"\n"]))
    return files


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str], allowed: set[str]) -> tuple[int, str, str]:
    import matplotlib

    _recording.append([])
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's exit: a code, one line
        code = e.code if isinstance(e.code, int) else 2
    finally:
        written = _recording.pop()
    out, err = capsys.readouterr()
    assert isinstance(code, int)
    assert "Traceback" not in out + err, (argv, err)
    cache = matplotlib.get_cachedir()
    allowed = {os.path.realpath(a) for a in allowed}
    stray = {p for p in written if os.path.realpath(p) not in allowed and "__pycache__" not in p}
    stray = {p for p in stray if not os.path.realpath(p).startswith(os.path.realpath(cache))}
    assert not stray, f"{argv} wrote {stray}"
    return code, out, err


@FUZZ
@given(files=roots(), png=st.integers(0, 3))
def test_hostile_journals_never_traceback_nor_write_elsewhere(
    files: dict[str, bytes], png: int, capsys: pytest.CaptureFixture[str]
) -> None:
    work = Path(tempfile.mkdtemp(prefix="fuzz-journal-"))
    try:
        root = work / "root"
        (root / "journal").mkdir(parents=True)
        for name, body in files.items():
            (root / "journal" / name).write_bytes(body)
        page, picture = work / "r.html", work / "r.png"
        code, out, _ = run_cli(["report", str(root), "--json"], capsys, set())
        assert code == 0
        doc = json.loads(out)
        assert set(doc["skipped"]) >= {"unparsable_lines", "long_lines", "events"}
        code, _, err = run_cli(["report", str(root), "--html", str(page)], capsys, {str(page)})
        assert code == 0, err
        assert_only_template_markup(page.read_text(encoding="utf-8"))
        if png == 0:  # a quarter of the examples: matplotlib is the slow part
            code, _, err = run_cli(["report", str(root), "--png", str(picture)], capsys, {str(picture)})
            assert code == 0, err
            assert picture.stat().st_size > 0
        code, _, err = run_cli(["diagnose", "--root", str(root)], capsys, set())
        assert code in (0, 3) or err.count("\n") == 1, err
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_markup_check_sees_what_the_template_never_writes() -> None:
    """The check above is not a stub: an injected element or attribute fails it."""
    assert_only_template_markup('<table class=summary><tr><td id="x">a</td></tr></table>')
    for bad in ("<script>x</script>", '<td onclick="x">a</td>', "<img src=x>", '<svg class="a" onload="x"></svg>'):
        with pytest.raises(AssertionError):
            assert_only_template_markup(bad)
