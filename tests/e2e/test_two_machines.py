"""Two machines on one root (issue 14 item 1): a reclaimed machine, still alive, saves the step its replacement
has committed. The committed checkpoint's bytes must never be written again, by anyone: each save attempt writes
into a place of its own and the commit cannot replace a committed step. Real processes, real storage servers."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import clean_env
from objkit import azurite, gcs_emulator, gcs_env, make_bucket, make_container, moto_server, set_gcs_env
from objkit import env as s3_env
from preemptible import Checkpointer
from preemptible.store import checksum

SCRIPT = Path(__file__).parent.parent / "scripts" / "machine_save.py"
STEP = 26


def machine(root: str, value: float, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, str(SCRIPT), "--root", root, "--step", str(STEP), "--value", str(value), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def digests(ck: Checkpointer) -> dict[str, str]:
    """Every file of the committed step, hashed from storage."""
    where = ck.files_dir(STEP)
    return {
        name: checksum.of_bytes(ck.storage.read_bytes(ck.storage.join(where, name), 1 << 30))
        for name in ck.storage.listdir(where)
        if not name.startswith("a-")
    }


@pytest.fixture(params=["local", "s3", "gs", "az"])
def shared(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """(root, environment of both machines) on each kind of storage, a real server for each object store."""
    if request.param == "local":
        yield str(tmp_path / "ckpt"), clean_env()
        return
    bucket = f"race-{uuid.uuid4().hex[:12]}"
    servers = {"s3": moto_server, "gs": lambda: gcs_emulator(tmp_path), "az": lambda: azurite(tmp_path)}
    with servers[request.param]() as endpoint:
        if request.param == "s3":
            extra = s3_env(endpoint)
            make_bucket(endpoint, bucket)
        elif request.param == "gs":
            extra = gcs_env(endpoint)
            set_gcs_env(monkeypatch, endpoint)
        else:
            extra = {"AZURE_STORAGE_CONNECTION_STRING": endpoint}
        for k, v in extra.items():
            monkeypatch.setenv(k, v)
        url = f"{request.param}://{bucket}/ckpt"
        if request.param != "s3":
            make_container(url)
        yield url, clean_env(**extra)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pause_at", ["data", "commit"])
def test_item_1_the_reclaimed_machine_never_writes_into_the_step_its_replacement_committed(
    shared: Any, pause_at: str, tmp_path: Path
) -> None:
    root, env = shared
    go = tmp_path / "go"
    old = machine(root, 1.0, env, "--pause-at", pause_at, "--go", str(go))  # the reclaimed machine
    assert old.stdout is not None
    assert old.stdout.readline().strip() == "paused"
    new = machine(root, 2.0, env)  # its replacement commits the same step meanwhile
    out, err = new.communicate(timeout=240)
    assert new.returncode == 0, err
    ck = Checkpointer(root)
    before = digests(ck)
    go.touch()
    out, err = old.communicate(timeout=240)
    assert old.returncode == 3, (out, err)
    assert "AlreadyCommittedError" in err and f"step {STEP} was committed" in err
    assert digests(ck) == before, "the committed checkpoint's bytes changed"
    live = {"model": {"w": torch.zeros(1 << 20)}, "meta": {}}
    assert Checkpointer(root).restore(live) == STEP
    assert torch.equal(live["model"]["w"], torch.full((1 << 20,), 2.0))
    assert live["meta"] == {"value": 2.0}
    # the loser removed its own attempt: nothing of value 1.0 is left behind
    assert [c for c in Checkpointer(root).checkpoints(include_uncommitted=True) if not c.committed] == []


def test_item_1_the_commit_object_is_created_conditionally_where_the_server_can(shared: Any) -> None:
    """Both writers past the existence check: the conditional PUT itself must refuse the second. S3 (moto) and
    Azure (Azurite) honour it; the GCS emulator ignores ifGenerationMatch=0 (real GCS honours it), which leaves
    the race the README describes: the later COMMIT.json wins, and refers to its own complete files."""
    root, _ = shared
    storage = Checkpointer(root).storage
    if storage.kind == "local":  # the rename that commits cannot replace a directory that is there
        a, b, dst = (Path(root) / n for n in ("a", "b", "step"))
        for d in (a, b):
            d.mkdir(parents=True)
            (d / "f").write_text(d.name)
        storage.commit_dir(str(a), str(dst))
        with pytest.raises(FileExistsError):
            storage.commit_dir(str(b), str(dst))
        assert (dst / "f").read_text() == "a" and (b / "f").exists()
        return
    from preemptible.store.objstore import FsspecStorage

    assert isinstance(storage, FsspecStorage)
    target = storage.join(storage.root, "probe", "COMMIT.json")
    storage.create_only(target, b"first")
    if storage.protocol == "gs":
        storage.create_only(target, b"second")  # the emulator's gap, measured so the README stays honest
        assert storage.read_bytes(target, 100) == b"second"
        return
    with pytest.raises(FileExistsError):
        storage.create_only(target, b"second")
    assert storage.read_bytes(target, 100) == b"first"
