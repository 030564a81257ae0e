"""Checkpoints on object storage: one conformance suite over every backend (local disk, memory://, S3 on a real
loopback server), the training script preempted with an s3:// root, and faults injected between client and server."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import Trainer, final_digest, make_model, train_some
from objkit import FaultProxy, azurite, gcs_emulator, make_bucket, make_container, moto_server, set_env, set_gcs_env
from preemptible import CheckpointCorruptError, Checkpointer, SaveError
from preemptible.cli import main
from preemptible.errors import CheckpointFallbackWarning, StorageCredentialsError, StorageUnavailableError
from preemptible.store.io import ephemeral_reason, storage_for
from preemptible.store.objstore import credentials_error, retrying, transient


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with gcs_emulator(tmp_path_factory.mktemp("gcs")) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def azure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with azurite(tmp_path_factory.mktemp("azurite")) as connection_string:
        yield connection_string


@pytest.fixture(params=["local", "memory", "s3", "gs", "az"])
def root(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh checkpoint root on each backend, reached only through the standard environment of its client."""
    if request.param == "local":
        return str(tmp_path / "ckpt")
    if request.param == "memory":
        return f"memory://suite-{uuid.uuid4().hex}/ckpt"
    bucket = f"suite-{uuid.uuid4().hex[:12]}"
    if request.param == "s3":
        endpoint = request.getfixturevalue("s3")
        set_env(monkeypatch, endpoint)
        make_bucket(endpoint, bucket)
        return f"s3://{bucket}/ckpt"
    if request.param == "gs":
        set_gcs_env(monkeypatch, request.getfixturevalue("gcs"))
    else:
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", request.getfixturevalue("azure"))
    url = f"{request.param}://{bucket}/ckpt"
    make_container(url)
    return url


def state(seed: int = 0) -> dict[str, Any]:
    model = make_model(hidden=32, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_some(model, opt, 2)
    return {"model": model, "optimizer": opt}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in zip(a["model"].state_dict().values(), b["model"].state_dict().values(), strict=True)
    )


# the conformance suite: the same checks on every backend -------------------------------------------------------
def test_roundtrip_and_listing(root: str) -> None:
    ck = Checkpointer(root, keep=2)
    s = state()
    for step in (1, 2, 3):
        ck.save(s, step)
    assert [c.step for c in ck.checkpoints()] == [2, 3]
    fresh = state(seed=5)
    assert ck.restore(fresh) == 3
    assert same(s, fresh)
    assert Checkpointer(root).checkpoints()[-1].validated


def test_uncommitted_objects_are_invisible_and_cleaned(root: str) -> None:
    ck = Checkpointer(root, stale_after_s=0.0)
    s = state()
    ck.save(s, 1)
    ck.storage.makedirs(ck.path_of(2))
    leftover = ck.storage.join(ck.path_of(2), "model.safetensors")
    stream = ck.storage.open_write(leftover)  # what a machine killed mid-upload leaves: data, no COMMIT.json
    stream.write(memoryview(b"partial"))
    stream.close()
    assert [c.step for c in ck.checkpoints()] == [1]
    assert ck.restore(state(seed=3)) == 1
    assert 2 in ck.cleanup()
    assert ck.checkpoints(include_uncommitted=True)[-1].step == 1


def test_corruption_is_detected_and_falls_back(root: str) -> None:
    ck = Checkpointer(root, keep=3)
    s = state()
    ck.save(s, 1)
    ck.save(s, 2)
    target = ck.storage.join(ck.files_dir(2), "model.safetensors")
    data = bytearray(ck.storage.read_bytes(target, 1 << 30))
    data[-1] ^= 1
    ck.storage.publish(target, bytes(data))
    with pytest.warns(CheckpointFallbackWarning, match="checksum mismatch"):
        assert ck.restore(state(seed=2)) == 1
    with pytest.raises(CheckpointCorruptError):
        ck.verify(2)


def test_bandwidth_probe_measures_the_store_and_leaves_nothing(root: str) -> None:
    from preemptible.budget import probe

    bw = probe(root, nbytes=8 << 20)
    assert bw.bytes_per_s > 0 and bw.probe_bytes >= 8 << 20
    storage = storage_for(root)
    assert not [n for n in storage.listdir(storage.root) if n.startswith(".preemptible-probe")]


def test_journal_is_written_as_whole_objects(root: str) -> None:
    from preemptible import Run

    s = state()
    run = Run(root, save_every=2, **s)
    for step in run.steps(5):
        train_some(s["model"], s["optimizer"], 1, start=step)
        run.log(loss=float(step))
    storage = storage_for(root)
    directory = storage.join(storage.root, "journal")
    (name,) = storage.listdir(directory)
    events = [json.loads(x) for x in storage.read_bytes(storage.join(directory, name), 1 << 20).splitlines()]
    assert [e["event"] for e in events][:2] == ["start", "fresh"]
    assert events[-1]["event"] == "done"
    assert sum(e["event"] == "log" for e in events) == 5


# s3 specifics ----------------------------------------------------------------------------------------------------
def test_sigterm_with_an_s3_root_commits_in_the_bucket_and_resumes_exactly(
    s3: str, tmp_path: Path, reference_digest: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import E2E_ARGS
    from objkit import env

    fs = make_bucket(s3, "train")
    root = "s3://train/run"
    t = Trainer(root, *E2E_ARGS, "--step-time", "0.01", env=env(s3))
    t.wait_for_step(60)
    t.signal(__import__("signal").SIGTERM)
    code, _, err = t.finish()
    assert code == 0, err
    commits = fs.glob("train/run/step-*/COMMIT.json")
    assert commits
    journal_names = fs.ls("train/run/journal")
    assert journal_names  # written at the save and at exit, as whole objects
    code, out, err = Trainer(root, *E2E_ARGS, env=env(s3)).finish()
    assert code == 0, err
    stop = int(commits[-1].split("step-")[1].split("/")[0])
    assert f"resumed_from={stop}" in out
    assert final_digest(out) == reference_digest

    # preemptible report reads the bucket's journal as it reads a directory's
    from objkit import set_env
    from preemptible.cli import main

    set_env(monkeypatch, s3)
    page = tmp_path / "report.html"
    assert main(["report", root, "--html", str(page)]) == 0
    from preemptible import report
    from preemptible.store.io import storage_for

    doc = report.report(storage_for(root))
    assert doc["attempts"] == 2 and doc["finished"] is True
    (p,) = doc["preemptions"]
    assert (p["step"], p["resumed_from"], p["source"]) == (stop, stop, "signal")
    assert 'id="attempts">2<' in page.read_text()


def test_storage_options_reach_the_backend_without_any_environment(s3: str) -> None:
    from preemptible import Run

    make_bucket(s3, "opts")
    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": s3, "region_name": "us-east-1"}}
    for _ in Run("s3://opts/run", storage_options=options, **state()).steps(3):
        pass
    assert Checkpointer("s3://opts/run", storage_options=options).restore(state(seed=5)) == 3


def test_a_save_into_a_bucket_that_does_not_exist_says_to_check_the_bucket(s3: str) -> None:
    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": s3, "region_name": "us-east-1"}}
    ck = Checkpointer("s3://no-such-bucket/run", storage_options=options)
    with pytest.raises(SaveError, match=r"bucket does not exist.*Check that the bucket \(or container\) exists"):
        ck.save(state(), 1)
    assert ck.latest() is None


def test_transient_faults_mid_upload_are_retried(s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make_bucket(s3, "flaky")
    injected = {"n": 0}

    def rule(method: str, path: str) -> str | None:  # every third data PUT fails once: a reset, then a 503
        if method == "PUT" and ".safetensors" in path and injected["n"] < 4:
            injected["n"] += 1
            return "reset" if injected["n"] % 2 else "503"
        return None

    with FaultProxy(s3, rule) as proxy:
        set_env(monkeypatch, proxy.url)
        ck = Checkpointer("s3://flaky/ckpt")
        s = state()
        ck.save(s, 1)
        assert injected["n"] == 4
        assert any(a != "ok" for _, _, a in proxy.seen)
        assert ck.restore(state(seed=9)) == 1


def test_an_emergency_save_of_small_tensors_filled_as_uploaded_survives_a_retried_upload(
    s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a background save, a blocking save of small tensors copies each into the arena just before its piece
    is uploaded (`Staging.stage_lazily`). Its first upload is reset mid-way; the retry uploads the file again from
    the start, from the arena as filled so far, and the step restores bit-exact."""
    make_bucket(s3, "lazy")
    g = torch.Generator().manual_seed(3)
    live = {"m": {f"p{i}": torch.randn(700, generator=g) for i in range(600)}}  # 2.8 KB each: 1.7 MB
    armed = {"on": False, "n": 0}

    def rule(method: str, path: str) -> str | None:
        if armed["on"] and method == "PUT" and ".safetensors" in path and armed["n"] == 0:
            armed["n"] += 1
            return "reset"
        return None

    with FaultProxy(s3, rule) as proxy:
        set_env(monkeypatch, proxy.url)
        ck = Checkpointer("s3://lazy/ckpt", keep=5)
        ck.save(live, 1, blocking=False).wait()
        for t in live["m"].values():
            t.mul_(3)
        armed["on"] = True
        result = ck.save(live, 2).wait()
        assert "stage" in result.timings and armed["n"] == 1
        current = ck.staging.current
        assert current is not None and current.step == 2
        fresh = {"m": {k: torch.zeros_like(v) for k, v in live["m"].items()}}
        assert Checkpointer("s3://lazy/ckpt").restore(fresh) == 2
        assert all(torch.equal(fresh["m"][k], v) for k, v in live["m"].items())


@pytest.mark.parametrize("backend", ["gs", "az"])
def test_transient_faults_are_retried_on_gcs_and_azure(
    backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    injected = {"n": 0}
    faults = 4

    def rule(method: str, path: str) -> str | None:  # the first data uploads fail: resets and 503s
        if method in ("PUT", "POST") and "safetensors" in path and injected["n"] < faults:
            injected["n"] += 1
            return "reset" if injected["n"] % 2 else "503"
        return None

    url = f"{backend}://flaky-{uuid.uuid4().hex[:8]}/ckpt"
    if backend == "gs":
        target = request.getfixturevalue("gcs")
        set_gcs_env(monkeypatch, target)
    else:
        connection = request.getfixturevalue("azure")
        target = connection.split("BlobEndpoint=")[1].split("/devstoreaccount1")[0]
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
    make_container(url)
    with FaultProxy(target, rule) as proxy:
        if backend == "gs":
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        else:
            monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection.replace(target, proxy.url))
        ck = Checkpointer(url)
        ck.save(state(), 1)
        assert injected["n"] == faults
        assert ck.restore(state(seed=9)) == 1


def test_azure_sdk_retries_are_shortened_to_fit_a_window(monkeypatch: pytest.MonkeyPatch) -> None:
    from objkit import AZURITE_KEY
    from preemptible.store.objstore import AZURE_FIRST_BACKOFF_S, FsspecStorage

    connection = (
        f"AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;"
    )
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
    storage = FsspecStorage("az://ctr/run")
    policies = [p for p in storage.fs.service_client._pipeline._impl_policies if hasattr(p, "initial_backoff")]
    assert [p.initial_backoff for p in policies] == [AZURE_FIRST_BACKOFF_S]  # the SDK's default is 15 s
    files = storage.fs.service_client.get_container_client("ctr")._pipeline._impl_policies
    assert any(p is policies[0] for p in files)  # each file's client shares the tuned policy


def test_an_upload_that_keeps_failing_never_commits(s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = make_bucket(s3, "broken")
    set_env(monkeypatch, s3)
    ck = Checkpointer("s3://broken/ckpt")
    s = state()
    ck.save(s, 1)

    def rule(method: str, path: str) -> str | None:
        return "500" if method in ("PUT", "POST") and "step-000000000002" in path and "COMMIT" not in path else None

    with FaultProxy(s3, rule) as proxy:
        set_env(monkeypatch, proxy.url)
        broken = Checkpointer("s3://broken/ckpt")
        with pytest.raises(SaveError):
            broken.save(s, 2)
    assert not fs.exists("broken/ckpt/step-000000000002/COMMIT.json")
    import boto3

    client = boto3.client("s3", endpoint_url=s3)
    assert client.list_multipart_uploads(Bucket="broken").get("Uploads", []) == []  # aborted, not left to bill
    set_env(monkeypatch, s3)
    assert Checkpointer("s3://broken/ckpt").restore(state(seed=4)) == 1


def test_retry_policy() -> None:
    calls = {"n": 0}
    slept: list[float] = []

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 4:
            raise ConnectionResetError("connection reset by peer")
        return "ok"

    assert retrying(flaky, what="get", sleep=slept.append, clock=lambda: 0.0) == "ok"
    assert slept == [0.2, 0.4, 0.8]
    assert transient(OSError("An error occurred (SlowDown) when calling the PutObject operation"))
    assert not transient(PermissionError("AccessDenied"))
    # a missing object whose name holds the digits of a status code is an answer, not a fault
    assert not transient(FileNotFoundError("train/run/step-000000000500/COMMIT.json"))
    assert not transient(OSError("expected a manifest for step-000000000503"))
    assert transient(OSError("An error occurred (503) when calling the PutObject operation: Service Unavailable"))
    assert transient(OSError("Server returned HTTP 500"))
    now = [0.0]

    def always() -> str:
        raise ConnectionResetError("reset")

    with pytest.raises(ConnectionResetError):
        retrying(always, what="get", budget_s=1.0, sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])


def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """botocore's whole search comes up empty: no variables (the autouse fixture removed them), no files, and no
    instance metadata service asked (never a real cloud address from a test)."""
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached: signing fails first
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def test_no_credentials_is_said_once_with_what_to_set_by_the_library_and_the_commands(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """botocore finds no credentials: its NoCredentialsError is no OSError, and ended runs and commands with its
    traceback. Now a Run's start, a save's upload, and every command say which variables or storage_options to
    set (exit code 2 from a command), without retrying."""
    no_aws_credentials(monkeypatch, tmp_path)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(StorageCredentialsError, match=r"s3: list bucket/run.*AWS_ACCESS_KEY_ID"):
        Checkpointer("s3://bucket/run").checkpoints()
    stream = Checkpointer("s3://bucket/run").storage.open_write("bucket/run/x.bin")
    stream.write(memoryview(b"x"))
    with pytest.raises(StorageCredentialsError, match=r"upload of bucket/run/x.bin failed.*NoCredentialsError"):
        stream.close()  # the upload starts here
    import preemptible

    run = preemptible.Run("s3://bucket/run", model=model, optimizer=opt)
    with pytest.raises(StorageCredentialsError, match=r"storage_options=\{'key'"):
        for _ in run.steps(3):
            pass
    plan = ["plan", "s3://bucket/run", "--params", "1e6", "--probe-mb", "1"]
    for argv in (["verify", "s3://bucket/run"], ["inspect", "s3://bucket/run"], plan):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"preemptible {argv[0]}: ") and "AWS_ACCESS_KEY_ID" in err and "Traceback" not in err


def test_only_a_client_s_credential_errors_are_taken_for_missing_credentials() -> None:
    from botocore.exceptions import NoCredentialsError, PartialCredentialsError

    found = credentials_error(NoCredentialsError(), "s3: list b/r")
    assert isinstance(found, StorageCredentialsError) and isinstance(found, PermissionError)
    assert "AWS_ACCESS_KEY_ID" in str(found) and str(found).startswith("s3: list b/r failed")
    partial = credentials_error(PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"), "x")
    assert partial is not None and "AWS_SECRET_ACCESS_KEY" in str(partial)
    azure = pytest.importorskip("azure.core.exceptions")
    found = credentials_error(azure.ClientAuthenticationError("Server failed to authenticate the request"), "az")
    assert found is not None and "AZURE_STORAGE_CONNECTION_STRING" in str(found)
    for other in (ConnectionResetError("reset"), ValueError("bad"), PermissionError("AccessDenied")):
        assert credentials_error(other, "x") is None
    said = credentials_error(NoCredentialsError(), "upload of b/r/x")
    assert said is not None and credentials_error(said, "s3: upload") is None  # the retry around it says it once
    with pytest.raises(StorageCredentialsError) as raised:
        retrying(lambda: (_ for _ in ()).throw(said), what="upload of b/r/x")
    assert raised.value is said


@pytest.mark.parametrize(
    ("url", "module", "extra"),
    [("s3://b/r", "s3fs", "s3"), ("gs://b/r", "gcsfs", "gcs"), ("az://c/r", "adlfs", "azure")],
)
def test_missing_backend_names_the_extra(url: str, module: str, extra: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # how Python reports a module that is not installed
    with pytest.raises(StorageUnavailableError, match=rf"pip install 'preemptible\[{extra}\]'"):
        storage_for(url)


def test_ephemeral_roots_are_named(tmp_path: Path) -> None:
    assert ephemeral_reason(storage_for("/dev/shm/preemptible-test")) is not None
    assert "instance-local" in (ephemeral_reason(storage_for("/mnt/resource/ckpt")) or "")
    assert ephemeral_reason(storage_for(str(tmp_path))) is None
    assert ephemeral_reason(storage_for("memory://x/y")) is None


def test_run_warns_when_the_root_will_not_outlive_the_machine(caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import shutil

    from preemptible import Run

    root = f"/dev/shm/preemptible-test-{uuid.uuid4().hex}"
    try:
        with caplog.at_level(logging.WARNING, logger="preemptible"):
            list(Run(root, **state()).steps(1))
        assert "will not survive the machine" in caplog.text and "tmpfs" in caplog.text
    finally:
        shutil.rmtree(root, ignore_errors=True)
