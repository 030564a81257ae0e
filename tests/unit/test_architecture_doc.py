"""docs/architecture.md names modules, classes and functions as dotted names: every one must exist, so the code map
cannot drift from the code without this test failing."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
DOTTED = re.compile(r"`(preemptible(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?`")


def names() -> list[str]:
    return sorted(set(DOTTED.findall(DOC.read_text())))


def resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted``, then look the rest up as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_map_names_enough_to_be_a_map() -> None:
    assert len(names()) >= 40


@pytest.mark.parametrize("dotted", names())
def test_every_dotted_name_in_the_code_map_exists(dotted: str) -> None:
    resolve(dotted)


def test_a_missing_name_is_caught() -> None:
    with pytest.raises(AttributeError):
        resolve("preemptible.run.Run.no_such_method")
    with pytest.raises(ModuleNotFoundError):
        resolve("preemptibleX.nothing")
