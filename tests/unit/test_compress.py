"""Compressed tensor files (``.safetensors.zst``): round trips, the ratio on seeded data, damage, the auto choice."""

from __future__ import annotations

import functools
import io
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from preemptible.bench import PacedStorage, Pacer
from preemptible.checkpoint.checkpointer import Checkpointer
from preemptible.errors import CheckpointCorruptError
from preemptible.store import compress, layout
from preemptible.store import format as tensor_format
from preemptible.store.compress import Codec, Measured
from preemptible.store.io import LocalStorage
from preemptible.store.threads import Pool


class Sink:
    def __init__(self) -> None:
        self.buf = io.BytesIO()

    def write(self, data: memoryview) -> None:
        self.buf.write(data)


def plain_bytes(items: list[tuple[str, torch.Tensor]]) -> bytes:
    sink = Sink()
    tensor_format.write(sink, items, {"k": "v"})
    return sink.buf.getvalue()


def packed(
    items: list[tuple[str, torch.Tensor]], *, frame_bytes: int = compress.FRAME_BYTES, threads: int = 2
) -> bytes:
    codec = Codec(threads=threads, frame_bytes=frame_bytes)
    sink = Sink()
    try:
        n, digest, stats = compress.write(sink, items, {"k": "v"}, codec=codec)
    finally:
        codec.close()
    data = sink.buf.getvalue()
    assert n == len(data) == stats.stored
    assert digest == compress.checksum.of_bytes(data)
    return data


def decoded(data: bytes, *, pool: Pool | None = None, where: str = "f", expected: str | None = None) -> bytes:
    """``expected``: the stored file's checksum as COMMIT.json records it (default: that of ``data``)."""
    index = compress.read_index(_ranges(data), len(data), where=where)
    checksum = expected if expected is not None else compress.checksum.of_bytes(data)
    source = compress.DecodedSource(io.BytesIO(data), index, where=where, expected_checksum=checksum, pool=pool)
    out = bytearray(index.decoded_bytes)
    view = memoryview(out)
    got = 0
    while got < len(out):
        k = source.readinto(view[got:])
        assert k
        got += k
    assert source.readinto(memoryview(bytearray(1))) == 0
    return bytes(out)


def _ranges(data: bytes) -> Any:
    def read_range(offset: int, buffer: memoryview) -> int:
        piece = data[offset : offset + len(buffer)]
        buffer[: len(piece)] = piece
        return len(piece)

    return read_range


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int8, torch.bool]


@st.composite
def states(draw: Any) -> list[tuple[str, torch.Tensor]]:
    n = draw(st.integers(1, 6))
    items = []
    for i in range(n):
        dtype = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 40), min_size=0, max_size=3)))
        seed = draw(st.integers(0, 2**31))
        g = torch.Generator().manual_seed(seed)
        t = (torch.randn(shape, generator=g) * 3).to(dtype)
        items.append((f"t{i}", t))
    return items


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=states(), frame=st.sampled_from([8, 24, 4096, 1 << 20]), threads=st.integers(1, 3))
def test_decoding_gives_back_exactly_the_plain_safetensors_file(
    items: list[tuple[str, torch.Tensor]], frame: int, threads: int
) -> None:
    data = packed(items, frame_bytes=frame, threads=threads)
    assert data[:8] == compress.MAGIC
    with Pool(2, "test-unzstd") as pool:
        assert decoded(data, pool=pool) == plain_bytes(items)
    assert decoded(data) == plain_bytes(items)


def test_frames_hold_one_item_size_each_and_a_plane_per_byte() -> None:
    items = [("a", torch.randn(3000)), ("b", torch.randn(100).bfloat16()), ("c", torch.arange(10, dtype=torch.int8))]
    data = packed(items, frame_bytes=4096)
    index = compress.read_index(_ranges(data), len(data), where="f")
    groups = [f.group for f in index.frames]
    assert groups[0] == 1  # the header
    assert groups[1:] == [4, 4, 4, 2, 1]  # 12000 bytes of fp32 in 4096-byte frames, then bf16, then int8
    assert all(len(f.planes) == f.group for f in index.frames)
    assert sum(f.decoded for f in index.frames[1:]) == 12000 + 200 + 10


def test_ratio_on_seeded_weights() -> None:
    """Deterministic for seeded data: fp32 Gaussian weights lose about a sixth, bf16 about a third, and random bytes
    are stored as they are (a raw plane costs no more than itself)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1 << 20, generator=g) * 0.02
    fp32 = len(packed([("w", w)])) / (4 << 20)
    bf16 = len(packed([("w", w.bfloat16())])) / (2 << 20)
    noise = torch.randint(0, 256, (1 << 20,), generator=g, dtype=torch.uint8)
    raw = len(packed([("n", noise)])) / (1 << 20)
    assert 0.70 < fp32 < 0.90, fp32
    assert 0.55 < bf16 < 0.75, bf16
    assert 1.0 < raw < 1.01, raw  # the header and index on top of bytes stored raw
    assert packed([("w", w)]) == packed([("w", w)], threads=1)  # the same bytes whatever the threads


def test_a_flipped_byte_is_named_by_its_frame(tmp_path: Path) -> None:
    items = [("w", torch.randn(100_000))]
    data = bytearray(packed(items, frame_bytes=64 << 10))
    index = compress.read_index(_ranges(bytes(data)), len(data), where="f")
    at = index.stored_offsets[3] + 5
    data[at] ^= 0x40
    with pytest.raises(CheckpointCorruptError, match=r"frame at decoded byte|checksum mismatch in decoded bytes"):
        decoded(bytes(data))


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda d: d[:-1], "ending in|index length"),
        (lambda d: d[: len(d) // 2], "ending in|index length|impossible"),
        (lambda d: d[:-16] + struct.pack("<Q", 10**9) + compress.TAIL_MAGIC, "impossible"),
        (lambda d: b"XXXXXXXX" + d[8:], "starting with"),
    ],
)
def test_damaged_files_are_refused_with_what_was_expected(damage: Any, match: str) -> None:
    data = damage(packed([("w", torch.randn(5000))], frame_bytes=4096))
    with pytest.raises(CheckpointCorruptError, match=match):
        decoded(data)


def test_a_malformed_index_is_refused() -> None:
    data = packed([("w", torch.randn(5000))], frame_bytes=4096)
    (n,) = struct.unpack("<Q", data[-16:-8])
    doc = json.loads(data[-16 - n : -16])
    doc["frames"][1][1] = 3  # a group of 3 bytes: not an item size
    raw = json.dumps(doc).encode()
    bad = data[: -16 - n] + raw + struct.pack("<Q", len(raw)) + compress.TAIL_MAGIC
    with pytest.raises(CheckpointCorruptError, match="malformed"):
        decoded(bad)


# the auto choice -------------------------------------------------------------------------------------------
GB = 1 << 30
MEASURED = Measured(ratio=0.8, rate=500e6, sampled=16 << 20)


def choose(**kw: Any) -> compress.Choice:
    args: dict[str, Any] = {
        "setting": "auto",
        "measured": MEASURED,
        "bandwidth": 200e6,
        "threads": 2,
        "cores": 2,
        "background": False,
        "object_store": False,
    }
    args.update(kw)
    return compress.choose(GB, **args)


def test_auto_compresses_on_slow_storage_and_not_on_fast() -> None:
    slow = choose(bandwidth=200e6)
    assert slow.on, slow.why
    assert slow.compressed_s == pytest.approx(0.8 * GB / 200e6)
    assert slow.plain_s == pytest.approx(GB / 200e6)
    fast = choose(bandwidth=1.7e9)  # the local disk here: compression could not keep up
    assert not fast.on
    assert fast.compressed_s is not None and fast.plain_s is not None and fast.compressed_s > fast.plain_s
    # one core: 500 MB/s of compression against 480 MB/s of storage gains nothing
    assert not choose(bandwidth=480e6, cores=1).on


def test_auto_before_any_measurement_and_at_the_edges() -> None:
    assert not choose(bandwidth=None).on  # local, not yet measured: taken as fast
    assert choose(bandwidth=None, object_store=True).on  # an object store is assumed slow
    assert not choose(measured=None).on
    assert not compress.choose(
        1 << 20,
        setting="auto",
        measured=MEASURED,
        bandwidth=1e6,
        threads=2,
        cores=2,
        background=False,
        object_store=False,
    ).on  # a small state: never worth it
    assert choose(setting=True, bandwidth=10e9).on
    assert not choose(setting=False, bandwidth=1e6).on
    with pytest.raises(ValueError, match="compress=True, False or 'auto'"):
        choose(setting="yes")


def test_background_saves_compress_only_when_it_costs_little_cpu() -> None:
    big = choose(bandwidth=50e6, background=True)  # 1 GiB would cost 2 s of CPU beside training
    assert not big.on and "CPU" in big.why
    small = compress.choose(
        100 << 20,
        setting="auto",
        measured=MEASURED,
        bandwidth=20e6,
        threads=2,
        cores=2,
        background=True,
        object_store=False,
    )
    assert small.on and small.threads == 1


# through the checkpointer ----------------------------------------------------------------------------------
def state(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 256)).pow(2).mean().backward()
    opt.step()
    return {"model": model, "optimizer": opt}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    sa, sb = a["model"].state_dict(), b["model"].state_dict()
    oa, ob = a["optimizer"].state_dict()["state"], b["optimizer"].state_dict()["state"]
    return all(torch.equal(sa[k], sb[k]) for k in sa) and all(
        torch.equal(oa[i][k], ob[i][k]) for i in oa for k in oa[i]
    )


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_compressed_checkpoint_restores_bit_exact_and_says_what_it_is(tmp_path: Path, asynchronous: bool) -> None:
    src = state(0)
    ck = Checkpointer(str(tmp_path), compress=True)
    ck.save(src, 3, blocking=not asynchronous).wait()
    files = sorted(os.listdir(tmp_path / "step-000000000003"))
    assert files == ["COMMIT.json", "model.safetensors.zst", "optimizer.safetensors.zst", "state.json"]
    manifest = json.loads((tmp_path / "step-000000000003" / "COMMIT.json").read_text())
    assert manifest["format_version"] == layout.FORMAT_VERSION == 2
    dst = state(1)
    assert Checkpointer(str(tmp_path)).restore(dst) == 3
    assert same(src, dst)
    Checkpointer(str(tmp_path)).verify(3)


def test_plain_checkpoints_stay_version_1_and_plain_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    src = state(0)
    Checkpointer(str(tmp_path), compress=False).save(src, 1)
    manifest = json.loads((tmp_path / "step-000000000001" / "COMMIT.json").read_text())
    assert manifest["format_version"] == 1
    loaded = load_file(str(tmp_path / "step-000000000001" / "model.safetensors"))
    assert torch.equal(loaded["model/0.weight"], src["model"][0].weight)


def test_a_damaged_compressed_checkpoint_falls_back(tmp_path: Path) -> None:
    src = state(0)
    ck = Checkpointer(str(tmp_path), compress=True, keep=3)
    ck.save(src, 1)
    ck.save(src, 2)
    target = tmp_path / "step-000000000002" / "model.safetensors.zst"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError):
        Checkpointer(str(tmp_path)).verify(2)
    with pytest.warns(Warning, match="step 2"):
        assert Checkpointer(str(tmp_path)).restore(state(1)) == 1


def test_auto_turns_compression_on_for_a_slow_destination_by_what_it_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A destination paced to 8 MB/s: the first save (not yet measured, local) is plain, samples no compression
    and measures the storage; the second compresses, since this CPU compresses many times faster than that
    (measured in CPU time, so a busy machine does not change the outcome). With a fast destination's bandwidth the
    choice is off."""
    monkeypatch.setattr(compress, "MIN_AUTO_BYTES", 1 << 20)
    src = state(0)
    ck = Checkpointer(str(tmp_path), storage=PacedStorage(LocalStorage(str(tmp_path)), 8e6))  # type: ignore[arg-type]
    ck.save(src, 1)
    assert ck.last_choice is not None and not ck.last_choice.on
    assert "not measured yet" in ck.last_choice.why
    assert ck.compression is None  # not even sampled: off, whatever a sample would have said
    # the pacing, measured: 6.3 MB at 8 MB/s, less the bucket's burst, read 8.5-9.3 MB/s here (a disk: GB/s)
    assert ck.storage_bandwidth is not None and 6e6 < ck.storage_bandwidth < 12e6
    ck.save(src, 2)
    assert ck.last_choice.on, ck.last_choice.why
    assert any(n.endswith(".zst") for n in os.listdir(tmp_path / "step-000000000002"))
    ck.storage_bandwidth = 5e9  # as a fast disk measures
    ck.save(src, 3)
    assert not ck.last_choice.on, ck.last_choice.why
    assert Checkpointer(str(tmp_path)).restore(state(1)) == 3


class SlowSyncStorage:
    """``inner`` whose directory syncs take ``seconds`` more: time in a save's write phase that is not spent in
    its tensor files' streams, as a background save behind training spends it waiting for the CPU."""

    def __init__(self, inner: LocalStorage, seconds: float) -> None:
        self._inner = inner
        self.seconds = seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def sync_dir(self, path: str) -> None:
        import time

        time.sleep(self.seconds)
        self._inner.sync_dir(path)


def test_the_compression_choice_weighs_the_destination_not_how_long_a_save_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background save is slower end to end than its destination: one thread, at low priority, behind training.
    Here its write phase waits 1 s outside the tensor files' streams. The end-to-end figure (for deadlines) counts
    the wait; the destination's bandwidth (stored bytes over the seconds spent in its writes and fsyncs) does not,
    and that is what the next save's compression choice weighs. Weighing the end-to-end figure turned compression
    on for emergency saves to a fast disk after background saves of many small tensors, and made them 2x slower."""
    monkeypatch.setattr(compress, "MIN_AUTO_BYTES", 1 << 20)
    src = state(0)
    ck = Checkpointer(str(tmp_path), storage=SlowSyncStorage(LocalStorage(str(tmp_path)), 1.0))  # type: ignore[arg-type]
    nbytes = ck.save(src, 1, blocking=False).wait().bytes  # as stored: a little more than the state's bytes
    assert ck.bandwidth is not None and ck.bandwidth < nbytes / 1.0  # the wait, end to end
    measured = ck.storage_bandwidth
    assert measured is not None and measured > nbytes / 1.0  # a few MB written in well under the wait
    ck.save(src, 2)
    assert ck.last_choice is not None and ck.last_choice.bandwidth == measured


def test_the_pacer_holds_its_rate_on_an_injected_clock() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    pacer = Pacer(100.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        pacer.take(50)
    assert now[0] == pytest.approx(5.0 - 0.05)  # 500 bytes at 100 B/s, less the burst the bucket allows


# export ---------------------------------------------------------------------------------------------------
def test_export_writes_plain_safetensors_of_compressed_and_split_checkpoints(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from preemptible.cli import main

    src = state(0)
    root = tmp_path / "ck"
    Checkpointer(str(root), compress=True, max_file_bytes=1 << 20).save(src, 7)  # several parts per entry
    stored = os.listdir(root / "step-000000000007")
    assert sum(n.endswith(".safetensors.zst") for n in stored) > 2
    out = tmp_path / "out"
    assert main(["export", str(root), "--out", str(out)]) == 0
    names = sorted(os.listdir(out))
    assert "export.json" in names and not any(n.endswith((".zst", ".part")) for n in names)
    tensors: dict[str, torch.Tensor] = {}
    for n in names:
        if n.endswith(".safetensors"):
            tensors.update(load_file(str(out / n)))
    assert torch.equal(tensors["model/0.weight"], src["model"][0].weight)
    assert torch.equal(tensors["optimizer/state/2/exp_avg_sq"], src["optimizer"].state_dict()["state"][2]["exp_avg_sq"])
    doc = json.loads((out / "export.json").read_text())
    assert doc["step"] == 7 and set(doc["files"]) == {n for n in names if n.endswith(".safetensors")}
    # the same checkpoint saved plain exports to the same bytes
    plain_root = tmp_path / "plain"
    Checkpointer(str(plain_root), compress=False, max_file_bytes=1 << 20).save(src, 7)
    assert main(["export", str(plain_root), "--step", "7", "--out", str(tmp_path / "out2")]) == 0
    for n in names:
        if n.endswith(".safetensors"):
            assert (out / n).read_bytes() == (tmp_path / "out2" / n).read_bytes()


def test_export_refuses_damage_an_occupied_directory_and_a_missing_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from preemptible.cli import main

    root = tmp_path / "ck"
    Checkpointer(str(root), compress=True).save(state(0), 1)
    target = root / "step-000000000001" / "optimizer.safetensors.zst"
    data = bytearray(target.read_bytes())
    data[len(data) // 3] ^= 0x10
    target.write_bytes(bytes(data))
    out = tmp_path / "out"
    assert main(["export", str(root), "--out", str(out)]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert not [n for n in os.listdir(out) if n != "export.json"] and not (out / "export.json").exists()
    (out / "x").write_text("mine")
    assert main(["export", str(root), "--out", str(out)]) == 2
    assert "already holds files" in capsys.readouterr().err
    assert main(["export", str(root), "--step", "9", "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "step 9" in err and len(err.strip().splitlines()) == 1


# plan and progress ----------------------------------------------------------------------------------------
def test_plan_shows_the_compression_choice_and_its_effect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from preemptible.cli import main

    args = ["plan", str(tmp_path), "--params", "1e9", "--dtype", "bf16", "--platform", "gcp", "--json"]
    main([*args, "--bandwidth", "200e6"])
    slow = json.loads(capsys.readouterr().out)
    assert slow["compression"]["on"] is True
    assert 0.55 < slow["compression"]["ratio"] < 0.75  # bf16 weights and moments, measured here
    assert slow["breakdown"]["write_s"] == pytest.approx(slow["compression"]["compressed_s"], rel=1e-3)
    main([*args, "--bandwidth", "20e9"])
    fast = json.loads(capsys.readouterr().out)
    assert fast["compression"]["on"] is False
    assert fast["breakdown"]["write_s"] == pytest.approx(6e9 / 20e9, rel=1e-3)
    main(["plan", str(tmp_path), "--params", "1e9", "--platform", "gcp", "--bandwidth", "200e6"])
    assert "compression" in capsys.readouterr().out


def test_a_long_piece_of_work_logs_its_progress_and_a_short_one_does_not() -> None:
    import logging

    from preemptible.progress import LOG_EVERY_S, QUIET_S, Meter

    now = [0.0]
    meter = Meter("save of step 5", 1000, bar=False, deadline=30.0, clock=lambda: now[0], monotonic=lambda: now[0])
    meter.add(100)
    assert meter.lines == []  # quiet for the first seconds
    now[0] = QUIET_S + 0.5
    meter.add(100)
    assert len(meter.lines) == 1
    line = meter.lines[0]
    assert "save of step 5: 0.0 of 0.0 MB (20%)" in line and "s left" in line and "before the deadline" in line
    now[0] += 1
    meter.add(100)
    assert len(meter.lines) == 1  # not before the next interval
    now[0] += LOG_EVERY_S
    meter.add(100)
    assert len(meter.lines) == 2 and "(40%)" in meter.lines[1]
    assert logging.getLogger("preemptible") is not None


def test_a_bar_is_drawn_only_when_asked_or_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from preemptible.progress import Meter, on_terminal

    assert on_terminal() is False  # pytest captures stderr
    with Meter("export", 10_000_000) as quiet:
        quiet.add(5_000_000)
    assert capsys.readouterr().err == ""
    with Meter("export", 10_000_000, bar=True) as bar:
        bar.add(5_000_000)
    assert "export" in capsys.readouterr().err


def test_an_index_that_claims_a_huge_frame_is_refused_before_anything_is_allocated() -> None:
    data = packed([("w", torch.randn(5000))], frame_bytes=4096)
    (n,) = struct.unpack("<Q", data[-16:-8])
    doc = json.loads(data[-16 - n : -16])
    doc["frames"][1][0] = 1 << 40  # decoded bytes of one frame, kept consistent with the total
    doc["frames"][1][3:] = [1 << 38] * 4
    doc["decoded_bytes"] = sum(f[0] for f in doc["frames"])
    raw = json.dumps(doc).encode()
    bad = data[: -16 - n] + raw + struct.pack("<Q", len(raw)) + compress.TAIL_MAGIC
    with pytest.raises(CheckpointCorruptError, match="more than the"):
        compress.read_index(_ranges(bad), len(bad), where="f")


def test_a_full_disk_during_a_compressed_save_commits_nothing_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    import threading

    from faults import FaultyStorage
    from preemptible.errors import SaveError

    src = state(0)
    storage = FaultyStorage(str(tmp_path))
    ck = Checkpointer(str(tmp_path), storage=storage, compress=True)
    ck.save(src, 1)
    storage.fail_after = storage.written + (1 << 20)  # the next save fails a megabyte in
    before = threading.active_count()
    with pytest.raises((SaveError, OSError)):
        ck.save(src, 2)
    assert [c.step for c in ck.checkpoints()] == [1]
    assert not [n for n in os.listdir(tmp_path) if n.startswith("step-000000000002")]
    assert threading.active_count() <= before  # no encoder thread left behind
    assert Checkpointer(str(tmp_path)).restore(state(1)) == 1


@functools.cache
def fuzz_file() -> bytes:
    g = torch.Generator().manual_seed(3)
    items = [("w", torch.randn(3000, generator=g)), ("b", torch.randn(700, generator=g).half())]
    return packed(items, frame_bytes=2048)


@settings(max_examples=200, deadline=None)
@given(where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
@example(where=0.8447493039434811, bit=1)  # a bit zstd ignores: only the stored file's checksum sees it
def test_any_flipped_bit_is_refused_as_corruption_never_another_error(where: float, bit: int) -> None:
    """Every byte of a compressed file is covered: the magic, each frame (its checksum), the index (parsed as
    untrusted), the trailer, and the stored file's checksum. A flipped bit anywhere is a CheckpointCorruptError.
    Some bits of a zstd frame change nothing it decodes to (found: one at 84% of this file): the stored file's
    checksum, as COMMIT.json records it before the flip, is what catches those."""
    original = fuzz_file()
    data = bytearray(original)
    data[int(where * len(data))] ^= 1 << bit
    with pytest.raises(CheckpointCorruptError):
        decoded(bytes(data), expected=compress.checksum.of_bytes(original))


def test_a_drill_compares_a_compressed_and_a_plain_checkpoint_by_their_plain_bytes(tmp_path: Path) -> None:
    from preemptible.drill._compare import _plain_checksums

    src = state(0)
    sums = []
    for setting in (True, False):
        ck = Checkpointer(str(tmp_path / str(setting)), compress=setting)
        ck.save(src, 4)
        sums.append(_plain_checksums(ck, ck.verify(4)))
    assert sums[0] == sums[1] and set(sums[0]) == {"model.safetensors", "optimizer.safetensors"}


def test_the_paced_proxy_forwards_every_byte_both_ways() -> None:
    import socket
    import threading

    from preemptible.bench import PacedProxy

    server = socket.create_server(("127.0.0.1", 0))
    got = bytearray()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while len(got) < 3 << 20:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                got.extend(chunk)
            conn.sendall(compress.checksum.of_bytes(bytes(got)).encode())

    t = threading.Thread(target=serve)
    t.start()
    payload = os.urandom(3 << 20)
    with PacedProxy(server.getsockname(), 1e10) as proxy, socket.create_connection(("127.0.0.1", proxy.port)) as c:
        c.sendall(payload)
        reply = c.recv(64)
    t.join()
    server.close()
    assert bytes(got) == payload
    assert reply.decode() == compress.checksum.of_bytes(payload)
    assert proxy.pacer.rate == 1e10


@settings(max_examples=150, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(st.integers(0, 6), st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.uint8])),
        max_size=30,
    ),
    n=st.integers(0, 10),
)
def test_the_sample_is_the_largest_tensors_as_a_stable_sort_picks_them(
    shapes: list[tuple[int, torch.dtype]], n: int
) -> None:
    """`largest` (heap, sized from C) against a stable sort by decreasing stored bytes: the same tensors, in the
    same order, ties in their order, empty ones never; some stored in a dtype other than their own."""
    items = [(torch.zeros(k), dtype) for k, dtype in shapes]  # float32 tensors, stored as ``dtype``
    reference = sorted((x for x in items if x[0].numel()), key=lambda x: -x[0].numel() * x[1].itemsize)[:n]
    got = compress.largest(iter(items), n)
    assert [(id(t), d) for t, d in got] == [(id(t), d) for t, d in reference]
