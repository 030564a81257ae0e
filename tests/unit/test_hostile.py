"""Hostile checkpoints and roots (issue 14): each case must be skipped with a reason and fall back, never crash,
hang or touch what was not judged. "Tampered" means the attacker also recomputed sizes, checksums and the seal."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from preemptible import Checkpointer
from preemptible.cli import main
from preemptible.errors import CheckpointFallbackWarning
from preemptible.store import checksum, layout


def state(v: float) -> dict[str, Any]:
    return {"w": {"t": torch.full((16,), v)}, "meta": {"v": v}}


def two_checkpoints(root: Path) -> Checkpointer:
    ck = Checkpointer(str(root), keep=3)
    ck.save(state(1.0), 1)
    ck.save(state(2.0), 2)
    return ck


def reseal(step_dir: Path, edit: Any) -> None:
    """Change COMMIT.json with ``edit(doc)`` and recompute what anyone can: file sizes, checksums, the seal."""
    doc = json.loads((step_dir / layout.COMMIT).read_text())
    edit(doc)
    for name in list(doc["files"]):
        p = step_dir / name
        if p.is_file():
            doc["files"][name] = {"bytes": p.stat().st_size, "checksum": checksum.of_bytes(p.read_bytes())}
    doc.pop(layout.SELF_CHECKSUM, None)
    (step_dir / layout.COMMIT).write_text(json.dumps(layout.seal(doc)))


def restores_step_1(root: Path) -> None:
    live = {"w": {"t": torch.zeros(16)}, "meta": {}}
    with pytest.warns(CheckpointFallbackWarning, match="step 2"):
        assert Checkpointer(str(root)).restore(live) == 1
    assert torch.equal(live["w"]["t"], torch.full((16,), 1.0))


def test_item_2_a_step_dir_with_non_ascii_digits_is_not_a_step_and_the_real_one_survives(tmp_path: Path) -> None:
    ck = Checkpointer(str(tmp_path), stale_after_s=60)
    ck.save(state(20.0), 20)
    ck.verify(20)
    fake = tmp_path / ("step-" + "\u0660" * 10 + "\u0662\u0660")  # Arabic-Indic digits for 20
    fake.mkdir()
    old = time.time() - 3600
    os.utime(fake, (old, old))
    assert layout.parse_step_dir(fake.name) is None
    assert layout.parse_step_dir("step-00000000020") is None  # wrong width
    ck.rotate()
    ck.cleanup()
    assert (tmp_path / "step-000000000020" / layout.VALID).exists()
    assert fake.exists()  # not judged, so not touched


def test_item_4_a_step_the_layout_cannot_hold_is_refused_not_saved_invisibly(tmp_path: Path) -> None:
    ck = Checkpointer(str(tmp_path))
    with pytest.raises(ValueError, match="the layout's width"):
        ck.save(state(1.0), 10**13)
    assert not list(tmp_path.glob("step-*"))


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["timings"].update(total=10**400),
        lambda d: d.update(probe=10**400),
        lambda d: d.update(predicted_save_s=-(10**400)),
    ],
    ids=["timings", "probe", "predicted"],
)
def test_item_5_a_tampered_manifest_with_huge_numbers_falls_back(tmp_path: Path, edit: Any) -> None:
    two_checkpoints(tmp_path)
    reseal(tmp_path / "step-000000000002", edit)
    restores_step_1(tmp_path)
    assert main(["inspect", str(tmp_path)]) == 0


def test_item_5_deep_nesting_or_a_directory_as_commit_falls_back_and_lists(tmp_path: Path) -> None:
    two_checkpoints(tmp_path)
    commit = tmp_path / "step-000000000002" / layout.COMMIT
    commit.write_text('{"format_version": 1, "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")
    restores_step_1(tmp_path)
    commit.unlink()
    commit.mkdir()  # a directory where COMMIT.json belongs
    assert [c.status for c in Checkpointer(str(tmp_path)).checkpoints()] in (
        ["validated", "unreadable"],
        ["validated", "invalid"],
    )
    restores_step_1(tmp_path)
    assert main(["verify", str(tmp_path)]) == 1  # one FAIL, no traceback


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["state.json", "w.safetensors"])
def test_item_6_a_fifo_in_a_checkpoint_never_hangs_restore(tmp_path: Path, name: str) -> None:
    two_checkpoints(tmp_path)
    step2 = tmp_path / "step-000000000002"
    (step2 / name).unlink()
    os.mkfifo(step2 / name)

    def edit(doc: dict[str, Any]) -> None:
        doc["files"][name] = {"bytes": 0, "checksum": checksum.of_bytes(b"")}  # a FIFO's size is 0

    reseal(step2, edit)
    restores_step_1(tmp_path)
    assert main(["verify", "--step", "2", str(tmp_path)]) == 1


def rewrite_header(path: Path, edit: Any) -> None:
    """Replace a safetensors file's JSON header with ``edit(header)`` (a dict, or raw bytes), keeping its data."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8 : 8 + n]), raw[8 + n :]
    new = edit(header)
    head = new if isinstance(new, bytes) else json.dumps(new).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + data)


DEEP = "@deep@"
"""In a rewritten state tree, stands for 5,000 nested lists (deeper than json.dumps itself can write)."""


def rewrite_state(path: Path, tree_edit: Any) -> None:
    doc = json.loads(path.read_text())
    doc["tree"] = tree_edit(doc["tree"])
    path.write_text(json.dumps(doc).replace(json.dumps(DEEP), "[" * 5000 + "1" + "]" * 5000))


def _empty_huge(shape: list[int]) -> Any:
    def edit(h: dict[str, Any]) -> dict[str, Any]:
        h["huge"] = {"dtype": "F32", "shape": shape, "data_offsets": [64, 64]}
        return h

    return edit


@pytest.mark.parametrize(
    "edit",
    [
        _empty_huge([0, 10**30]),
        _empty_huge([0, 2**62]),
        _empty_huge([0, 2**61, 3]),
        _empty_huge([0] * 100),
        lambda h: b"{" + b'"a":[' * 200_000 + b"]" * 200_000 + b"}",
    ],
    ids=["0x10^30", "0x2^62", "0x2^61x3", "100-dims", "200000-deep"],
)
def test_item_7_a_tensor_header_with_impossible_shapes_or_nesting_falls_back(tmp_path: Path, edit: Any) -> None:
    two_checkpoints(tmp_path)
    rewrite_header(tmp_path / "step-000000000002" / "w.safetensors", edit)
    reseal(tmp_path / "step-000000000002", lambda d: None)
    restores_step_1(tmp_path)


def _nest(depth: int, inner: Any, wrap: Any) -> Any:
    for _ in range(depth):
        inner = wrap(inner)
    return inner


@pytest.mark.parametrize(
    "tree_edit",
    [
        lambda t: {**t, "meta": {"v": _nest(900, 1, lambda x: {"k": x})}},
        lambda t: {**t, "meta": {"v": _nest(400, 1, lambda x: {"$tuple": [x]})}},
        lambda t: {**t, "meta": {"v": _nest(300, 1, lambda x: {"$dict": [[1, x]]})}},
        lambda t: {**t, "meta": {"v": {"$npscalar": "V8", "value": 5e10}}},
        lambda t: {**t, "meta": {"v": {"$npscalar": "V8", "value": 2e9}}},
        lambda t: {**t, "meta": {"v": {"$npscalar": "|i1", "value": 10**30}}},
        lambda t: {**t, "meta": {"v": {"$npscalar": "<f8", "value": {"$bytes": "AAAA"}}}},
        lambda t: {**t, "meta": {"v": {"$dict": [[[1], 2]]}}},
    ],
    ids=["900-deep", "400-tuples", "300-int-keys", "void-5e10", "void-2e9", "int8-10^30", "f8-bytes", "list-key"],
)
def test_item_7_a_state_document_too_deep_or_allocating_falls_back(tmp_path: Path, tree_edit: Any) -> None:
    two_checkpoints(tmp_path)
    rewrite_state(tmp_path / "step-000000000002" / layout.STATE, tree_edit)
    reseal(tmp_path / "step-000000000002", lambda d: None)
    restores_step_1(tmp_path)


def test_item_7_a_state_nested_deeper_than_a_reader_accepts_is_refused_at_save(tmp_path: Path) -> None:
    from preemptible.errors import UnsupportedStateError
    from preemptible.store.tagged_json import MAX_DEPTH

    deep: Any = 1
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(UnsupportedStateError, match="nested more than"):
        Checkpointer(str(tmp_path)).save({"meta": {"v": deep}}, 1)
    assert not list(tmp_path.glob("step-*"))
    ok: Any = 1
    for _ in range(MAX_DEPTH - 2):
        ok = [ok]
    Checkpointer(str(tmp_path)).save({"meta": {"v": ok}}, 1)
    live: dict[str, Any] = {"meta": {}}
    assert Checkpointer(str(tmp_path)).restore(live) == 1
    assert live["meta"]["v"] == ok


def model_and_optimizer() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    return {"model": model, "optimizer": opt}


@pytest.mark.parametrize(
    "tree_edit",
    [
        lambda t: {**t, "model": "a string"},
        lambda t: {**t, "model": [1, 2]},
        lambda t: {**t, "optimizer": {**t["optimizer"], "param_groups": 5}},
        lambda t: {**t, "optimizer": {**t["optimizer"], "param_groups": [{"params": "x"}]}},
        lambda t: {**t, "optimizer": {"state": t["optimizer"]["state"]}},
    ],
    ids=["model-str", "model-list", "groups-int", "groups-bad", "no-groups"],
)
def test_item_7_a_model_or_optimizer_entry_that_cannot_load_falls_back(tmp_path: Path, tree_edit: Any) -> None:
    objs = model_and_optimizer()
    ck = Checkpointer(str(tmp_path), keep=3)
    ck.save(objs, 1)
    ck.save(objs, 2)
    rewrite_state(tmp_path / "step-000000000002" / layout.STATE, tree_edit)
    reseal(tmp_path / "step-000000000002", lambda d: None)
    live = model_and_optimizer()
    with pytest.warns(CheckpointFallbackWarning, match="step 2"):
        assert Checkpointer(str(tmp_path)).restore(live) == 1
    assert torch.equal(live["model"].weight, objs["model"].weight)


RLIMIT_CHILD = """
import resource, sys, warnings
import torch
from preemptible import Checkpointer
def vm() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")
headroom = 384 << 20
resource.setrlimit(resource.RLIMIT_AS, (vm() + headroom, vm() + headroom))
live = {"w": {"t": torch.zeros(16)}, "meta": {}}
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    step = Checkpointer(sys.argv[1], threads=1).restore(live)
assert torch.equal(live["w"]["t"], torch.full((16,), 1.0)), live
print("restored", step)
try:
    bytearray(1 << 30)  # the limit holds: a 1 GiB allocation must fail here
except MemoryError:
    print("capped")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "hostile",
    [
        ("state", lambda t: {**t, "meta": {"v": {"$npscalar": "V8", "value": 2e9}}}),
        ("state", lambda t: {**t, "meta": {"v": [{"$npscalar": "V8", "value": 2e8}] * 50}}),
        ("state", lambda t: {**t, "meta": {"v": DEEP}}),
        ("header", _empty_huge([0, 2**40, 2**20])),
        ("header", lambda h: {**h, "w/t": {"dtype": "F32", "shape": [2**28], "data_offsets": [0, 2**30]}}),
    ],
    ids=["void-2e9", "void-50x2e8", "5000-deep", "empty-2^60", "claims-1GiB"],
)
def test_item_7_restore_past_a_hostile_checkpoint_stays_within_a_memory_cap(tmp_path: Path, hostile: Any) -> None:
    """RLIMIT_AS of the process's size + 384 MiB: any allocation a hostile file asks for beyond what the files
    hold would raise MemoryError (or kill the child); restore must fall back to step 1 inside the cap."""
    import subprocess
    import sys

    what, edit = hostile
    two_checkpoints(tmp_path)
    step2 = tmp_path / "step-000000000002"
    if what == "state":
        rewrite_state(step2 / layout.STATE, edit)
    else:
        rewrite_header(step2 / "w.safetensors", edit)
    reseal(step2, lambda d: None)
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", RLIMIT_CHILD, str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=110,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["restored", "1", "capped"]


def test_a_candidate_that_fails_half_way_through_loading_does_not_spoil_the_next(tmp_path: Path) -> None:
    """Found by the fuzz suite: a flipped bit turned the optimizer's "step" into "stdp"; load_state_dict() took the
    state in and then raised, and the older checkpoint was compared against that altered live state."""
    objs = model_and_optimizer()
    ck = Checkpointer(str(tmp_path), keep=3)
    ck.save(objs, 1)
    ck.save(objs, 2)
    p = tmp_path / "step-000000000002" / layout.STATE
    head, _, tail = p.read_text().rpartition('"step"')  # the second parameter's only
    p.write_text(head + '"stdp"' + tail)
    reseal(tmp_path / "step-000000000002", lambda d: None)
    model = torch.nn.Linear(4, 2)
    live = {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=0.1)}  # no state yet: lazily made
    with pytest.warns(CheckpointFallbackWarning, match="step 2"):
        assert Checkpointer(str(tmp_path)).restore(live) == 1
    assert set(live["optimizer"].state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}


def test_item_3_a_step_dir_linking_out_of_the_root_is_refused_never_rotated_through(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    ck = Checkpointer(str(root), keep=2)
    ck.save(state(1.0), 1)
    import shutil

    shutil.copytree(root / "step-000000000001", outside)  # a real checkpoint's files, outside the root
    (root / "step-000000000005").symlink_to(outside, target_is_directory=True)
    before = sorted(p.name for p in outside.iterdir())
    infos = Checkpointer(str(root)).checkpoints(include_uncommitted=True)
    refused = [c for c in infos if c.status == "refused"]
    assert [c.step for c in refused] == [5] and "outside the root" in str(refused[0].refused)
    assert [c.step for c in Checkpointer(str(root)).checkpoints()] == [1]
    for step in (7, 8, 9):  # commits, validates and rotates: must not touch what the link points to
        ck.save(state(float(step)), step)
    assert sorted(p.name for p in outside.iterdir()) == before
    assert (root / "step-000000000005").is_symlink()
    live = state(0.0)
    assert Checkpointer(str(root)).restore(live) == 9
    assert main(["inspect", str(root)]) == 0


@pytest.mark.parametrize("name", ["w.safetensors", "state.json"])
def test_item_3_a_file_linking_out_of_the_root_is_never_read(tmp_path: Path, name: str) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    two_checkpoints(root)
    outside.mkdir()
    step2 = root / "step-000000000002"
    (outside / name).write_bytes((step2 / name).read_bytes())  # identical bytes: sizes and checksums still match
    (step2 / name).unlink()
    (step2 / name).symlink_to(outside / name)
    reseal(step2, lambda d: None)
    live = {"w": {"t": torch.zeros(16)}, "meta": {}}
    with pytest.warns(CheckpointFallbackWarning, match="outside the checkpoint root"):
        assert Checkpointer(str(root)).restore(live) == 1
    assert main(["verify", "--step", "2", str(root)]) == 1


def test_item_3_the_root_itself_may_be_a_link(tmp_path: Path) -> None:
    real = tmp_path / "volume"
    real.mkdir()
    link = tmp_path / "ckpt"
    link.symlink_to(real, target_is_directory=True)
    ck = Checkpointer(str(link), keep=2)
    for step in (1, 2, 3):
        ck.save(state(float(step)), step)
    assert ck.root == str(real)
    assert sorted(p.name for p in real.iterdir() if p.name.startswith("step-")) == [
        "step-000000000002",
        "step-000000000003",
    ]
    live = state(0.0)
    assert Checkpointer(str(link)).restore(live) == 3


def test_a_root_that_is_a_file_is_a_clear_error_and_a_file_named_as_a_step_is_no_obstacle(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="expected a directory"):
        Checkpointer(str(tmp_path / "file"))
    with pytest.raises(NotADirectoryError, match="expected a directory"):
        Checkpointer("/dev/null")
    ck = Checkpointer(str(tmp_path / "root"))
    ck.save(state(1.0), 1)
    (tmp_path / "root" / "step-000000000002").write_text("junk where a step belongs")
    ck.save(state(2.0), 2)
    assert [c.step for c in ck.checkpoints()] == [1, 2]


def test_a_tensor_held_by_two_files_is_refused_and_the_older_checkpoint_restores(tmp_path: Path) -> None:
    ck = Checkpointer(str(tmp_path), keep=3)
    for step, v in ((1, 1.0), (2, 2.0)):
        ck.save({"w": {"t": torch.full((16,), v)}, "x": {"u": torch.full((16,), v)}}, step)
    step_dir = tmp_path / "step-000000000002"
    (step_dir / "x.safetensors").write_bytes((step_dir / "w.safetensors").read_bytes())  # x's file holds w/t too
    reseal(step_dir, lambda doc: None)
    live = {"w": {"t": torch.zeros(16)}, "x": {"u": torch.zeros(16)}}
    with pytest.warns(CheckpointFallbackWarning, match="'w/t' appears in more than one file"):
        assert Checkpointer(str(tmp_path)).restore(live) == 1
    assert torch.equal(live["w"]["t"], torch.full((16,), 1.0))


@pytest.mark.parametrize("entry", ["w", "x"])
def test_a_tree_naming_a_tensor_no_file_holds_is_refused_even_in_an_entry_not_restored(
    tmp_path: Path, entry: str
) -> None:
    """state.json (checksums recomputed) refers to a tensor that no tensor file holds: in an entry the live state
    restores, or in one it lacks. Either way the files were altered, and the older checkpoint restores."""
    ck = Checkpointer(str(tmp_path), keep=3)
    for step, v in ((1, 1.0), (2, 2.0)):
        ck.save({"w": {"t": torch.full((16,), v)}, "x": {"u": torch.full((16,), v)}}, step)
    step_dir = tmp_path / "step-000000000002"
    doc = json.loads((step_dir / layout.STATE).read_text())
    doc["tree"][entry] = {"t" if entry == "w" else "u": {"$tensor": f"{entry}/ghost"}}
    (step_dir / layout.STATE).write_text(json.dumps(doc))
    reseal(step_dir, lambda doc: None)
    live = {"w": {"t": torch.zeros(16)}}
    with pytest.warns(CheckpointFallbackWarning, match=f"'{entry}/ghost', which no tensor file"):
        assert Checkpointer(str(tmp_path)).restore(live) == 1
    assert torch.equal(live["w"]["t"], torch.full((16,), 1.0))
