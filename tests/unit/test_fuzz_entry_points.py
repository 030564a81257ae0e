"""Every entry point that reads a checkpoint or a journal, on generated hostile roots (issue 50): restore, verify (with
and without ``--no-mark``), inspect, ``load()``, export (plain, ``--entry``, ``--format hf``) and report (``--json``,
``--html``, ``--png``), called in-process on roots whose newest checkpoint hypothesis tampered with as an attacker
can (resealed), or planted links and markers in. The roots: one process (plain and compressed) and 2-rank FSDP2
(plain and compressed, made once per module by real torchrun).

For every hostile root the invariants are:
- no traceback, no exception out of an entry point, no hang (pytest's timeout, a failure detector);
- nothing read through a link that leaves the root (an audit hook on ``open`` sees every file opened) and nothing
  written outside the root and the outputs given;
- no module imported from the root (a ``.py`` file planted there never runs);
- the older, healthy checkpoint is never marked invalid, and restore loads it, or the tampered one when the change
  was harmless.

Examples per strategy: ``PREEMPTIBLE_ENTRY_FUZZ_EXAMPLES`` (default 20 in CI; the documented long run uses 300).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz_reader import DAMAGE, PATHS, REPLACEMENTS, damage_bytes, dumps, json_values, replace_at

import preemptible
from preemptible import Checkpointer
from preemptible.cli import main
from preemptible.store import checksum, layout
from torchrunkit import Torchrun

EXAMPLES = int(os.environ.get("PREEMPTIBLE_ENTRY_FUZZ_EXAMPLES", "20"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
RESHARD = Path(__file__).parents[1] / "scripts" / "reshard.py"
STEP = "step-{:012d}"

# The audit hook: every file opened and every module imported while watching (audit hooks cannot be removed).
_seen: list[tuple[str, str, Any]] = []
_watching: list[bool] = [False]


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _watching[0]:
        return
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _seen.append(("open", os.fsdecode(args[0]), (args[1], args[2])))
    elif event == "import" and len(args) > 1 and isinstance(args[1], str):
        _seen.append(("import", args[1], args[0]))


sys.addaudithook(_hook)


@contextlib.contextmanager
def watched() -> Iterator[list[tuple[str, str, Any]]]:
    _seen.clear()
    _watching[0] = True
    try:
        yield _seen
    finally:
        _watching[0] = False


def writes(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))


# roots ----------------------------------------------------------------------------------------------------------------
def single_state(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=0.1)}


def sharded_state() -> dict[str, Any]:
    """What tests/scripts/reshard.py trains, in one process: a 2-rank FSDP2 root restores into it resharded."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 37), torch.nn.ReLU(), torch.nn.Linear(37, 11), torch.nn.ReLU(), torch.nn.Linear(11, 1)
    )
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


class Root:
    def __init__(self, path: Path, old: int, new: int, state: Callable[[], dict[str, Any]], doc: str) -> None:
        self.path, self.old, self.new, self.state, self.doc = path, old, new, state, doc


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Root]:
    tmp = tmp_path_factory.mktemp("entry-fuzz")
    out: dict[str, Root] = {}
    for kind, kw in (("single", {}), ("single-zst", {"compress": True})):
        path = tmp / kind
        state = single_state()
        ck = Checkpointer(path, keep=5, **kw)
        ck.save(state, 1)
        state["model"](torch.ones(2, 4)).sum().backward()
        state["optimizer"].step()
        ck.save(state, 2)
        out[kind] = Root(path, 1, 2, single_state, layout.STATE)
    for kind, extra in (("fsdp", ()), ("fsdp-zst", ("--compress",))):
        path = tmp / kind
        for phase in ("save", "restore"):  # checkpoints of steps 3 and 5
            args = ["--wrap", "fsdp", "--phase", phase, "--out", str(tmp / f"{kind}.json"), *extra]
            code, _, err = Torchrun(path, 2, *args, script=RESHARD).finish(timeout=180)
            assert code == 0, err
        out[kind] = Root(path, 3, 5, sharded_state, "state-r00001.json")
    return out


KINDS = st.sampled_from(["single", "single-zst", "fsdp", "fsdp-zst"])


# every entry point --------------------------------------------------------------------------------------------------
def every_entry_point(root: Root, work: Path, out: Path, secret: Path) -> None:
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("inspect", lambda: main(["inspect", str(work)])),
        ("verify --no-mark", lambda: main(["verify", "--no-mark", str(work)])),
        ("load", lambda: preemptible.load(work)),
        ("load --entry", lambda: preemptible.load(work, entry="model")),
        ("load step", lambda: preemptible.load(work, step=root.new, entry="model")),
        ("export", lambda: main(["export", str(work), "--out", str(out / "plain")])),
        ("export --entry", lambda: main(["export", str(work), "--entry", "model", "--out", str(out / "entry")])),
        ("export --format hf", lambda: main(["export", str(work), "--format", "hf", "--out", str(out / "hf")])),
        ("report --json", lambda: main(["report", str(work), "--json"])),
        ("report --html", lambda: main(["report", str(work), "--html", str(out / "r.html")])),
        ("report --png", lambda: main(["report", str(work), "--png", str(out / "r.png")])),
        ("verify", lambda: main(["verify", str(work)])),
    ]
    text = io.StringIO()
    restored = None
    refused: list[str] = []
    with (
        watched() as seen,
        contextlib.redirect_stdout(text),
        contextlib.redirect_stderr(text),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        for name, call in calls:
            try:
                result = call()
            except (preemptible.errors.PreemptibleError, ValueError) as e:  # the API may refuse, with one message
                refused.append(f"{name}: {type(e).__name__}: {e}")
                continue
            assert not isinstance(result, int) or result in (0, 1, 2), f"{name} exited {result}"
        live = root.state()
        restored = Checkpointer(work).restore(live)
    assert all(r.startswith("load") for r in refused), refused  # only the API raises; the CLI says one line
    said = text.getvalue()
    assert "Traceback" not in said, said[-2000:]
    assert restored in (root.old, root.new), restored
    for kind, path, detail in seen:
        real = os.path.realpath(path)
        if kind == "import":
            assert not real.startswith(str(work)), f"imported {detail} from the root: {path}"
            continue
        assert not real.startswith(str(secret)), f"opened {path} -> {real}, outside the root"
        if writes(*detail) and not real.startswith((str(work), str(out), "/dev/null")) and "__pycache__" not in real:
            assert "matplotlib" in real or "fontlist" in real, f"wrote {path} outside the root and the outputs"
    old = work / STEP.format(root.old)
    invalid = old / layout.INVALID
    if invalid.exists():  # a marker counts only if it names the commit: then a healthy checkpoint was marked
        named = json.loads(invalid.read_text()).get("commit")
        assert named != checksum.of_bytes((old / layout.COMMIT).read_bytes()), "the healthy checkpoint marked invalid"


def tampered(roots: dict[str, Root], kind: str, edit: Callable[[Root, Path, Path], None]) -> None:
    root = roots[kind]
    with tempfile.TemporaryDirectory(prefix="entry-fuzz-") as tmp:
        work, out, secret = Path(tmp) / "root", Path(tmp) / "out", Path(tmp) / "secret"
        shutil.copytree(root.path, work)
        out.mkdir()
        secret.mkdir()
        (secret / "data.json").write_text('{"tree": {}, "reason": "outside"}')
        (work / "payload.py").write_text(f"open({str(secret / 'ran')!r}, 'w').close()\n")
        edit(root, work / STEP.format(root.new), secret)
        sys.path.insert(0, str(work))  # as `python -m` from inside the root would have it
        try:
            every_entry_point(root, work, out, secret)
        finally:
            sys.path.remove(str(work))
        assert not (secret / "ran").exists()


def reseal(step_dir: Path) -> None:
    doc = json.loads((step_dir / layout.COMMIT).read_text())
    for name in list(doc["files"]):
        p = step_dir / name
        if p.is_file():
            doc["files"][name] = {"bytes": p.stat().st_size, "checksum": checksum.of_bytes(p.read_bytes())}
    doc.pop(layout.SELF_CHECKSUM, None)
    (step_dir / layout.COMMIT).write_text(json.dumps(layout.seal(doc), indent=1))


# strategies ---------------------------------------------------------------------------------------------------------
@FUZZ
@given(kind=KINDS, path=PATHS, value=REPLACEMENTS, transformers=st.booleans())
def test_entry_points_on_generated_manifests(
    roots: dict[str, Root], kind: str, path: list[int], value: Any, transformers: bool
) -> None:
    def edit(root: Root, step_dir: Path, secret: Path) -> None:
        doc = json.loads((step_dir / layout.COMMIT).read_text())
        if transformers:  # a Hugging Face record naming the planted module, with a generated config
            doc["transformers"] = {"model": {"class": "Payload", "module": "payload", "config": {"model_type": "gpt2"}}}
            doc = replace_at(doc, [len(doc) - 1, *path], value)
        else:
            doc = replace_at(doc, path, value)
        if isinstance(doc, dict):
            doc.pop(layout.SELF_CHECKSUM, None)
            with contextlib.suppress(ValueError, TypeError, RecursionError):
                doc = layout.seal(json.loads(dumps(doc)))
        (step_dir / layout.COMMIT).write_text(dumps(doc))

    tampered(roots, kind, edit)


@FUZZ
@given(kind=KINDS, path=PATHS, value=REPLACEMENTS)
def test_entry_points_on_generated_state_documents_and_shard_records(
    roots: dict[str, Root], kind: str, path: list[int], value: Any
) -> None:
    def edit(root: Root, step_dir: Path, secret: Path) -> None:
        p = step_dir / root.doc
        doc = json.loads(p.read_text())
        target = doc.get("dtensors") if doc.get("dtensors") and path[0] % 2 else doc
        replace_at(target, path[1:] or [0], value)
        p.write_text(dumps(doc))
        reseal(step_dir)

    tampered(roots, kind, edit)


@FUZZ
@given(kind=KINDS, damage=DAMAGE)
def test_entry_points_on_generated_byte_damage(roots: dict[str, Root], kind: str, damage: Any) -> None:
    _, where, action, junk, seal = damage

    def edit(root: Root, step_dir: Path, secret: Path) -> None:
        files = sorted(n for n in os.listdir(step_dir) if n not in (layout.VALID, layout.INVALID))
        p = step_dir / files[int(where * 1000) % len(files)]
        damage_bytes(p, where, action, junk)
        if seal and p.name != layout.COMMIT:
            reseal(step_dir)

    tampered(roots, kind, edit)


PLANTS = st.tuples(
    st.sampled_from(["VALID.json", "INVALID.json", "COMMIT.json", "data", "doc"]),
    st.sampled_from(["link-out", "directory", "forged", "forged-commit", "empty"]),
    json_values(6),
)


@FUZZ
@given(kind=KINDS, plant=PLANTS)
def test_entry_points_on_planted_markers_and_links(roots: dict[str, Root], kind: str, plant: Any) -> None:
    """Markers left stale, copied or written by hand, and files that are links out of the root or directories."""
    which, how, content = plant

    def edit(root: Root, step_dir: Path, secret: Path) -> None:
        if which == "data":
            name = sorted(n for n in os.listdir(step_dir) if layout.is_tensor_file(n))[0]
        elif which == "doc":
            name = root.doc
        else:
            name = which
        p = step_dir / name
        commit = checksum.of_bytes((step_dir / layout.COMMIT).read_bytes())
        if p.exists() or p.is_symlink():
            p.unlink()
        if how == "link-out":
            os.symlink(secret / "data.json", p)
        elif how == "directory":
            p.mkdir()
        elif how == "empty":
            p.write_bytes(b"")
        else:
            body = content if isinstance(content, dict) else {"value": content}
            if how == "forged-commit":
                body = {**body, "commit": commit, "reason": "forged"}
            p.write_text(dumps(body))

    tampered(roots, kind, edit)


@FUZZ
@given(
    kind=st.sampled_from(["fsdp", "fsdp-zst"]),
    damaged=st.sets(st.sampled_from([3, 5])),
    where=st.tuples(st.integers(0, 1 << 20), st.integers(0, 1 << 20)),
    how=st.tuples(st.sampled_from([None, "VALID.json", "INVALID.json"]), st.booleans()),
)
def test_verify_of_a_sharded_root_marks_exactly_what_fails(
    roots: dict[str, Root], kind: str, damaged: set[int], where: tuple[int, int], how: tuple[str | None, bool]
) -> None:
    """Property: ``verify`` of a 2-rank FSDP2 root, with any of its checkpoints damaged and markers forged (naming no
    commit), passes exactly the intact ones and, unless ``--no-mark``, marks each by what its bytes are: validated
    when intact, invalid when damaged, each marker naming its commit; with ``--no-mark`` no marker changes."""
    root = roots[kind]
    which, at = where
    forge, no_mark = how
    with tempfile.TemporaryDirectory(prefix="entry-fuzz-") as tmp:
        work = Path(tmp) / "root"
        shutil.copytree(root.path, work)
        for step in damaged:
            d = work / STEP.format(step)
            files = sorted(p for p in d.iterdir() if layout.is_tensor_file(p.name))
            p = files[which % len(files)]
            raw = bytearray(p.read_bytes())
            raw[at % len(raw)] = (raw[at % len(raw)] + 1) % 256  # never undone
            p.write_bytes(bytes(raw))
        if forge is not None:
            (work / STEP.format(root.new) / forge).write_text(json.dumps({"reason": "forged", "checksums": True}))
        markers = {p: p.read_bytes() for p in work.glob("step-*/*.json") if p.name in (layout.VALID, layout.INVALID)}
        with contextlib.redirect_stdout(io.StringIO()) as said:
            code = main(["verify", str(work), *(["--no-mark"] if no_mark else [])])
        assert code == (1 if damaged else 0), said.getvalue()
        for step in (root.old, root.new):
            d = work / STEP.format(step)
            line = next(x for x in said.getvalue().splitlines() if f"step {step}" in x)
            assert line.startswith("FAIL" if step in damaged else "PASS"), line
            if no_mark:
                continue
            commit = checksum.of_bytes((d / layout.COMMIT).read_bytes())
            verdict = layout.INVALID if step in damaged else layout.VALID
            assert json.loads((d / verdict).read_text()).get("commit") == commit
            other = d / (layout.VALID if step in damaged else layout.INVALID)
            assert not other.exists() or json.loads(other.read_text()).get("commit") != commit
        if no_mark:
            now = {p: p.read_bytes() for p in work.glob("step-*/*.json") if p.name in (layout.VALID, layout.INVALID)}
            assert now == markers
