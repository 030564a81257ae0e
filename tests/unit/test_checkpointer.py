from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import make_model, train_some
from preemptible import (
    CheckpointCorruptError,
    Checkpointer,
    CheckpointNotFoundError,
    RNGState,
    StateMismatchError,
    UnsupportedStateError,
)
from preemptible.errors import CheckpointFallbackWarning
from preemptible.store.layout import seal


def build(seed: int = 0, hidden: int = 16) -> dict[str, Any]:
    model = make_model(hidden=hidden, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return {"model": model, "optimizer": opt, "scheduler": sched, "rng": RNGState(), "extras": {}}


def advance(state: dict[str, Any], steps: int, start: int = 0) -> None:
    for s in range(start, start + steps):
        train_some(state["model"], state["optimizer"], 1, start=s)
        state["scheduler"].step()


def snapshot(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    out = {f"model/{k}": v.clone() for k, v in state["model"].state_dict().items()}
    for pid, st in state["optimizer"].state_dict()["state"].items():
        for k, v in st.items():
            out[f"opt/{pid}/{k}"] = v.clone()
    return out


def save_steps(ck: Checkpointer, state: dict[str, Any], steps: list[int]) -> None:
    done = 0
    for s in steps:
        advance(state, s - done, start=done)
        done = s
        ck.save(state, s)


def test_restore_on_empty_root_returns_none(tmp_path: Path) -> None:
    ck = Checkpointer(str(tmp_path / "does-not-exist-yet"))
    assert ck.restore(build()) is None
    assert ck.checkpoints() == []


def test_roundtrip_then_training_continues_bit_identically(tmp_path: Path) -> None:
    a = build()
    advance(a, 3)
    a["extras"].update({"epoch": 1, "best": float("inf"), 5: (1, 2)})
    ck = Checkpointer(str(tmp_path))
    result = ck.save(a, 3).wait()
    assert result.bytes > 0
    assert not result.skipped
    advance(a, 4, start=3)  # the uninterrupted run goes on

    b = build(seed=123)  # different initial weights, fresh optimizer without state
    assert ck.restore(b) == 3
    assert b["extras"] == {"epoch": 1, "best": float("inf"), 5: (1, 2)}
    assert b["scheduler"].state_dict() == {**b["scheduler"].state_dict(), "last_epoch": 3}
    advance(b, 4, start=3)
    sa, sb = snapshot(a), snapshot(b)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert a["scheduler"].state_dict() == b["scheduler"].state_dict()


def test_dropout_rng_is_restored(tmp_path: Path) -> None:
    state = {"rng": RNGState()}
    ck = Checkpointer(str(tmp_path))
    torch.manual_seed(5)
    ck.save(state, 1)
    expected = torch.nn.functional.dropout(torch.ones(1000), 0.5)
    torch.manual_seed(99)
    ck.restore(state)
    assert torch.equal(torch.nn.functional.dropout(torch.ones(1000), 0.5), expected)


def test_saving_a_committed_step_again_is_a_noop(tmp_path: Path) -> None:
    state = build()
    ck = Checkpointer(str(tmp_path))
    ck.save(state, 1)
    mtime = os.stat(tmp_path / "step-000000000001" / "COMMIT.json").st_mtime_ns
    again = ck.save(state, 1).wait()
    assert again.skipped
    assert again.bytes == 0
    assert os.stat(tmp_path / "step-000000000001" / "COMMIT.json").st_mtime_ns == mtime


def test_rotation_deletes_only_after_a_newer_checkpoint_validated(tmp_path: Path) -> None:
    state = build()
    ck = Checkpointer(str(tmp_path), keep=2)
    save_steps(ck, state, [1, 2])
    assert ck.restore(build()) == 2  # validates step 2
    ck.save(state, 3)  # 1 may go: 2, newer, has validated
    assert [(c.step, c.status) for c in ck.checkpoints()] == [(2, "validated"), (3, "committed")]
    ck.save(state, 4)  # 4 and 3 are the keep newest, 2 the newest validated: nothing waits, nothing is read back
    assert [(c.step, c.status) for c in ck.checkpoints()] == [(2, "validated"), (3, "committed"), (4, "committed")]
    ck.save(state, 5)  # 3 waits for a newer one to validate: the save reads 5 back, validating it; 2 and 3 go
    assert [(c.step, c.status) for c in ck.checkpoints()] == [(4, "committed"), (5, "validated")]
    ck.save(state, 6)
    assert [c.step for c in ck.checkpoints()] == [5, 6]


def test_emergency_saves_never_rotate(tmp_path: Path) -> None:
    state = build()
    ck = Checkpointer(str(tmp_path), keep=2)
    save_steps(ck, state, [1, 2])
    for step in (3, 4):
        ck.save(state, step, reason="emergency")
    assert [(c.step, c.status) for c in ck.checkpoints()] == [(s, "committed") for s in (1, 2, 3, 4)]


def test_keep_below_two_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep >= 2"):
        Checkpointer(str(tmp_path), keep=1)


def corrupt_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: corrupt_last_byte(d / "model.safetensors"), id="flipped-bit"),
        pytest.param(lambda d: os.truncate(d / "optimizer.safetensors", 100), id="truncated"),
        pytest.param(lambda d: (d / "model.safetensors").unlink(), id="missing-file"),
        pytest.param(lambda d: corrupt_last_byte(d / "state.json"), id="state-json-flip"),
        pytest.param(lambda d: (d / "COMMIT.json").write_text("{garbage"), id="garbage-commit"),
    ],
)
def test_damaged_newest_falls_back_with_warning(tmp_path: Path, damage: Any) -> None:
    state = build()
    ck = Checkpointer(str(tmp_path), keep=3)
    save_steps(ck, state, [2, 4])
    expected = snapshot(state)  # values at step 4
    advance(state, 2, start=4)
    ck.save(state, 6)
    damage(tmp_path / "step-000000000006")
    fresh = build(seed=7)
    with pytest.warns(CheckpointFallbackWarning, match="step 6"):
        assert ck.restore(fresh) == 4
    got = snapshot(fresh)
    for k in expected:
        assert torch.equal(expected[k], got[k]), k
    assert not (tmp_path / "step-000000000006" / "VALID.json").exists()
    assert (tmp_path / "step-000000000004" / "VALID.json").exists()


def test_nothing_verifies_raises_listing_every_checkpoint(tmp_path: Path) -> None:
    state = build()
    ck = Checkpointer(str(tmp_path))
    save_steps(ck, state, [1, 2])
    corrupt_last_byte(tmp_path / "step-000000000001" / "model.safetensors")
    os.truncate(tmp_path / "step-000000000002" / "model.safetensors", 10)
    with pytest.warns(CheckpointFallbackWarning), pytest.raises(CheckpointCorruptError) as info:
        ck.restore(state)
    assert [s for s, _ in info.value.failures] == [2, 1]
    assert "step 2" in str(info.value)
    assert "step 1" in str(info.value)


def test_a_mismatch_is_found_before_any_live_tensor_changes(tmp_path: Path) -> None:
    state = build(hidden=16)
    advance(state, 2)
    ck = Checkpointer(str(tmp_path))
    ck.save(state, 2)
    other = build(hidden=16, seed=5)
    other["model"].add_module("head", torch.nn.Linear(2, 2))  # one extra layer: the rest would match
    before = snapshot(other)
    with pytest.raises(StateMismatchError):
        ck.restore(other)
    after = snapshot(other)
    assert all(torch.equal(before[k], after[k]) for k in before), "a refused restore touched live state"


def test_restore_reads_into_the_live_tensors(tmp_path: Path) -> None:
    state = build()
    advance(state, 2)
    ck = Checkpointer(str(tmp_path))
    ck.save(state, 2)
    other = build(seed=9)
    advance(other, 1)  # its optimizer has state tensors to read into
    params = {k: v.data_ptr() for k, v in other["model"].state_dict().items()}
    moments = {
        (pid, k): v.data_ptr()
        for pid, st in other["optimizer"].state_dict()["state"].items()
        for k, v in st.items()
        if v.dim() > 0
    }
    assert ck.restore(other) == 2
    assert {k: v.data_ptr() for k, v in other["model"].state_dict().items()} == params
    after = {
        (pid, k): v.data_ptr()
        for pid, st in other["optimizer"].state_dict()["state"].items()
        for k, v in st.items()
        if v.dim() > 0
    }
    assert after == moments, "optimizer moments were reallocated instead of read in place"
    expected, got = snapshot(state), snapshot(other)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_explicit_step(tmp_path: Path) -> None:
    state = build()
    ck = Checkpointer(str(tmp_path), keep=3)
    save_steps(ck, state, [1, 2])
    assert ck.restore(build(), step=1) == 1
    with pytest.raises(CheckpointNotFoundError, match="committed steps: \\[1, 2\\]"):
        ck.restore(build(), step=9)
    corrupt_last_byte(tmp_path / "step-000000000002" / "model.safetensors")
    with pytest.raises(CheckpointCorruptError, match="checksum mismatch"):
        ck.restore(build(), step=2)


def test_differently_shaped_model_names_every_difference(tmp_path: Path) -> None:
    state = build(hidden=16)
    advance(state, 1)
    ck = Checkpointer(str(tmp_path))
    ck.save(state, 1)
    other = build(hidden=12)
    with pytest.raises(StateMismatchError) as info:
        ck.restore(other)
    text = str(info.value)
    assert "model/0.weight: shape differs: [16, 8] float32 in checkpoint, [12, 8] float32 live" in text
    assert "model/0.bias" in text
    assert "model/3.weight" in text
    assert len(info.value.differences) == 3
    extra = build()
    extra["model"].add_module("head", torch.nn.Linear(2, 2))
    with pytest.raises(StateMismatchError, match=r"model/head\.weight: missing from checkpoint"):
        ck.restore(extra)
    with pytest.raises(StateMismatchError, match="ema: missing from checkpoint"):
        ck.restore({**build(), "ema": {}})


def test_partial_restore_of_some_entries(tmp_path: Path) -> None:
    state = build()
    advance(state, 2)
    ck = Checkpointer(str(tmp_path))
    ck.save(state, 2)
    model = make_model(seed=3)
    assert ck.restore({"model": model}) == 2
    for k, v in state["model"].state_dict().items():
        assert torch.equal(model.state_dict()[k], v)


def test_unsupported_leaf_is_an_error_at_first_save(tmp_path: Path) -> None:
    ck = Checkpointer(str(tmp_path))
    with pytest.raises(UnsupportedStateError) as info:
        ck.save({**build(), "extras": {"callback": print}}, 1)
    assert info.value.key == "extras/callback"
    assert ck.checkpoints(include_uncommitted=True) == []


def test_state_entries_are_checked(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedStateError, match="'weights' is a Tensor"):
        Checkpointer(str(tmp_path)).save({"weights": torch.zeros(2)}, 1)


def test_tied_weights_come_back_tied(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    ck = Checkpointer(str(tmp_path))
    ck.save({"model": {"sd": model.state_dict()}}, 1)
    header = json.loads((tmp_path / "step-000000000001" / "state.json").read_text())
    refs = header["tree"]["model"]["sd"]["$dict"]
    names = {k: v["$tensor"] for k, v in refs}
    assert names["0.weight"] == names["1.weight"]
    back: dict[str, Any] = {}
    ck.restore({"model": back})
    assert back["sd"]["0.weight"] is back["sd"]["1.weight"]


def test_leftovers_are_ignored_and_only_stale_ones_removed(tmp_path: Path) -> None:
    state = build()
    now = [time.time()]
    ck = Checkpointer(str(tmp_path), clock=lambda: now[0])
    ck.save(state, 1)
    for step in (2, 3):  # what a killed save leaves: files, no COMMIT.json
        d = tmp_path / f"step-{step:012d}"
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"partial")
    old = now[0] - 3600
    os.utime(tmp_path / "step-000000000002" / "model.safetensors", (old, old))
    os.utime(tmp_path / "step-000000000002", (old, old))
    assert [c.step for c in ck.checkpoints()] == [1]
    assert ck.restore(build()) == 1
    assert ck.cleanup() == [2]  # an hour old: gone
    assert (tmp_path / "step-000000000003").exists()  # young: may be another machine still writing
    now[0] += 16 * 60
    assert ck.cleanup() == [3]


def test_rewriting_a_step_replaces_its_leftovers(tmp_path: Path) -> None:
    d = tmp_path / "step-000000000001"
    d.mkdir(parents=True)
    (d / "stray.bin").write_bytes(b"x")
    ck = Checkpointer(str(tmp_path))
    ck.save(build(), 1)
    assert not (d / "stray.bin").exists()
    assert ck.restore(build()) == 1


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.update(format_version=99), "newer than this preemptible understands.*upgrade"),
        (lambda m: m["files"].update({"../escape.safetensors": {"bytes": 1, "checksum": "0"}}), "not a plain name"),
        (lambda m: m["files"].update({"/etc/passwd": {"bytes": 1, "checksum": "0"}}), "not a plain name"),
        (lambda m: m.update(step=7), "says step 7"),
        (lambda m: m.update(files={}), "non-empty 'files'"),
        (lambda m: m.update(checksum_algorithm="md5"), "checksum algorithm 'md5' is unknown"),
        (lambda m: _edit_sums(m, str.upper), "'sums': hex"),
        (lambda m: _edit_sums(m, lambda s: s[:-4] + "  00"), "'sums': hex"),
        (lambda m: _edit_sums(m, lambda s: s[:-1] + "g"), "'sums': hex"),
        (lambda m: _edit_sums(m, lambda s: ""), "'sums': hex"),
    ],
)
def test_hostile_manifests_are_refused(tmp_path: Path, edit: Any, message: str) -> None:
    ck = Checkpointer(str(tmp_path))
    ck.save(build(), 1)
    path = tmp_path / "step-000000000001" / "COMMIT.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(seal(doc)))  # a consistent manifest: each check must catch it on its own
    with pytest.warns(CheckpointFallbackWarning), pytest.raises(CheckpointCorruptError, match=message):
        ck.restore(build())


def _edit_sums(manifest: dict[str, Any], edit: Any) -> None:
    chunks = manifest["files"]["model.safetensors"]["chunks"]
    chunks["sums"] = edit(chunks["sums"])


def test_a_manifest_is_parsed_again_only_when_its_bytes_changed(tmp_path: Path) -> None:
    ck = Checkpointer(str(tmp_path))
    ck.save(build(), 1)
    first = ck.reader.manifest(1)
    assert ck.reader.manifest(1) is first  # the same bytes: the same checked manifest
    path = tmp_path / "step-000000000001" / "COMMIT.json"
    doc = json.loads(path.read_text())
    doc["timings"]["total"] = 123.0
    path.write_text(json.dumps(seal(doc)))
    again = ck.reader.manifest(1)
    assert again is not first and again.timings["total"] == 123.0
    path.write_text(path.read_text().replace('"step"', '"stop"'))  # altered after sealing: refused, not remembered
    with pytest.raises(CheckpointCorruptError, match=r"does not match its own checksum|integer step"):
        ck.reader.manifest(1)


def test_commit_json_keys_are_the_documented_ones(tmp_path: Path) -> None:
    ck = Checkpointer(str(tmp_path))
    state = build()
    advance(state, 1)
    ck.save(state, 4)
    doc = json.loads((tmp_path / "step-000000000004" / "COMMIT.json").read_text())
    assert set(doc) == {
        "manifest_checksum",
        "format_version",
        "step",
        "created",
        "world_size",
        "checksum_algorithm",
        "files",
        "probe",
        "timings",
        "predicted_save_s",
    }
    assert doc["step"] == 4
    assert doc["world_size"] == 1
    assert doc["checksum_algorithm"] == "xxh3-64"
    assert set(doc["files"]) == {"model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json"}
    for name, rec in doc["files"].items():
        assert (tmp_path / "step-000000000004" / name).stat().st_size == rec["bytes"]


def test_grad_scaler_and_stateful_objects_roundtrip(tmp_path: Path) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):  # grows the scale and its tracker
        scaler.scale(model(torch.ones(2, 8)).sum()).backward()
        scaler.step(opt)
        scaler.update()
    expected = scaler.state_dict()
    ck = Checkpointer(str(tmp_path))
    ck.save({"scaler": scaler}, 4)
    other = torch.amp.GradScaler("cpu")
    ck.restore({"scaler": other})
    assert other.state_dict() == expected
    assert other.get_scale() == scaler.get_scale()
