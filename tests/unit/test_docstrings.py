"""The docstrings are the API reference (the documentation site renders them): every public name has its sections,
and every example in them runs and prints what it shows (doctest)."""

from __future__ import annotations

import doctest
import inspect
import os
from typing import Any

import pytest

import preemptible
from preemptible import errors

PUBLIC = [name for name in preemptible.__all__ if name != "__version__"]


def _sections(obj: Any) -> str:
    return inspect.getdoc(obj) or ""


def _takes_arguments(obj: Any) -> bool:
    try:
        target = obj.__init__ if isinstance(obj, type) else obj
        params = [p for p in inspect.signature(target).parameters if p not in ("self", "args", "kwargs")]
    except (TypeError, ValueError):
        return False
    return bool(params)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_has_its_sections(name: str) -> None:
    obj = getattr(preemptible, name)
    doc = _sections(obj)
    assert doc, name
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return  # an error: said by test_every_error_says_when_it_is_raised_and_what_to_do
    assert "Example" in doc and ">>>" in doc, f"{name}: no Example section that runs"
    if (_takes_arguments(obj) and not isinstance(obj, type)) or name in ("Run", "Checkpointer", "Guard", "MemoryTier"):
        assert "Args:" in doc, f"{name}: no Args section"
    if inspect.isfunction(obj):
        assert "Returns:" in doc and "Raises:" in doc, f"{name}: no Returns or Raises section"


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_says_when_it_is_raised_and_what_to_do(name: str) -> None:
    doc = _sections(getattr(errors, name))
    assert doc and "What to do:" in doc, f"{name}: say when it is raised and what to do"


def _callback_methods() -> list[tuple[str, Any]]:
    out = []
    for module in ("preemptible.integrations.transformers", "preemptible.integrations.lightning"):
        cls = __import__(module, fromlist=["PreemptibleCallback"]).PreemptibleCallback
        for name, member in vars(cls).items():
            if not name.startswith("_"):
                out.append(
                    (f"{module.rsplit('.', 1)[1]}.{name}", member.fget if isinstance(member, property) else member)
                )
    return out


@pytest.mark.parametrize(("name", "method"), _callback_methods(), ids=[n for n, _ in _callback_methods()])
def test_the_callbacks_public_methods_have_their_sections(name: str, method: Any) -> None:
    doc = method.__doc__ or ""  # its own, not the framework's inherited one
    needed = ["Returns:", "Raises:", "Examples:"] + (["Args:"] if _takes_arguments(method) else [])
    assert all(s in doc for s in needed), (name, [s for s in needed if s not in doc])


def _examples() -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []
    for name in PUBLIC:
        seen.append((name, getattr(preemptible, name)))
    for module in ("preemptible.integrations.transformers", "preemptible.integrations.lightning"):
        mod = (
            pytest.importorskip(module)
            if os.environ.get("PREEMPTIBLE_NO_FRAMEWORKS")
            else __import__(module, fromlist=["PreemptibleCallback"])
        )
        seen.append((f"{module}.PreemptibleCallback", mod.PreemptibleCallback))
    return seen


@pytest.mark.parametrize(("name", "obj"), _examples(), ids=[n for n, _ in _examples()])
def test_the_examples_run(name: str, obj: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    finder = doctest.DocTestFinder(recurse=False)
    tests = [t for t in finder.find(obj, name, globs={}) if t.examples]
    if not tests:
        assert not (inspect.getdoc(obj) or "").count(">>>"), name
        return
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed (see the output above)"
