"""The public surface is a contract: `preemptible.__all__` and `preemptible.errors.__all__` are pinned here.

Adding or removing a name is a contract change (DESIGN.md's public API); it must change this file in the same
commit, and the closing note of that change must say so.
"""

from __future__ import annotations

import builtins
import inspect

import pytest

import preemptible
import preemptible.errors

PUBLIC = [
    "AlreadyCommittedError",
    "CheckpointCorruptError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "Checkpointer",
    "Guard",
    "MemoryTier",
    "Notice",
    "NoticeKind",
    "NoticeSource",
    "Plan",
    "PreemptibleError",
    "RNGState",
    "Run",
    "SaveError",
    "SaveHandle",
    "SaveResult",
    "StateMismatchError",
    "Stateful",
    "UnsupportedStateError",
    "__version__",
    "load",
    "plan",
]

ERRORS = [
    "AlreadyCommittedError",
    "CheckpointCorruptError",
    "CheckpointFallbackWarning",
    "CheckpointNotFoundError",
    "CoordinationError",
    "FileTooLargeError",
    "LifecycleError",
    "NotRegularFileError",
    "NoticeSourceError",
    "OutsideRootError",
    "PreemptibleError",
    "ProbeError",
    "RankFailures",
    "SaveCancelled",
    "SaveError",
    "StateDivergenceError",
    "StateMismatchError",
    "StorageCredentialsError",
    "StorageUnavailableError",
    "UnsupportedStateError",
]


def test_top_level_names_are_pinned_and_sorted() -> None:
    assert preemptible.__all__ == PUBLIC
    assert sorted(preemptible.__all__) == preemptible.__all__
    assert dir(preemptible) == sorted(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_top_level_name_resolves(name: str) -> None:
    assert getattr(preemptible, name) is not None


def test_error_names_are_pinned_and_sorted() -> None:
    assert preemptible.errors.__all__ == ERRORS


def test_every_exception_class_in_errors_is_exported() -> None:
    defined = sorted(
        name
        for name, value in vars(preemptible.errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException | Warning)
        and value.__module__ == preemptible.errors.__name__
    )
    assert defined == ERRORS


def test_top_level_errors_are_the_errors_modules_own() -> None:
    for name in PUBLIC:
        value = getattr(preemptible, name)
        if inspect.isclass(value) and issubclass(value, BaseException):
            assert getattr(preemptible.errors, name) is value


def test_the_hierarchy_drawn_in_errors_docstring_is_the_real_one() -> None:
    """Each drawn line names a class, its drawn parent and the builtin in brackets; all three must be true."""
    doc = preemptible.errors.__doc__ or ""
    drawn: dict[str, tuple[str | None, str | None]] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        words = line.replace("├──", " ").replace("└──", " ").replace("│", " ").split()
        if not words or not words[0].isidentifier() or not hasattr(preemptible.errors, words[0]):
            continue
        depth = len(line) - len(line.lstrip(" │├└─"))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        builtin = words[1].strip("[]") if len(words) > 1 else None
        drawn[words[0]] = (stack[-1][1] if stack else None, builtin)
        stack.append((depth, words[0]))
    assert sorted(drawn) == ERRORS
    for name, (parent, builtin) in drawn.items():
        cls = getattr(preemptible.errors, name)
        if parent is not None:
            assert cls.__bases__[0] is getattr(preemptible.errors, parent), name
        if builtin is not None:
            assert issubclass(cls, getattr(builtins, builtin)), name
