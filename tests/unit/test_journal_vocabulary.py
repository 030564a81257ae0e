"""The journal's two sides speak one vocabulary: `journal.FIELDS` says what each event carries; every writer's call
site gives exactly those fields, and every reader reads only fields its events carry, by the `Event` enum, never
by a bare event name. Renaming an event or a field on one side only fails here."""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import preemptible
from preemptible import journal
from preemptible.budget import CadenceAdvice, Plan
from preemptible.events import Event
from preemptible.journal import COMMON, FIELDS, NOT_JOURNALED, OPEN, Record
from preemptible.notice import Notice, NoticeKind

SRC = Path(preemptible.__file__).parent
READERS = ("report", "diagnose", "drill", "cli/inspect.py", "cli/report.py", "cli/diagnose.py", "cli/drill.py")
"""What reads the journal (or the report file that mirrors it)."""
EVENT_NAMES = {e.value for e in Event}


def _modules(*parts: str) -> Iterator[tuple[Path, ast.Module]]:
    for part in parts:
        path = SRC / part
        for p in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            yield p, ast.parse(p.read_text(), str(p))


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _dict_keys(node: ast.AST) -> set[str]:
    """The constant keys of the dict literals in ``node`` (``{"a": 1} if x else {}`` included)."""
    return {
        k.value
        for d in ast.walk(node)
        if isinstance(d, ast.Dict)
        for k in d.keys
        if isinstance(k, ast.Constant) and isinstance(k.value, str)
    }


def _returned_keys(module: str, function: str) -> set[str]:
    """The keys of the dict a function builds: those of the dict literals it binds to a name (not nested ones),
    and every ``name["key"] = ...`` it assigns."""
    tree = ast.parse((SRC / module).read_text())
    fn = next(f for f in _functions(tree) if f.name == function)
    keys: set[str] = set()
    for node in ast.walk(fn):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
                keys.add(str(target.slice.value))
            elif isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
                keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return keys


def _spread(call: ast.expr, fn: ast.AST) -> set[str] | None:
    """The fields a ``**spread`` gives an event; None when they are the user's (`OPEN`)."""
    now = datetime.now(timezone.utc)
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
        if ast.unparse(call) == "notice.to_json()":
            return set(
                Notice(source="aws", kind=NoticeKind.TERMINATE, received_at=now, deadline=now, detail="x").to_json()
            )
        if ast.unparse(call) == "verdict.to_json()":
            return {f.name for f in dataclasses.fields(Plan)}
        if ast.unparse(call) == "advice.to_json()":
            return {f.name for f in dataclasses.fields(CadenceAdvice)}
    if isinstance(call, ast.Name):
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == call.id for t in node.targets):
                if isinstance(node.value, ast.Call) and ast.unparse(node.value.func).endswith("trackers.on_notice"):
                    return _returned_keys("trackers.py", "on_notice")
                if _dict_keys(node.value):
                    return _dict_keys(node.value)
                return None  # a name bound to the user's figures
    raise AssertionError(f"a spread the vocabulary test cannot read: **{ast.unparse(call)}")


def _forwards(fn: ast.AST, first: ast.expr) -> bool:
    """Whether ``fn`` is an events sink's ``event(self, event, step, **fields)`` passing its own ``event`` on."""
    if not isinstance(fn, ast.FunctionDef) or fn.name != "event" or len(fn.args.args) < 2:
        return False
    return isinstance(first, ast.Name) and first.id == fn.args.args[1].arg


def _written() -> dict[Event, set[str]]:
    """Each event's fields, from every ``X.event(Event.Y, step, field=...)`` call in the library, and the journal's
    own line for a journal lost under the run."""
    out: dict[Event, set[str]] = {}
    for path, tree in _modules("."):
        for fn in _functions(tree):
            for node in ast.walk(fn):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if node.func.attr != "event" or len(node.args) != 2:
                    continue
                first = node.args[0]
                if _forwards(fn, first):
                    continue  # a sink's own ``event`` method handing its argument on (checked at its callers)
                where = f"{path.relative_to(SRC)}:{node.lineno}"
                assert isinstance(first, ast.Attribute) and ast.unparse(first.value) == "Event", (
                    f"{where}: expected an event written as Event.<NAME>; found {ast.unparse(first)}"
                )
                event = Event[first.attr]
                fields = out.setdefault(event, set())
                for kw in node.keywords:
                    if kw.arg is not None:
                        fields.add(kw.arg)
                        continue
                    spread = _spread(kw.value, fn)
                    assert spread is not None or event in OPEN, f"{where}: user fields given to {event.name}"
                    fields |= spread or set()
    lost = _returned_keys("journal/_writer.py", "_lost_line")
    out.setdefault(Event.JOURNAL_LOST, set()).update(lost - COMMON)
    return out


def test_every_journaled_event_has_its_fields_and_only_those_are_written() -> None:
    assert set(FIELDS) == set(Event) - NOT_JOURNALED, "an event of the vocabulary with no field definition"
    written = _written()
    assert set(written) == set(FIELDS), (
        f"events no writer journals: {sorted(e.name for e in set(FIELDS) - set(written))}"
    )
    for event, fields in FIELDS.items():
        assert written[event] == set(fields), (
            f"{event.name}: written {sorted(written[event] - fields)} beyond its fields, "
            f"defined {sorted(fields - written[event])} that no writer gives"
        )


def _compared_to_event_names(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Bare event names a reader compares an event with: ``x.get("event") == "notice"``, ``events("done")``,
    ``e["event"] in ("fresh", "resume")``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if not any("event" in ast.unparse(s) for s in sides):
                continue
            for s in sides:
                for c in ast.walk(s):
                    if isinstance(c, ast.Constant) and c.value in EVENT_NAMES:
                        yield node.lineno, c.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "events":
            for a in node.args:
                if isinstance(a, ast.Constant) and a.value in EVENT_NAMES:
                    yield node.lineno, a.value


def test_readers_name_events_by_the_enum_and_only_events_that_are_written() -> None:
    written = set(_written())
    for path, tree in _modules(*READERS):
        where = path.relative_to(SRC)
        assert not list(_compared_to_event_names(tree)), (
            f"{where}: bare event names {list(_compared_to_event_names(tree))}"
        )
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Event":
                event = Event[node.attr]
                assert event in written, f"{where}:{node.lineno}: reads {event.name}, which no writer journals"


def _all_events(tmp_path: Path) -> Path:
    """A root whose journal holds two attempts with every event, each with every field its definition names."""
    values: dict[str, Any] = {"t": "2026-01-01T00:00:00Z", "reason": "emergency", "code": 0, "source": "aws"}
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    for attempt, name in enumerate(("20260101T000000.000000Z-r0.jsonl", "20260101T000100.000000Z-r0.jsonl"), 1):
        lines = []
        for i, (event, fields) in enumerate(FIELDS.items()):
            minute = attempt - 1
            line: dict[str, Any] = {
                "t": f"2026-01-01T00:{minute:02d}:{i:02d}Z",
                "event": event.value,
                "step": i,
                "rank": 0,
            }
            line |= {f: values.get(f, i) for f in sorted(fields)}
            if event == Event.START:
                line["attempt"] = attempt
            if event in (Event.NOTICE, Event.ADVISORY):
                line |= {"received_at": line["t"], "deadline": f"2026-01-01T00:{minute:02d}:59Z"}
            lines.append(json.dumps(line))
        (journal_dir / name).write_text("\n".join(lines) + "\n")
    return tmp_path


def test_readers_read_only_fields_their_events_carry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every field a reader takes from a record (`Record.get`, ``record[...]``) is one its event carries."""
    read: set[tuple[Event | None, str]] = set()
    get, item = Record.get, Record.__getitem__

    def logged_get(self: Record, key: str, default: Any = None) -> Any:
        read.add((self.event, key))
        return get(self, key, default)

    def logged_item(self: Record, key: str) -> Any:
        read.add((self.event, key))
        return item(self, key)

    monkeypatch.setattr(Record, "get", logged_get)
    monkeypatch.setattr(Record, "__getitem__", logged_item)
    root = _all_events(tmp_path)
    from preemptible import report
    from preemptible.cli.inspect import collect
    from preemptible.diagnose import diagnose
    from preemptible.drill._child import clean_exit
    from preemptible.drill._drill import Drill
    from preemptible.store.io import LocalStorage

    doc = report.report(LocalStorage(str(root)))
    assert doc["attempts"] == 2 and doc["preemptions"]
    assert diagnose(root=str(root), attempt=1).checkpoint["notice_step"] is not None
    collect(str(root))

    class Child:  # what the drill reads of a started command: its report file's events
        code = 0

        def records(self) -> list[Record]:
            return list(journal.records(LocalStorage(str(root))))

        def events(self, event: Event) -> list[Record]:
            return [r for r in self.records() if r.event == event]

        def tail(self, n: int = 15) -> str:
            return ""

    assert clean_exit(0, Child())  # type: ignore[arg-type]
    Drill(["true"])._hung(Child())  # type: ignore[arg-type]
    assert read, "the readers read no field through a record"
    for event, key in sorted(read, key=str):
        assert event is not None, f"a field read from an event of no known name: {key}"
        assert key in COMMON or key in FIELDS[event] or event in OPEN, (
            f"{event.name}: reads {key!r}, not one of its fields"
        )
