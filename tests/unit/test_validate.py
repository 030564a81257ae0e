"""Resume you can trust: probe loss, fallback, quarantine, read-back, extra files, corruption detection."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import journal, make_model, train_some
from faults import FaultyStorage
from preemptible import CheckpointCorruptError, Checkpointer, Run, SaveError
from preemptible.cli import main
from preemptible.errors import CheckpointFallbackWarning
from preemptible.journal import Journal
from preemptible.state import capture, flatten
from preemptible.store import checksum, layout
from preemptible.store import format as tensor_format
from preemptible.store.io import LocalStorage
from preemptible.validate import run_probe

X = torch.randn(16, 8, generator=torch.Generator().manual_seed(42))


def setup(seed: int = 0) -> tuple[dict[str, Any], Any]:
    model = make_model(seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return {"model": model, "optimizer": opt}, (lambda: model(X).square().mean())


def forge(step_dir: Path, mutate: Any) -> None:
    """Rewrite a tensor file with altered values and a manifest that matches it: checksums pass, values lie."""
    path = step_dir / "model.safetensors"
    data = path.read_bytes()
    tensors = tensor_format.read(__import__("io").BytesIO(data), len(data), where=str(path))
    mutate(tensors)

    class Sink:
        def __init__(self) -> None:
            self.parts: list[bytes] = []

        def write(self, d: memoryview) -> None:
            self.parts.append(bytes(d))

    sink = Sink()
    nbytes, digest, _ = tensor_format.write(sink, list(tensors.items()), {"format": "pt"})
    path.write_bytes(b"".join(sink.parts))
    manifest = json.loads((step_dir / "COMMIT.json").read_text())
    manifest["files"]["model.safetensors"] = {"bytes": nbytes, "checksum": digest}
    (step_dir / "COMMIT.json").write_text(json.dumps(layout.seal(manifest)))


def test_probe_is_stored_and_checked(tmp_path: Path) -> None:
    state, probe = setup()
    train_some(state["model"], state["optimizer"], 2)
    ck = Checkpointer(str(tmp_path), probe=probe)
    ck.save(state, 2)
    manifest = json.loads((tmp_path / "step-000000000002" / "COMMIT.json").read_text())
    assert manifest["probe"] == pytest.approx(run_probe(probe, state))  # eval mode: no dropout
    fresh, fresh_probe = setup(seed=3)
    assert Checkpointer(str(tmp_path), probe=fresh_probe).restore(fresh) == 2
    valid = json.loads((tmp_path / "step-000000000002" / "VALID.json").read_text())
    assert valid["probe"]["stored"] == manifest["probe"]
    assert valid["probe"]["recomputed"] == pytest.approx(manifest["probe"], rel=1e-6)


def test_probe_mismatch_falls_back_and_marks_invalid(tmp_path: Path) -> None:
    state, probe = setup()
    ck = Checkpointer(str(tmp_path), probe=probe, keep=3)
    train_some(state["model"], state["optimizer"], 1)
    ck.save(state, 1)
    expected = {k: v.clone() for k, v in state["model"].state_dict().items()}
    train_some(state["model"], state["optimizer"], 1, start=1)
    ck.save(state, 2)
    forge(tmp_path / "step-000000000002", lambda t: t["model/0.weight"].mul_(1.5))  # wrong weights, valid sums
    assert Checkpointer(str(tmp_path)).verify(2).bytes > 0  # checksums alone cannot tell
    fresh, fresh_probe = setup(seed=7)
    restorer = Checkpointer(str(tmp_path), probe=fresh_probe, journal=Journal(LocalStorage(str(tmp_path))))
    with pytest.warns(CheckpointFallbackWarning, match="probe loss mismatch: stored"):
        assert restorer.restore(fresh) == 1
    assert all(torch.equal(v, fresh["model"].state_dict()[k]) for k, v in expected.items())
    infos = {c.step: c for c in restorer.checkpoints()}
    assert infos[2].status == "invalid" and "probe loss mismatch" in (infos[2].invalid or "")
    assert infos[1].status == "validated"
    event = next(e for e in journal(tmp_path) if e["event"] == "checkpoint_invalid")
    assert event["stored_probe"] != pytest.approx(event["recomputed_probe"])
    restorer.save(fresh, 2)  # an invalid step is replaced by a new save of that step, not skipped
    assert not (tmp_path / "step-000000000002" / "INVALID.json").exists()


def test_probe_tolerance_is_configurable(tmp_path: Path) -> None:
    state, probe = setup()
    Checkpointer(str(tmp_path), probe=probe).save(state, 1)
    forge(tmp_path / "step-000000000001", lambda t: t["model/0.weight"].add_(1e-4))  # a small drift
    loose, loose_probe = setup(seed=1)
    assert Checkpointer(str(tmp_path), probe=loose_probe, probe_rtol=1e-2).restore(loose) == 1
    strict, strict_probe = setup(seed=2)
    with pytest.raises(CheckpointCorruptError, match="probe loss mismatch"):
        Checkpointer(str(tmp_path), probe=strict_probe, probe_rtol=1e-9).restore(strict, step=1)


def test_probe_never_changes_training(tmp_path: Path) -> None:
    def train(with_probe: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        random.seed(0)
        state, probe = setup()
        state["model"].train()
        run = Run(tmp_path / str(with_probe), save_every=2, probe=probe if with_probe else None, **state)
        for step in run.steps(6):
            train_some(state["model"], state["optimizer"], 1, start=step)  # dropout draws from the RNG
            assert state["model"].training
        return {k: v.clone() for k, v in state["model"].state_dict().items()}

    a, b = train(True), train(False)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_probe_restores_modes_and_rng() -> None:
    model = make_model()
    model.train()
    model[2].eval()  # a submodule deliberately in eval mode stays so
    before = torch.get_rng_state()
    value = run_probe(
        lambda: torch.nn.functional.dropout(model(X), 0.5, training=True).sum() * 0 + torch.rand(()), {"model": model}
    )
    assert isinstance(value, float)
    assert model.training and not model[2].training
    assert torch.equal(torch.get_rng_state(), before)


def test_nothing_validates_raises_or_quarantines_when_allowed(tmp_path: Path) -> None:
    state, probe = setup()
    ck = Checkpointer(str(tmp_path), probe=probe)
    ck.save(state, 1)
    ck.save(state, 2)
    for s in (1, 2):
        forge(tmp_path / f"step-{s:012d}", lambda t: t["model/0.bias"].add_(5.0))
    fresh, fresh_probe = setup(seed=1)
    with pytest.warns(CheckpointFallbackWarning), pytest.raises(CheckpointCorruptError) as info:
        Run(tmp_path, probe=fresh_probe, **fresh).steps(3).__next__()
    assert [s for s, _ in info.value.failures] == [2, 1]
    fresh, fresh_probe = setup(seed=1)
    run = Run(tmp_path, probe=fresh_probe, allow_fresh_start=True, **fresh)
    with pytest.warns(CheckpointFallbackWarning):
        steps = list(run.steps(3))
    assert steps == [0, 1, 2]
    quarantined = list((tmp_path / "quarantine").glob("*/step-*"))
    assert sorted(p.name for p in quarantined) == ["step-000000000001", "step-000000000002"]
    assert any(e["event"] == "fresh_after_corruption" for e in journal(tmp_path))


class FlippingStorage(FaultyStorage):
    """Storage that silently flips a bit in what it writes (what read-back verification exists for)."""

    def open_write(self, path: str) -> Any:
        inner = LocalStorage.open_write(self, path)
        outer = self

        class Writer:
            def write(self, data: memoryview) -> None:
                if path.endswith(".safetensors") and len(data) > 100 and not outer.flipped:
                    damaged = bytearray(data)
                    damaged[len(damaged) // 2] ^= 0x10
                    outer.flipped = True
                    inner.write(memoryview(damaged))
                else:
                    inner.write(data)

            def close(self) -> None:
                inner.close()

            def abort(self) -> None:
                inner.abort()

        return Writer()

    flipped = False


def test_read_back_verification_catches_storage_that_alters_data(tmp_path: Path) -> None:
    state, _ = setup()
    train_some(state["model"], state["optimizer"], 1)
    ok = Checkpointer(str(tmp_path / "ok"), verify_after_save=True).save(state, 1).wait()
    assert "read_back" in ok.timings
    bad = Checkpointer(str(tmp_path / "bad"), verify_after_save=True, storage=FlippingStorage(str(tmp_path / "bad")))
    with pytest.raises(SaveError, match="read-back verification"):
        bad.save(state, 1)
    assert not (tmp_path / "bad" / "step-000000000001").exists()
    unverified = Checkpointer(str(tmp_path / "unverified"), storage=FlippingStorage(str(tmp_path / "unverified")))
    unverified.save(state, 1)  # without read-back the flip lands on disk...
    with pytest.raises(CheckpointCorruptError):
        unverified.verify(1)  # ...and the next load catches it (a bad header or a checksum mismatch)


def test_extra_files_warn_and_are_ignored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state, _ = setup()
    ck = Checkpointer(str(tmp_path))
    ck.save(state, 1)
    (tmp_path / "step-000000000001" / "notes.txt").write_text("left by a person")
    with pytest.warns(CheckpointFallbackWarning, match="notes.txt"):
        assert ck.restore(setup(seed=1)[0]) == 1
    assert main(["verify", str(tmp_path)]) == 0
    assert "extra file not in COMMIT.json (ignored): notes.txt" in capsys.readouterr().out


CORRUPTIONS = ["flip", "truncate", "delete", "garbage-commit", "future-version", "escape-path", "flip-commit"]


def corrupt(step_dir: Path, kind: str, rng: random.Random) -> None:
    files = sorted(p for p in step_dir.iterdir() if p.name not in ("COMMIT.json", "VALID.json"))
    target = rng.choice(files)
    commit = step_dir / "COMMIT.json"
    if kind == "flip":
        data = bytearray(target.read_bytes())
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(data))
    elif kind == "truncate":
        os.truncate(target, rng.randrange(target.stat().st_size))
    elif kind == "delete":
        target.unlink()
    elif kind == "garbage-commit":
        commit.write_bytes(os.urandom(64))
    elif kind == "future-version":
        doc = json.loads(commit.read_text())
        doc["format_version"] = layout.FORMAT_VERSION + 1
        commit.write_text(json.dumps(layout.seal(doc)))
    elif kind == "escape-path":
        doc = json.loads(commit.read_text())
        doc["files"]["../../etc/passwd"] = doc["files"].pop(target.name)
        commit.write_text(json.dumps(layout.seal(doc)))
    elif kind == "flip-commit":
        data = bytearray(commit.read_bytes())
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
        commit.write_bytes(bytes(data))


def test_every_corruption_is_detected(tmp_path: Path) -> None:
    """A sweep: every kind of damage, at random places, on a fresh checkpoint each time; verify must fail and
    restore must fall back to the intact older checkpoint."""
    rng = random.Random(1234)
    state, _ = setup()
    train_some(state["model"], state["optimizer"], 1)
    trials = detected = 0
    for kind in CORRUPTIONS:
        for trial in range(4):
            root = tmp_path / f"{kind}-{trial}"
            ck = Checkpointer(str(root), keep=3)
            ck.save(state, 1)
            ck.save(state, 2)
            corrupt(root / "step-000000000002", kind, rng)
            trials += 1
            try:
                ck.verify(2)
            except (CheckpointCorruptError, FileNotFoundError):
                detected += 1
            with pytest.warns(CheckpointFallbackWarning):
                got = Checkpointer(str(root)).restore(setup(seed=5)[0])
            assert got == 1, f"{kind}: restored {got}"
    assert detected == trials, f"detected {detected} of {trials}"


def small_fs(tmp_path: Path) -> tuple[Path, Any]:
    """A real 6 MB file system (tmpfs) when this machine lets us mount one; else the injected ENOSPC layer."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True, check=False
    )
    if done.returncode == 0:
        return mnt, lambda: subprocess.run(["umount", str(mnt)], check=False)
    return mnt, None


def test_full_disk_during_save(tmp_path: Path) -> None:
    mnt, unmount = small_fs(tmp_path)
    try:
        small = make_model(hidden=8)
        big = torch.nn.Linear(1500, 1500)  # 9 MB of weights: cannot fit in 6 MB
        storage = None if unmount else FaultyStorage(str(mnt), fail_after=6 << 20)
        if storage is not None:
            storage.fail_after = 6 << 20
        ck = Checkpointer(str(mnt / "ckpt"), storage=storage)
        ck.save({"model": small}, 1)
        with pytest.raises(SaveError) as info:
            ck.save({"model": big}, 2)
        if unmount:
            assert "no space left" in str(info.value) and "step 1 remains the newest checkpoint" in str(info.value)
        assert not (mnt / "ckpt" / "step-000000000002").exists()
        assert ck.restore({"model": make_model(hidden=8, seed=3)}) == 1  # the older checkpoint is intact
    finally:
        if unmount:
            unmount()


def test_inspect_and_verify_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state, _ = setup()
    ck = Checkpointer(str(tmp_path), keep=3)
    for s in (1, 2, 3):
        ck.save(state, s)
    (tmp_path / "step-000000000004").mkdir()  # a leftover
    corrupt(tmp_path / "step-000000000003", "flip", random.Random(0))
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["status"]) for r in doc["checkpoints"]] == [
        (1, "committed"),
        (2, "committed"),
        (3, "committed"),
        (4, "uncommitted"),
    ]
    assert main(["verify", str(tmp_path), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert [r["ok"] for r in result["checkpoints"]] == [True, True, False]
    assert main(["verify", str(tmp_path), "--step", "2"]) == 0
    assert "PASS  step 2" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "validated" in out and "uncommitted" in out


def test_checksum_helper_matches_files(tmp_path: Path) -> None:
    state, _ = setup()
    Checkpointer(str(tmp_path)).save(state, 1)
    doc = json.loads((tmp_path / "step-000000000001" / "COMMIT.json").read_text())
    for name, rec in doc["files"].items():
        assert checksum.of_bytes((tmp_path / "step-000000000001" / name).read_bytes()) == rec["checksum"]
    assert len(flatten(capture(state)).tensors) > 0


def test_every_single_bit_flip_of_commit_json_is_detected(tmp_path: Path) -> None:
    from preemptible.store.layout import Manifest

    state, _ = setup()
    train_some(state["model"], state["optimizer"], 1)
    Checkpointer(str(tmp_path)).save(state, 2)
    raw = (tmp_path / "step-000000000002" / "COMMIT.json").read_bytes()
    missed = []
    for i in range(len(raw)):
        for bit in range(8):
            flipped = bytearray(raw)
            flipped[i] ^= 1 << bit
            try:
                Manifest.from_json(bytes(flipped), where="COMMIT.json", expect_step=2)
            except CheckpointCorruptError:
                continue
            missed.append((i, bit))
    assert missed == [], f"{len(missed)} of {len(raw) * 8} flips went unnoticed"
