"""Generated hostile checkpoints (issue 14): hypothesis tampers with the newest of two checkpoints (its manifest,
a tensor header, the state document, or raw bytes) and reseals it as an attacker can (sizes, XXH3 checksums and
the manifest's own checksum recomputed). Whatever it generates, restore must load the older checkpoint exactly or
the tampered one if the change was harmless, never raise, never hang, and never change or mark the older one;
``inspect`` and ``verify`` must print, not crash.

Examples per strategy: ``PREEMPTIBLE_FUZZ_EXAMPLES`` (default 60 in CI; the documented long run uses 2000). The
number tried is appended to ``$PREEMPTIBLE_FUZZ_REPORT`` when that is set.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preemptible import Checkpointer
from preemptible.cli import main
from preemptible.store import checksum, layout

EXAMPLES = int(os.environ.get("PREEMPTIBLE_FUZZ_EXAMPLES", "60"))
REPORT = os.environ.get("PREEMPTIBLE_FUZZ_REPORT")  # read at import: the tests run with PREEMPTIBLE_* scrubbed
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI is not a lottery; the long run widens the net
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
STEP1, STEP2 = "step-000000000001", "step-000000000002"
TENSOR_FILE = "model.safetensors"


def live_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    return {"model": model, "optimizer": opt, "meta": {"epoch": 0, "name": "x", "history": [1.5, 2.5]}}


def train(state: dict[str, Any], steps: int) -> None:
    for _ in range(steps):
        state["model"](torch.ones(2, 4)).pow(2).sum().backward()
        state["optimizer"].step()
        state["optimizer"].zero_grad()
    state["meta"]["epoch"] += steps


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    root = tmp_path_factory.mktemp("fuzz-base")
    state = live_state()
    ck = Checkpointer(str(root), keep=5)
    train(state, 1)
    ck.save(state, 1)
    expected = {k: v.clone() for k, v in state["model"].state_dict().items()}
    train(state, 1)
    ck.save(state, 2)
    return root, expected


_tried: dict[str, int] = {}


def _report() -> None:
    if REPORT:
        with open(REPORT, "a") as f:
            f.write(json.dumps(_tried) + "\n")


def reseal(step_dir: Path, doc: Any) -> None:
    """Write ``doc`` as COMMIT.json with whatever sizes, checksums and seal an attacker can recompute."""
    if isinstance(doc, dict) and isinstance(doc.get("files"), dict):
        for name in list(doc["files"]):
            p = step_dir / name
            if isinstance(name, str) and "/" not in name and p.is_file():
                doc["files"][name] = {"bytes": p.stat().st_size, "checksum": checksum.of_bytes(p.read_bytes())}
        doc.pop(layout.SELF_CHECKSUM, None)
        # with a Deep inside, the seal covers its placeholder: such a manifest is refused for its checksum or depth
        doc[layout.SELF_CHECKSUM] = layout.seal(json.loads(json.dumps(doc, default=lambda o: o.placeholder)))[
            layout.SELF_CHECKSUM
        ]
    (step_dir / layout.COMMIT).write_text(dumps(doc))


def check_restore(root: Path, expected: dict[str, torch.Tensor], kind: str) -> None:
    _tried[kind] = _tried.get(kind, 0) + 1
    before = {p.name: p.read_bytes() for p in (root / STEP1).iterdir()}
    live = live_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = Checkpointer(str(root)).restore(live)
    assert got in (1, 2), got
    if got == 1:
        assert all(torch.equal(v, live["model"].state_dict()[k]) for k, v in expected.items())
    after = {p.name: p.read_bytes() for p in (root / STEP1).iterdir()}
    assert {k: v for k, v in after.items() if k != layout.VALID} == {
        k: v for k, v in before.items() if k != layout.VALID
    }, "the older, good checkpoint changed"
    assert not (root / STEP1 / layout.INVALID).exists()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["inspect", str(root)]) == 0
        assert main(["verify", "--no-mark", str(root)]) in (0, 1)


def tampered(base: tuple[Path, dict[str, torch.Tensor]], edit: Callable[[Path], None], kind: str) -> None:
    root, expected = base
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        work = Path(tmp) / "root"
        shutil.copytree(root, work)
        edit(work / STEP2)
        check_restore(work, expected, kind)


# values -------------------------------------------------------------------------------------------------------
HUGE = st.sampled_from([10**30, 2**63, 2**64 + 1, -(2**63) - 1, 10**400, -1, 2**62, 2**31])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    HUGE,
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["F32", "I64", "BF16", "V8", "<f8", "|i1", "float32", "$tensor", "../x", "model/weight"]),
)
TAGS = st.sampled_from(["$float", "$tuple", "$dict", "$tensor", "$ndarray", "$npscalar", "$bytes", "$dtype", "$meta"])


def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    return st.recursive(
        SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.text(max_size=6), inner, max_size=4),
            st.builds(lambda tag, v: {tag: v}, TAGS, inner),
            st.builds(lambda tag, v, w: {tag: v, "value": w}, TAGS, inner, inner),
        ),
        max_leaves=max_leaves,
    )


class Deep:
    """Stands for ``depth`` nested lists until written (a short repr, for hypothesis's report)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def __repr__(self) -> str:
        return f"Deep({self.depth})"

    @property
    def placeholder(self) -> str:
        return f"@deep{self.depth}@"


def dumps(doc: Any) -> str:
    """JSON text of ``doc`` with each `Deep` written out in full (deeper than json.dumps itself can go)."""
    text = json.dumps(doc, default=lambda o: o.placeholder)
    return re.sub(r'"@deep(\d+)@"', lambda m: "[" * int(m[1]) + "1" + "]" * int(m[1]), text)


PATHS = st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=5)


def replace_at(doc: Any, path: list[int], value: Any) -> Any:
    """Replace the node reached by following ``path`` (each number picks a child modulo their count)."""
    if not path or not isinstance(doc, (dict, list)) or not doc:
        return value
    keys = list(doc) if isinstance(doc, dict) else list(range(len(doc)))
    key = keys[path[0] % len(keys)]
    doc[key] = replace_at(doc[key], path[1:], value)
    return doc


REPLACEMENTS = st.one_of(json_values(), st.integers(min_value=90, max_value=3000).map(Deep))


# strategies ---------------------------------------------------------------------------------------------------
@FUZZ
@given(path=PATHS, value=REPLACEMENTS, drop=st.booleans())
def test_generated_manifests(base: Any, path: list[int], value: Any, drop: bool) -> None:
    def edit(step_dir: Path) -> None:
        doc = json.loads((step_dir / layout.COMMIT).read_text())
        if drop and isinstance(doc, dict):
            doc.pop(sorted(doc)[path[0] % len(doc)])
        else:
            doc = replace_at(doc, path, value)
        reseal(step_dir, doc)

    tampered(base, edit, "manifest")


@FUZZ
@given(path=PATHS, value=REPLACEMENTS, extra=st.dictionaries(st.text(max_size=8), json_values(6), max_size=2))
def test_generated_tensor_headers(base: Any, path: list[int], value: Any, extra: dict[str, Any]) -> None:
    def edit(step_dir: Path) -> None:
        p = step_dir / TENSOR_FILE
        raw = p.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        header = replace_at(header, path, value)
        if isinstance(header, dict):
            header.update(extra)
        head = dumps(header).encode()
        p.write_bytes(len(head).to_bytes(8, "little") + head + raw[8 + n :])
        reseal(step_dir, json.loads((step_dir / layout.COMMIT).read_text()))

    tampered(base, edit, "tensor header")


@FUZZ
@given(path=PATHS, value=REPLACEMENTS)
def test_generated_state_documents(base: Any, path: list[int], value: Any) -> None:
    def edit(step_dir: Path) -> None:
        p = step_dir / layout.STATE
        doc = replace_at(json.loads(p.read_text()), path, value)
        p.write_text(dumps(doc))
        reseal(step_dir, json.loads((step_dir / layout.COMMIT).read_text()))

    tampered(base, edit, "state document")


DAMAGE = st.tuples(
    st.sampled_from([TENSOR_FILE, layout.STATE, layout.COMMIT]),
    st.floats(min_value=0, max_value=1),
    st.sampled_from(["flip", "truncate", "insert", "zero"]),
    st.binary(min_size=1, max_size=64),
    st.booleans(),
)


def damage_bytes(p: Path, where: float, action: str, junk: bytes) -> None:
    """Flip a bit, truncate, insert ``junk`` or zero bytes at ``where`` (a fraction of the file's length)."""
    raw = bytearray(p.read_bytes())
    i = min(int(where * len(raw)), max(len(raw) - 1, 0))
    if action == "flip" and raw:
        raw[i] ^= 1 << (junk[0] % 8)
    elif action == "truncate":
        del raw[i:]
    elif action == "insert":
        raw[i:i] = junk
    elif action == "zero":
        raw[i : i + len(junk)] = bytes(len(junk))
    p.write_bytes(bytes(raw))


@FUZZ
@given(damage=DAMAGE)
def test_generated_byte_damage(base: Any, damage: tuple[str, float, str, bytes, bool]) -> None:
    name, where, action, junk, seal = damage

    def edit(step_dir: Path) -> None:
        damage_bytes(step_dir / name, where, action, junk)
        if seal and name != layout.COMMIT:
            reseal(step_dir, json.loads((step_dir / layout.COMMIT).read_text()))

    tampered(base, edit, "byte damage")


def test_zz_report_the_number_tried() -> None:
    """Runs last in this module (pytest keeps file order): the count goes to the log and the report file."""
    _report()
    print(f"generated hostile checkpoints tried: {_tried}")
