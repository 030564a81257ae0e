"""Elastic resume under real torchrun (gloo, CPU): sharded state (FSDP2 ``fully_shard``) saved on N ranks and
restored on M, across wrappers (DDP <-> FSDP2 <-> one process), each rank reading only the slices it needs.

Every restore is compared tensor by tensor with the state the checkpoint was taken from: the digest of each full
(gathered) tensor of the model and of AdamW's state (``tests/scripts/reshard.py``), then trains two more steps.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, clean_env
from torchrunkit import Torchrun, journals

SCRIPT = REPO / "tests" / "scripts" / "reshard.py"


def launch(
    root: Path | str, nproc: int, wrap: str, phase: str, out: Path, *extra: str, env: dict[str, str] | None = None
):  # type: ignore[no-untyped-def]
    args = ["--wrap", wrap, "--phase", phase, "--out", str(out), *extra]
    if nproc == 0:  # one plain process, no torchrun, no process group
        cmd = [sys.executable, str(SCRIPT), "--root", str(root), *args]
        done = subprocess.run(
            cmd, capture_output=True, text=True, env=clean_env(**(env or {})), timeout=180, check=False
        )
        return done.returncode, done.stdout, done.stderr
    return Torchrun(root, nproc, *args, script=SCRIPT, env=env).finish(timeout=180)  # type: ignore[arg-type]


def saved(tmp: Path, nproc: int, wrap: str, *extra: str) -> tuple[Path, dict[str, Any]]:
    root = tmp / f"{wrap}{nproc}"
    out = tmp / f"{wrap}{nproc}.json"
    code, _, err = launch(root, nproc, wrap, "save", out, *extra)
    assert code == 0, err
    return root, json.loads(out.read_text())


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("reshard")
    return {"fsdp2": saved(tmp, 2, "fsdp"), "fsdp3": saved(tmp, 3, "fsdp"), "ddp2": saved(tmp, 2, "ddp")}


def restore(
    tmp: Path, source: tuple[Path, dict[str, Any]], nproc: int, wrap: str, *extra: str
) -> tuple[dict[str, Any], Path]:
    root = tmp / "copy"
    shutil.copytree(source[0], root)
    out = tmp / "restored.json"
    code, _, err = launch(root, nproc, wrap, "restore", out, *extra)
    assert code == 0, err
    return json.loads(out.read_text()), root


def assert_same_state(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert after["resumed_from"] == 3 and after["step"] == 5  # restored, then trained two more steps
    assert sorted(after["restored"]) == sorted(before["final"])
    differ = [k for k in before["final"] if before["final"][k] != after["restored"][k]]
    assert not differ, f"tensors that differ after the restore: {differ}"


def events(root: Path, name: str) -> dict[int, list[dict[str, Any]]]:
    return {r: [e for e in evs if e["event"] == name] for r, evs in journals(root).items()}


def tensor_bytes(root: Path, step: int = 3) -> dict[str, int]:
    files = json.loads((root / f"step-{step:012d}" / "COMMIT.json").read_text())["files"]
    return {n: f["bytes"] for n, f in files.items() if n.endswith(".safetensors")}


@pytest.mark.parametrize("nproc", [3, 1])
def test_fsdp2_saved_on_2_restores_on_3_and_1(roots: Any, tmp_path: Path, nproc: int) -> None:
    """(On 2 again: tests/e2e/test_torchrun.py, bit-identical through a SIGTERM and a resume.)"""
    after, root = restore(tmp_path, roots["fsdp2"], nproc, "fsdp")
    assert_same_state(roots["fsdp2"][1], after)
    changed = events(root, "world_changed")
    restored = events(root, "restored")
    for rank in range(nproc):
        (event,) = changed[rank]
        assert event["saved_world"] == 2 and event["world"] == nproc and event["resharded"] > 0
        assert event["rng"] == ("derived" if rank >= 2 else "restored")  # rank 2 reseeds its streams from rank 0's
        assert event["source_rank"] == rank % 2
    assert changed[0][0]["dropped_ranks"] == ([1] if nproc == 1 else [])
    if nproc == 3:  # rank 2 holds rows old rank 1 held: it reads part of rank 1's files and nothing of rank 0's
        sizes = tensor_bytes(root)
        whole = sizes["model-r00001.safetensors"] + sizes["optimizer-r00001.safetensors"]
        assert 0 < restored[2][0]["data_bytes_read"] < whole


def test_saved_on_3_restores_on_2(roots: Any, tmp_path: Path) -> None:
    after, _ = restore(tmp_path, roots["fsdp3"], 2, "fsdp")
    assert_same_state(roots["fsdp3"][1], after)


def test_fsdp2_checkpoint_restores_into_one_plain_process(roots: Any, tmp_path: Path) -> None:
    after, root = restore(tmp_path, roots["fsdp2"], 0, "plain")
    assert_same_state(roots["fsdp2"][1], after)
    assert events(root, "world_changed")[0][0]["world"] == 1


def test_ddp_checkpoint_restores_into_fsdp2_on_3_and_fsdp2_into_ddp(roots: Any, tmp_path: Path) -> None:
    after, _ = restore(tmp_path / "a", roots["ddp2"], 3, "fsdp")
    assert_same_state(roots["ddp2"][1], after)
    after, root = restore(tmp_path / "b", roots["fsdp2"], 2, "ddp")  # same world, sharded into replicated
    assert_same_state(roots["fsdp2"][1], after)
    assert all(e[0]["resharded"] > 0 for e in events(root, "world_changed").values())


def test_a_model_of_another_shape_is_refused_naming_the_tensors(roots: Any, tmp_path: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(roots["fsdp2"][0], root)
    code, _, err = launch(root, 3, "fsdp", "restore", tmp_path / "out.json", "--width", "40")
    assert code != 0
    assert "saved by 2 rank(s), cannot be restored on 3" in err
    assert "ranks 0, 1, 2: the checkpoint of step 3" in err  # one reason, stated once for the ranks that gave it
    assert "model/0.weight: global shape [37, 16] in checkpoint, [40, 16] live" in err
    assert "optimizer/state/0/exp_avg: global shape [37, 16] in checkpoint, [40, 16] live" in err
    assert not (tmp_path / "out.json").exists()


def test_a_flipped_byte_in_a_shard_is_caught_by_the_ranged_read(roots: Any, tmp_path: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(roots["fsdp2"][0], root)
    shard = root / "step-000000000003" / "model-r00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x40  # inside the last tensor's data; the header and the size are unchanged
    shard.write_bytes(bytes(data))
    code, _, err = launch(root, 3, "fsdp", "restore", tmp_path / "out.json")
    assert code != 0
    assert "model-r00001.safetensors: checksum mismatch in bytes" in err
    assert "none of the 1 committed checkpoints" in err
    assert json.loads((root / "step-000000000003" / "INVALID.json").read_text())


def test_a_checkpoint_without_piece_checksums_is_read_a_whole_file_at_a_time(roots: Any, tmp_path: Path) -> None:
    """Checkpoints written before ranged reads (no ``chunks`` in COMMIT.json) still reshard, verified whole."""
    from preemptible.store import layout

    root = tmp_path / "copy"
    shutil.copytree(roots["fsdp2"][0], root)
    commit = root / "step-000000000003" / "COMMIT.json"
    doc = json.loads(commit.read_text())
    doc.pop(layout.SELF_CHECKSUM)
    for rec in doc["files"].values():
        rec.pop("chunks", None)
    commit.write_text(json.dumps(layout.seal(doc), indent=1))
    out = tmp_path / "out.json"
    code, _, err = launch(root, 3, "fsdp", "restore", out)
    assert code == 0, err
    assert_same_state(roots["fsdp2"][1], json.loads(out.read_text()))
    sizes = tensor_bytes(root)
    whole = sizes["model-r00001.safetensors"] + sizes["optimizer-r00001.safetensors"]
    assert events(root, "restored")[2][0]["data_bytes_read"] >= whole  # read whole, then sliced


def test_a_compressed_fsdp2_checkpoint_reshards_from_its_frames_and_catches_a_flipped_byte(tmp_path: Path) -> None:
    """Saved compressed on 2 ranks, restored on 3: each rank decodes only the frames of the files that hold its rows
    (every frame verified), and the state is the same; a flipped byte in a compressed shard fails the restore."""
    root, before = saved(tmp_path, 2, "fsdp", "--compress")
    files = json.loads((root / "step-000000000003" / "COMMIT.json").read_text())["files"]
    assert {n for n in files if n.startswith(("model-", "optimizer-"))} == {
        f"{e}-r0000{r}.safetensors.zst" for e in ("model", "optimizer") for r in (0, 1)
    }
    after, copy = restore(tmp_path, (root, before), 3, "fsdp")
    assert_same_state(before, after)
    stored = sum(f["bytes"] for n, f in files.items() if n.endswith(".zst"))
    for r, evs in events(copy, "restored").items():
        assert evs[0]["data_bytes_read"] <= stored, r  # never more than the compressed files
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    target = bad / "step-000000000003" / "model-r00001.safetensors.zst"
    data = bytearray(target.read_bytes())
    data[len(data) // 4] ^= 0x20  # inside the frames
    target.write_bytes(bytes(data))
    code, _, err = launch(bad, 3, "fsdp", "restore", tmp_path / "bad.json")
    assert code != 0
    assert "model-r00001.safetensors.zst" in err and "checksum mismatch" in err
    assert (bad / "step-000000000003" / "INVALID.json").exists()


def test_object_store_root_reads_only_each_ranks_byte_ranges(tmp_path: Path) -> None:
    """S3 (moto on loopback): saved on 2, restored on 3 with ranged GETs; each rank's bytes are counted."""
    import s3fs
    import torch

    from objkit import env, make_bucket, moto_server

    width = 4096  # tensors of several checksummed pieces each
    with moto_server() as endpoint:
        fs = make_bucket(endpoint, "ckpt")
        url = "s3://ckpt/run"
        extra = ("--width", str(width))
        code, _, err = launch(url, 2, "fsdp", "save", tmp_path / "save.json", *extra, env=env(endpoint))
        assert code == 0, err
        code, _, err = launch(url, 3, "fsdp", "restore", tmp_path / "restored.json", *extra, env=env(endpoint))
        assert code == 0, err
        before, after = (json.loads((tmp_path / f).read_text()) for f in ("save.json", "restored.json"))
        assert_same_state(before, after)
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, key="testing", secret="testing")
        restored: dict[int, dict[str, Any]] = {}
        for path in fs.find("ckpt/run/journal"):
            rank = int(path.rsplit("-r", 1)[1].split(".")[0])
            for line in fs.cat_file(path).decode().splitlines():
                e = json.loads(line)
                if e["event"] == "restored":
                    restored[rank] = e
        commit = json.loads(fs.cat_file("ckpt/run/step-000000000003/COMMIT.json"))
    # What each rank needs: its torch.chunk share of every sharded tensor (model and both AdamW moments, fp32).
    shapes = {
        "0.weight": (width, 16),
        "0.bias": (width,),
        "2.weight": (11, width),
        "2.bias": (11,),
        "4.weight": (1, 11),
    }
    shapes["4.bias"] = (1,)
    share = {r: 0 for r in range(3)}
    for shape in shapes.values():
        row = 4 * (shape[1] if len(shape) > 1 else 1)
        for r, part in enumerate(torch.arange(shape[0]).chunk(3)):
            share[r] += 3 * len(part) * row
    stored = sum(f["bytes"] for n, f in commit["files"].items() if n.startswith(("model-", "optimizer-")))
    for r in range(3):
        got = restored[r]["data_bytes_read"]
        assert share[r] <= got <= share[r] * 1.25 + 64 * 1024, (r, got, share[r])  # pieces of 16 KiB: a little over
        assert got < stored / 2  # never whole files: every rank reads well under half of the sharded bytes
