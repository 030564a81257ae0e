"""The shape of the code, held by a test: no import cycle (function-level and type-only imports included), nothing
imports upwards across the floors of docs/architecture.md, nothing below the CLI imports the CLI, and the read side
imports nothing from the write side.

Imports are read from the source (``ast``), so a deferred import inside a function and an ``if TYPE_CHECKING:``
import count like any other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "preemptible"

FLOORS: list[tuple[str, ...]] = [
    # 0: words every floor uses
    ("preemptible._version", "preemptible.errors", "preemptible.events", "preemptible.notice", "preemptible.phases"),
    # 1: bytes on storage
    ("preemptible.store",),
    # 2: the state and one checkpoint: what to save, how to save and read it, across ranks
    (
        "preemptible.state",
        "preemptible.validate",
        "preemptible.dist",
        "preemptible.writer",
        "preemptible.checkpoint",
        "preemptible.journal",
        "preemptible.progress",
        "preemptible.relay",
    ),
    # 3: notices
    ("preemptible.sources", "preemptible.guard"),
    # 4: the run: from a notice to an exit, and back
    (
        "preemptible.accumulation",
        "preemptible.emergency",
        "preemptible.budget",
        "preemptible.schedule",
        "preemptible.saves",
        "preemptible.loaders",
        "preemptible.options",
        "preemptible.trackers",
        "preemptible.run",
        "preemptible.export",
    ),
    # 5: integrations with training frameworks
    ("preemptible.integrations",),
    # 6: tools built on the library
    (
        "preemptible.diagnose",
        "preemptible.report",
        "preemptible.drill",
        "preemptible.bench",
        "preemptible.testing",
        "preemptible.emulate",
        "preemptible.wrapper",
    ),
    # 7: the command line
    ("preemptible.cli", "preemptible.__main__"),
]
"""The floors, lowest first. A module may import its own floor and the floors below, never one above."""

READ_SIDE = (
    "preemptible.checkpoint.reader",
    "preemptible.checkpoint.readonly",
    "preemptible.checkpoint.restore",
    "preemptible.checkpoint.reshard",
    "preemptible.checkpoint.shards",
    "preemptible.export",
)
WRITE_SIDE = (
    "preemptible.writer",
    "preemptible.checkpoint.arena",
    "preemptible.checkpoint.checkpointer",
    "preemptible.checkpoint.commit",
    "preemptible.checkpoint.planner",
    "preemptible.checkpoint.prestage",
    "preemptible.checkpoint.saver",
    "preemptible.checkpoint.steady",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of the package that ``name`` imports, wherever the import statement sits."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            module = target
            while module and module not in known:
                module = module.rpartition(".")[0]
            if module and module != name:
                found.add(module)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    # the top-level package is the lazy facade (PEP 562): it names its exports for type checkers only
    return {n: imports_of(n, p, known) - {PACKAGE} for n, p in mods.items() if n != PACKAGE}


def floor_of(name: str) -> int:
    for i, floor in enumerate(FLOORS):
        if any(name == f or name.startswith(f + ".") for f in floor):
            return i
    raise AssertionError(f"{name} is on no floor: add it to FLOORS and to docs/architecture.md")


def test_every_module_is_on_a_floor() -> None:
    for name in graph():
        floor_of(name)


def test_no_import_cycle() -> None:
    g = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if m.startswith(n + ".") or n.startswith(m + "."):
                continue  # a package and its own modules: the package's __init__ re-exports them
            if state.get(m) == 1:
                cycles.append([*stack[stack.index(m) :], m])
            elif m not in state:
                visit(m, stack)
        stack.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n, [])
    assert cycles == []


def test_no_import_goes_up_a_floor() -> None:
    upward = [
        f"{n} (floor {floor_of(n)}) imports {m} (floor {floor_of(m)})"
        for n, targets in graph().items()
        for m in sorted(targets)
        if floor_of(m) > floor_of(n)
    ]
    assert upward == []


def test_nothing_below_the_cli_imports_it() -> None:
    bad = [
        (n, m)
        for n, targets in graph().items()
        if not n.startswith(("preemptible.cli", "preemptible.__main__"))
        for m in targets
        if m.startswith("preemptible.cli")
    ]
    assert bad == []


@pytest.mark.parametrize("reader", READ_SIDE)
def test_the_read_side_imports_nothing_from_the_write_side(reader: str) -> None:
    assert sorted(m for m in graph()[reader] if m in WRITE_SIDE) == []


def test_the_checker_sees_deferred_and_type_only_imports(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from preemptible.cli import main\n"
        "def f():\n    from preemptible import run\n"
    )
    (tmp_path / "m.py").write_text(source)
    known = {"preemptible.cli", "preemptible.run", "preemptible"}
    found = imports_of("preemptible.x", tmp_path / "m.py", known)
    assert found == {"preemptible.cli", "preemptible.run", "preemptible"}


def test_loading_the_read_side_loads_nothing_of_the_write_side() -> None:
    """At run time too: a package's ``__init__`` runs before any of its modules, so the checkpoint package's façade
    must not load the write side when a reader is imported (it loads its names on first use)."""
    code = (
        "import sys\n"
        f"for name in {list(READ_SIDE)!r}:\n"
        "    __import__(name)\n"
        f"print(sorted(m for m in {list(WRITE_SIDE)!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
