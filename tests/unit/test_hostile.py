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
