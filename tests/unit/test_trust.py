"""Issue 50's breaks of the read side, each as a regression test that failed on c8d3508: a checkpoint (or the files
beside it) written by an attacker who can reseal it (recompute sizes, XXH3 checksums and the manifest's own
checksum) never runs code, never kills a healthy run, and is never reported verified when it was not checked.

The sharded cases (a 2-rank FSDP2 root made by torchrun) are in tests/e2e/test_trust_sharded.py.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import preemptible
from preemptible import Checkpointer
from preemptible.cli import main
from preemptible.errors import CheckpointFallbackWarning
from preemptible.store import checksum, layout

STEP = "step-{:012d}"


def commit_of(root: Path, step: int) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((root / STEP.format(step) / layout.COMMIT).read_text())
    return doc


def reseal(root: Path, step: int, doc: dict[str, Any]) -> None:
    """Write ``doc`` as the step's COMMIT.json, its files' sizes and checksums and its own checksum recomputed, as
    an attacker with write access to the root can."""
    directory = root / STEP.format(step)
    for name, rec in doc["files"].items():
        data = (directory / name).read_bytes()
        rec.update(bytes=len(data), checksum=checksum.of_bytes(data))
        rec.pop("chunks", None)
    doc.pop(layout.SELF_CHECKSUM, None)
    (directory / layout.COMMIT).write_text(json.dumps(layout.seal(doc), indent=1))


def small(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=0.1)}


def two_steps(root: Path, **kw: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Checkpoints of steps 1 and 2; the weights of step 1."""
    state = small()
    ck = Checkpointer(root, keep=5, **kw)
    ck.save(state, 1)
    at_1 = {k: v.clone() for k, v in state["model"].state_dict().items()}
    with torch.no_grad():
        state["model"].weight.add_(1)
    ck.save(state, 2)
    return state, at_1


def restored_step(root: Path) -> tuple[int | None, dict[str, torch.Tensor]]:
    state = small(seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointFallbackWarning)
        step = Checkpointer(root).restore(state)
    return step, state["model"].state_dict()


# item 4 ---------------------------------------------------------------------------------------------------------------
def test_regression_50_4_a_manifest_naming_two_stored_forms_of_one_file_is_a_content_failure_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """COMMIT.json listing both ``model.safetensors.zst`` and an injected ``model.safetensors``: verify failed the step
    but export wrote the injected tensors and exited 0."""
    root = tmp_path / "root"
    _, at_1 = two_steps(root, compress=True)
    d = root / STEP.format(2)
    assert (d / "model.safetensors.zst").exists()
    injected = tmp_path / "inj"
    Checkpointer(injected).save({"model": {"weight": torch.full((3, 4), 66.0), "bias": torch.zeros(3)}}, 1)
    (d / "model.safetensors").write_bytes((injected / STEP.format(1) / "model.safetensors").read_bytes())
    doc = commit_of(root, 2)
    doc["files"]["model.safetensors"] = {}
    reseal(root, 2, doc)

    assert main(["verify", str(root), "--step", "2", "--no-mark"]) == 1
    assert "two stored forms" in capsys.readouterr().out
    out = tmp_path / "out"
    with pytest.warns(CheckpointFallbackWarning, match="two stored forms"):
        assert main(["export", str(root), "--out", str(out)]) == 0
    assert "exported step 1" in capsys.readouterr().out  # fell back, and says which step it used
    from safetensors.torch import load_file

    assert torch.equal(load_file(out / "model.safetensors")["model/weight"], at_1["weight"])
    assert main(["export", str(root), "--step", "2", "--out", str(tmp_path / "o2")]) == 1
    assert not (tmp_path / "o2").exists() or not any((tmp_path / "o2").iterdir())
    assert restored_step(root)[0] == 1


# item 6 ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [10**9, 10**4000])
def test_regression_50_6_a_resealed_world_size_the_files_do_not_bear_out_falls_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], world: int
) -> None:
    """A resealed COMMIT.json with world_size 10^9 or 10^4000 (or 2, with no rank 1 files): MemoryError or
    OverflowError out of restore, no fallback, while verify said PASS. (A checkpoint with per-rank files is bound
    further: see test_a_world_size_must_match_the_per_rank_files.)"""
    root = tmp_path / "root"
    _, at_1 = two_steps(root)
    doc = commit_of(root, 2)
    doc["world_size"] = world
    reseal(root, 2, doc)
    assert main(["verify", str(root), "--step", "2", "--no-mark"]) == 1
    assert "world_size" in capsys.readouterr().out
    with pytest.warns(CheckpointFallbackWarning):
        assert torch.equal(preemptible.load(root, entry="model")["weight"], at_1["weight"])
    step, weights = restored_step(root)
    assert step == 1 and torch.equal(weights["weight"], at_1["weight"])


def test_a_world_size_must_match_the_per_rank_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint with per-rank files bounds its world size itself: every rank of the world has its files (a world
    of 100,000 with one rank's file made load() open 100,000 times)."""
    root = tmp_path / "root"
    two_steps(root)
    d = root / STEP.format(2)
    (d / "model.safetensors").rename(d / "model-r00003.safetensors")
    doc = commit_of(root, 2)
    doc["files"]["model-r00003.safetensors"] = doc["files"].pop("model.safetensors")
    for world in (1, 4, 7):
        doc["world_size"] = world
        reseal(root, 2, doc)
        assert main(["verify", str(root), "--step", "2", "--no-mark"]) == 1
        assert "does not match the per-rank files" in capsys.readouterr().out


# item 8 ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("marker", [layout.VALID, layout.INVALID])
def test_regression_50_8_a_marker_linking_out_of_the_root_counts_as_absent(tmp_path: Path, marker: str) -> None:
    """VALID.json or INVALID.json of the newest step as a link out of the root made restore() raise
    OutsideRootError: the run could not start."""
    root = tmp_path / "root"
    state, _ = two_steps(root)
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"reason": "forged", "validated_at": "x"}))
    os.symlink(outside, root / STEP.format(2) / marker)
    step, weights = restored_step(root)
    assert step == 2 and torch.equal(weights["weight"], state["model"].weight)
    assert outside.read_text().startswith('{"reason": "forged"')  # never written through
    info = [c for c in Checkpointer(root).checkpoints() if c.step == 2][0]
    # validated by the restore; no marker is written through a link, so a linked VALID.json leaves it committed
    assert info.status == ("committed" if marker == layout.VALID else "validated")
    assert main(["inspect", str(root)]) == 0


# item 9 ---------------------------------------------------------------------------------------------------------------
def emergency_steps(root: Path, steps: range) -> None:
    state = small()
    ck = Checkpointer(root, keep=2)
    for s in steps:
        ck.save(state, s, reason="emergency")  # emergency saves never rotate: every one stays, none validated


@pytest.mark.parametrize("forge", ["no-commit", "right-commit", "copied"])
def test_regression_50_9_a_forged_valid_json_never_lets_rotation_delete(tmp_path: Path, forge: str) -> None:
    """A forged VALID.json on the newest step was trusted by rotation: it deleted two older checkpoints. A marker
    names the commit it vouches for, and rotation deletes only on a validation this process made: not on one naming
    no commit, not on one naming the right commit (an attacker can hash COMMIT.json too), not on one copied from
    another root."""
    root = tmp_path / "root"
    emergency_steps(root, range(1, 5))
    newest = root / STEP.format(4)
    if forge == "no-commit":  # as c8d3508 wrote them
        body: dict[str, Any] = {"validated_at": "2026-01-01T00:00:00Z", "checksums": True, "by": "verify"}
    elif forge == "right-commit":
        commit = checksum.of_bytes((newest / "COMMIT.json").read_bytes())
        body = {"validated_at": "x", "checksums": True, "commit": commit}
    else:
        other = tmp_path / "other"
        emergency_steps(other, range(4, 5))
        assert main(["verify", str(other)]) == 0
        body = json.loads((other / STEP.format(4) / layout.VALID).read_text())
    (newest / layout.VALID).write_text(json.dumps(body))
    ck = Checkpointer(root, keep=2)
    assert ck.rotate() == []
    assert sorted(c.step for c in ck.checkpoints()) == [1, 2, 3, 4]
    expected = "validated" if forge == "right-commit" else "committed"  # it names this commit; still not ours
    assert [c.status for c in ck.checkpoints() if c.step == 4] == [expected]
    # once this process validates step 4 against its bytes, the older ones may go
    ck.verify(4)
    assert ck.rotate() == [1, 2]


def test_markers_written_before_they_named_their_commit_count_as_absent_and_are_rewritten(tmp_path: Path) -> None:
    """A VALID.json of c8d3508 (no ``commit``) counts as absent; the next validation rewrites it."""
    root = tmp_path / "root"
    emergency_steps(root, range(1, 2))
    valid = root / STEP.format(1) / layout.VALID
    valid.write_text(json.dumps({"validated_at": "2026-01-01T00:00:00Z", "checksums": True, "by": "verify"}))
    assert [c.status for c in Checkpointer(root).checkpoints()] == ["committed"]
    assert restored_step(root)[0] == 1
    assert json.loads(valid.read_text())["commit"] == checksum.of_bytes((valid.parent / "COMMIT.json").read_bytes())
    assert [c.status for c in Checkpointer(root).checkpoints()] == ["validated"]


def test_a_forged_invalid_json_that_names_no_commit_does_not_stop_a_healthy_run(tmp_path: Path) -> None:
    root = tmp_path / "root"
    state, _ = two_steps(root)
    (root / STEP.format(2) / layout.INVALID).write_text(json.dumps({"reason": "forged"}))
    step, weights = restored_step(root)
    assert step == 2 and torch.equal(weights["weight"], state["model"].weight)


def test_the_v1_corpus_checkpoint_still_restores_with_its_old_markers() -> None:
    corpus = Path(__file__).parents[1] / "corpus" / "checkpoint-v1"
    infos = Checkpointer(corpus).checkpoints()
    assert infos and all(c.status in ("committed", "validated") for c in infos)


# item 1 ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16))
    root = tmp_path_factory.mktemp("hf") / "root"
    Checkpointer(root, keep=5).save({"model": model}, 1)
    return root


def hostile_hf(tmp_path: Path, base: Path, change: Any) -> Path:
    import shutil

    root = tmp_path / "root"
    shutil.copytree(base, root)
    doc = commit_of(root, 1)
    change(doc["transformers"]["model"])
    reseal(root, 1, doc)
    return root


def test_regression_50_1_export_hf_never_imports_a_module_the_checkpoint_names(
    tmp_path: Path, hf_root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``export --format hf`` imported the module COMMIT.json's ``transformers`` record names; run from inside the
    root (``python -m`` puts the working directory on sys.path), a ``.py`` file shipped in the root executed."""
    ran = tmp_path / "it-ran"

    def change(rec: dict[str, Any]) -> None:
        rec.update({"module": "payload", "class": "Payload"})

    root = hostile_hf(tmp_path, hf_root, change)
    (root / "payload.py").write_text(f"open({str(ran)!r}, 'w').close()\nclass Payload: pass\n")
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    assert main(["export", str(root), "--format", "hf", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert not ran.exists()
    assert "is not a model class transformers registers" in err and err.count("\n") == 1


@pytest.mark.timeout(120)  # a failure detector for the hang, not a speed assertion
@pytest.mark.parametrize(
    "case",
    [
        ("n_layer", 1_000_000, "n_layer=1000000"),
        ("n_embd", 10**12, "n_embd"),
        ("n_head", 10**50, "beyond any model's size"),
        ("model_type", "../../payload", "model_type"),
        ("n_layer", 3, "n_layer=3"),
    ],
)
def test_regression_50_1_a_config_is_bounded_by_the_stored_tensors_before_a_model_is_built(
    tmp_path: Path, hf_root: Path, capsys: pytest.CaptureFixture[str], case: tuple[str, Any, str]
) -> None:
    """``n_layer: 1000000`` hung the export (still running after 3 minutes): a million modules built on meta."""
    key, value, why = case
    root = hostile_hf(tmp_path, hf_root, lambda rec: rec["config"].__setitem__(key, value))
    assert main(["export", str(root), "--format", "hf", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert why in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "record",
    [{"class": ["GPT2LMHeadModel"]}, {"class": None}, {"config": {"model_type": 7}}, {"class": "AutoModel"}],
    ids=["class-list", "class-none", "model-type-int", "auto-class"],
)
def test_hostile_hf_class_and_config_values_are_one_line(
    tmp_path: Path, hf_root: Path, capsys: pytest.CaptureFixture[str], record: dict[str, Any]
) -> None:
    root = hostile_hf(tmp_path, hf_root, lambda rec: rec.update(record))
    assert main(["export", str(root), "--format", "hf", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


# item 11 (export) -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["through-a-file", "proc", "read-only-mount"])
def test_regression_50_11_export_to_a_path_it_cannot_write_is_one_line_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """``export --out`` on a read-only or uncreatable path gave a traceback. CI runs as root: the unwritable paths
    are ones root cannot write either (a path through a regular file, /proc, a read-only tmpfs this test mounts)."""
    import subprocess

    root = tmp_path / "root"
    two_steps(root)
    if where == "through-a-file":
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "out"
    elif where == "proc":
        out = Path("/proc/self/preemptible-export")
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=False)
        if done.returncode != 0:
            pytest.skip("no read-only tmpfs can be mounted here (needs root and CAP_SYS_ADMIN)")
        out = ro / "out"
    try:
        try:
            code = main(["export", str(root), "--out", str(out)])
        except SystemExit as e:  # refused while parsing its arguments
            code = e.code  # type: ignore[assignment]
        err = capsys.readouterr().err
        assert code in (1, 2) and err.count("\n") == 1 and "Traceback" not in err, err
        assert str(out) in err
    finally:
        if where == "read-only-mount":
            subprocess.run(["umount", str(tmp_path / "ro")], check=False)


# an outside attack on this stop's read path (11 breaks of 47): each as a regression test ------------------------------
def test_attack_a_step_directory_linking_to_another_step_is_refused_never_written_or_retracted_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``step-3 -> step-2`` inside the root: restore raised LifecycleError, wrote INVALID.json (naming step 2's
    commit) into step 2 through the link, and rotation retracted step 2's COMMIT.json."""
    root = tmp_path / "root"
    state = small()
    ck = Checkpointer(root, keep=5)
    for s in (1, 2, 4):
        ck.save(state, s)
    os.symlink(STEP.format(2), root / STEP.format(3))
    assert restored_step(root)[0] == 4
    assert main(["verify", str(root)]) == 0
    assert "step 3" not in capsys.readouterr().out
    assert Checkpointer(root, keep=3).rotate() == []
    for s in (1, 2, 4):
        d = root / STEP.format(s)
        assert (d / layout.COMMIT).exists() and not (d / layout.INVALID).exists()
    assert main(["inspect", str(root)]) == 0
    assert "inside the root: never read, restored or deleted through" in capsys.readouterr().out


def hand_made(root: Path, files: dict[str, Any], world: int) -> Path:
    """A committed step 1 of ``files`` (tensor dicts become safetensors files; the rest JSON), sealed."""
    from safetensors.torch import save_file

    d = root / STEP.format(1)
    d.mkdir(parents=True)
    doc: dict[str, Any] = {
        "format_version": 1,
        "step": 1,
        "created": "x",
        "world_size": world,
        "checksum_algorithm": checksum.ALGORITHM,
        "files": {},
        "probe": None,
        "timings": {},
        "predicted_save_s": None,
    }
    for name, content in files.items():
        if name.endswith(".safetensors"):
            save_file(content, str(d / name))
        else:
            (d / name).write_text(json.dumps(content))
        data = (d / name).read_bytes()
        doc["files"][name] = {"bytes": len(data), "checksum": checksum.of_bytes(data)}
    (d / layout.COMMIT).write_text(json.dumps(layout.seal(doc)))
    return root


TREE = {"model": {"$dict": [["weight", {"$tensor": "model/weight"}]]}}
STATE_DOC = {"format": "preemptible.state", "version": 1, "numpy": [], "casts": {}, "dtensors": {}, "tree": TREE}


def test_attack_a_shard_record_of_a_tensor_no_rank_file_holds_is_refused_not_filled_with_garbage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records that cover a (3, 4) tensor, rank 1's rows held by no rank's file (the tensor sat in the file every
    rank reads): verify said PASS, and load()/export --entry returned uninitialized rows as "all verified"."""

    def rec(offset: list[int]) -> dict[str, Any]:
        return {"shape": [3, 4], "stride": [4, 1], "mesh": [2], "placements": ["Shard(dim=0)"], "offset": offset}

    root = hand_made(
        tmp_path / "root",
        {
            "model.safetensors": {"model/weight": torch.full((1, 4), 7.0), "pad": torch.zeros(64)},
            "model-r00000.safetensors": {"model/weight": torch.full((2, 4), 1.0)},
            "state.json": STATE_DOC,
            "state-r00000.json": {"tree": {}, "dtensors": {"model/weight": rec([0, 0])}},
            "state-r00001.json": {"tree": {}, "dtensors": {"model/weight": rec([2, 0])}},
        },
        world=2,
    )
    assert main(["verify", str(root), "--no-mark"]) == 1
    assert "more than one file" in capsys.readouterr().out
    with pytest.raises(preemptible.errors.CheckpointCorruptError):
        preemptible.load(root, entry="model")
    assert main(["export", str(root), "--entry", "model", "--out", str(tmp_path / "o")]) == 1


def test_attack_a_world_of_100000_with_one_ranks_file_is_refused_at_once(tmp_path: Path) -> None:
    """load() opened the checkpoint 100,000 times (a minute) for a world that one per-rank file claimed."""
    root = hand_made(
        tmp_path / "root",
        {"model.safetensors": {"model/weight": torch.ones(3, 4)}, "state.json": STATE_DOC, "state-r99999.json": {}},
        world=100_000,
    )
    with pytest.raises(preemptible.errors.CheckpointCorruptError, match="every rank of a job writes its own files"):
        preemptible.load(root)


@pytest.mark.parametrize("dtype", ["qint8", "bits8", "int64", "bool"])
def test_attack_a_cast_to_a_dtype_a_save_never_makes_is_a_content_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: str
) -> None:
    """``casts: {"model/bias": "qint8"}``: tracebacks from verify and export, and load() raised RuntimeError
    instead of falling back."""
    root = tmp_path / "root"
    _, at_1 = two_steps(root)
    d = root / STEP.format(2)
    doc = json.loads((d / layout.STATE).read_text())
    doc["casts"] = {"model/bias": dtype}
    (d / layout.STATE).write_text(json.dumps(doc))
    reseal(root, 2, commit_of(root, 2))
    assert main(["verify", str(root), "--step", "2", "--no-mark"]) == 1
    assert "expected a floating dtype" in capsys.readouterr().out
    with pytest.warns(CheckpointFallbackWarning):
        assert torch.equal(preemptible.load(root, entry="model")["bias"], at_1["bias"])


def test_attack_a_per_rank_document_that_redefines_an_entry_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``state-r00000.json`` mapping ``weight`` to ``exp_avg``: load() returned exp_avg as the weight while
    restore loaded the weight, and verify said PASS."""
    root = tmp_path / "root"
    two_steps(root)
    d = root / STEP.format(2)
    doc = json.loads((d / layout.STATE).read_text())
    doc["tree"]["model"] = {"$dict": [["weight", {"$tensor": "optimizer/state/0/exp_avg"}]]}
    (d / "state-r00000.json").write_text(json.dumps(doc))
    commit = commit_of(root, 2)
    commit["files"]["state-r00000.json"] = {}
    reseal(root, 2, commit)
    assert main(["verify", str(root), "--step", "2", "--no-mark"]) == 1
    assert "other than state.json does" in capsys.readouterr().out


def test_attack_a_tensor_in_the_shared_file_and_a_per_rank_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``model/weight`` in ``model.safetensors`` and ``model-r00000.safetensors``: which copy load() and restore
    took depended on the files' sizes."""
    from safetensors.torch import save_file

    root = tmp_path / "root"
    two_steps(root)
    d = root / STEP.format(2)
    save_file({"model/weight": torch.full((3, 4), 666.0)}, str(d / "model-r00000.safetensors"))
    commit = commit_of(root, 2)
    commit["files"]["model-r00000.safetensors"] = {}
    reseal(root, 2, commit)
    assert main(["verify", str(root), "--step", "2", "--no-mark"]) == 1
    assert "more than one file" in capsys.readouterr().out
    assert restored_step(root)[0] == 1


def test_attack_a_forged_invalid_json_naming_the_commit_never_lets_rotation_delete(tmp_path: Path) -> None:
    """INVALID.json with the right commit on healthy steps 2 and 3: rotation deleted them. An invalid checkpoint is
    deleted only once this process has found it failing against its bytes."""
    root = tmp_path / "root"
    emergency_steps(root, range(1, 5))
    for s in (2, 3):
        d = root / STEP.format(s)
        commit = checksum.of_bytes((d / layout.COMMIT).read_bytes())
        (d / layout.INVALID).write_text(json.dumps({"commit": commit, "reason": "forged"}))
    ck = Checkpointer(root, keep=2)
    assert ck.restore(small(seed=3)) == 4
    assert ck.rotate() == []  # 2 and 3, "invalid", would go; they pass a check here: kept (and 1, the second good)
    assert sorted(c.step for c in ck.checkpoints()) == [1, 2, 3, 4]
    (root / STEP.format(3) / "model.safetensors").write_bytes(b"damaged")  # now really bad: found so, then deleted
    assert ck.rotate() == [3]


@pytest.mark.timeout(120)  # a failure detector for the hang, not a speed assertion
def test_attack_layer_counts_in_a_nested_sub_config_are_bounded_too(
    tmp_path: Path, hf_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``CLIPModel`` with ``text_config.num_hidden_layers`` 30,000: 45 s and 1.86 GB before a refusal."""
    config = {
        "model_type": "clip",
        "text_config": {"num_hidden_layers": 30_000, "hidden_size": 16, "intermediate_size": 16},
        "vision_config": {"num_hidden_layers": 1, "hidden_size": 16, "image_size": 16, "patch_size": 8},
    }
    root = hostile_hf(tmp_path, hf_root, lambda rec: rec.update({"class": "CLIPModel", "config": config}))
    assert main(["export", str(root), "--format", "hf", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "text_config.num_hidden_layers=30000" in err and err.count("\n") == 1


def test_attack_a_config_that_ties_weights_stored_apart_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tie_word_embeddings: true`` resealed into an untied GPT-2: the export wrote wte where the stored lm_head
    belonged, "all verified"."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16, tie_word_embeddings=False)
    base = tmp_path / "base"
    Checkpointer(base).save({"model": GPT2LMHeadModel(config)}, 1)
    root = hostile_hf(tmp_path, base, lambda rec: rec["config"].__setitem__("tie_word_embeddings", True))
    assert main(["export", str(root), "--format", "hf", "--out", str(tmp_path / "out")]) == 2
    assert "ties weights that the checkpoint stores apart" in capsys.readouterr().err


def test_attack_terminal_escapes_from_a_checkpoint_are_shown_never_obeyed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forged reason or a journal value holding ``ESC]0;PWNED BEL ESC[2J`` reached the terminal raw."""
    root = tmp_path / "root"
    two_steps(root)
    d = root / STEP.format(2)
    commit = checksum.of_bytes((d / layout.COMMIT).read_bytes())
    (d / layout.INVALID).write_text(json.dumps({"commit": commit, "reason": "\x1b]0;PWNED\x07\x1b[2J\u202e"}))
    (root / "journal").mkdir(exist_ok=True)
    (root / "journal" / "20260101T000000.000000Z-r0.jsonl").write_text(
        json.dumps({"t": "2026-01-01T00:00:00Z", "event": "start", "step": 0, "rank": 0, "host": "\x1b[2J"}) + "\n"
    )
    for argv in (["inspect", str(root)], ["verify", str(root), "--no-mark"], ["report", str(root)]):
        main(argv)
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out, argv
    main(["inspect", str(root)])
    assert "\\x1b]0;PWNED" in capsys.readouterr().out
