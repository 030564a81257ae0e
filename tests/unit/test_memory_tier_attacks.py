"""Attacks on the memory tier's promises (docs/distributed.md), one process each: what a damaged, shared or
cluttered tier directory does to a restore, the byte bound, leaks, and the settings' errors."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz_entry_points import watched

import preemptible
from preemptible.checkpoint.memtier import MemoryTier, Tier, own_directory
from preemptible.store.layout import Manifest


def build(seed: int = 0) -> dict[str, object]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(16, 16)
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters())}


def train(state: dict[str, object], steps: int = 1) -> None:
    model, opt = state["model"], state["optimizer"]
    for _ in range(steps):
        model(torch.randn(4, 16)).pow(2).mean().backward()  # type: ignore[operator]
        opt.step()  # type: ignore[attr-defined]
        opt.zero_grad()  # type: ignore[attr-defined]


def tier(base: Path, **kwargs: object) -> Tier:
    made = Tier.of(MemoryTier(dir=str(base / "mem"), **kwargs), preemptible.Checkpointer(str(base / "root")))  # type: ignore[arg-type]
    assert made is not None
    return made


def events(root: Path) -> list[dict[str, object]]:
    return [json.loads(x) for p in sorted((root / "journal").glob("*.jsonl")) for x in p.read_text().splitlines()]


def run_until(root: Path, mem: Path, state: dict[str, object], stop_at: int, **kwargs: object) -> None:
    """A run with a memory save every 3 steps that ends (no final save) at ``stop_at``: the tier stays."""
    run = preemptible.Run(
        str(root), save_every=1000, memory_tier=MemoryTier(every=3, dir=str(mem)), sources="signal", **kwargs, **state
    )
    with run:
        for step in run.steps(100):
            if step == stop_at:
                break
            train(state)


# 1. a restore from memory never yields wrong weights silently ------------------------------------------------------
def test_a_memory_step_that_fails_its_checks_leaves_a_fresh_start_with_its_own_weights(tmp_path: Path) -> None:
    """The only memory step has one flipped bit in its weights and there is no durable checkpoint: the run starts
    fresh (step 0), so its weights must be the freshly built ones, not the damaged step's half-loaded ones."""
    root, mem = tmp_path / "root", tmp_path / "mem"
    run_until(root, mem, build(), stop_at=4, async_save=False)
    f = mem / "step-000000000003" / "part-00000" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0x40  # the last byte of the bias
    f.write_bytes(bytes(data))
    state = build()
    fresh = state["model"].weight.detach().clone()  # type: ignore[union-attr]
    run = preemptible.Run(
        str(root), save_every=1000, memory_tier=MemoryTier(every=3, dir=str(mem)), sources="signal", **state
    )
    with run:
        assert run.start_step == 0
        assert any(e["event"] == "tier_fallback" for e in events(root))
        assert torch.equal(state["model"].weight, fresh)  # type: ignore[union-attr]


def test_a_tier_directory_shared_by_two_jobs_restores_only_its_own_jobs_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$PREEMPTIBLE_MEMORY_DIR`` names the node's tier for every job on it: job B (another durable root, nothing
    saved yet) must not start from job A's state left in that directory."""
    monkeypatch.setenv("PREEMPTIBLE_MEMORY_DIR", str(tmp_path / "mem"))
    run = preemptible.Run(
        str(tmp_path / "job-a"), save_every=1000, memory_tier=MemoryTier(every=3), sources="signal", **build()
    )
    state_a = dict(run.state)
    with run:
        for step in run.steps(100):
            if step == 4:
                break
            train(state_a)  # type: ignore[arg-type]
    state = build(1)
    run = preemptible.Run(
        str(tmp_path / "job-b"), save_every=1000, memory_tier=MemoryTier(every=3), sources="signal", **state
    )
    with run:
        assert run.start_step == 0


@pytest.mark.parametrize(
    "stray",
    [
        lambda d: (d / "step-000000000009").write_text("not a directory"),
        lambda d: (d / ("step-" + "\u00b2" * 12)).mkdir(),  # str.isdigit() is true, int() refuses it
        lambda d: (d / "step-000000000001" / ("part-" + "\u00b2" * 5)).mkdir(),
    ],
    ids=["a-file-named-like-a-step", "a-step-of-superscript-digits", "a-part-of-superscript-digits"],
)
def test_stray_entries_in_the_tier_directory_do_not_crash_a_restore(tmp_path: Path, stray: object) -> None:
    state = build()
    t = tier(tmp_path)
    assert t.save(state, 1, reason="periodic")
    stray(Path(t.dir))  # type: ignore[operator]
    assert sorted(t.holdings()) == [1]
    assert t.restore(build(5), durable=None)[0] == 1


# 4. the byte bound -------------------------------------------------------------------------------------------------
def test_a_save_never_leaves_the_tier_over_max_bytes(tmp_path: Path) -> None:
    state = build()
    train(state)
    probe = tier(tmp_path / "probe")
    assert probe.save(state, 1, reason="periodic")
    one = probe.usage()  # one step's bytes on the tier: headers and COMMIT.json included
    bounded = tier(tmp_path / "bounded", max_bytes=one - 1000)
    saved = bounded.save(state, 1, reason="periodic")
    assert bounded.usage() <= one - 1000, f"saved={saved}, usage {bounded.usage()} over max_bytes {one - 1000}"


def test_a_save_that_cannot_fit_is_skipped_losing_nothing(tmp_path: Path) -> None:
    state = build()
    train(state)
    t = tier(tmp_path, keep=3)
    assert t.save(state, 1, reason="periodic")
    one = t.usage()
    bounded = tier(tmp_path, keep=3, max_bytes=int(one * 1.5))
    big = torch.nn.Linear(128, 128)  # about 66 kB: more than the whole bound
    assert not bounded.save({"model": big}, 2, reason="periodic")
    assert sorted(bounded.holdings()) == [1]  # step 1 is still there: the skipped save took nothing with it


# 9. leaks of the tier's memory ----------------------------------------------------------------------------------------
def test_a_finished_runs_clear_frees_parts_torn_by_an_earlier_process(tmp_path: Path) -> None:
    """A process killed mid-save (the notice's deadline) leaves ``part-N.tmp-<pid>``: it is never read, and clearing
    the tier (a finished run) must free it too, or it stays in the node's memory for good."""
    state = build()
    t = tier(tmp_path)
    assert t.save(state, 7, reason="periodic")
    for step, pid in ((7, 99998), (8, 99999)):
        torn = Path(t.part_dir(step, 0) + f".tmp-{pid}")
        torn.mkdir(parents=True, exist_ok=True)
        (torn / "model.safetensors").write_bytes(b"x" * 4096)
    t.clear()
    assert not os.path.exists(t.dir), sorted(str(p) for p in Path(t.dir).rglob("*"))


# 5 and 6. clear errors ----------------------------------------------------------------------------------------------
def test_a_symlinked_tier_directory_is_refused_without_blaming_the_links_own_mode(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "mine", target_is_directory=True)
    with pytest.raises(PermissionError) as e:
        own_directory(str(tmp_path / "link"))
    assert "link" in str(e.value)
    assert "writable by others" not in str(e.value)  # a link's mode is always 777: it is not what is wrong


@pytest.mark.parametrize("bad", [123, ""])
def test_a_tier_directory_that_is_no_path_is_refused_by_name(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="dir"):
        MemoryTier(dir=bad)  # type: ignore[arg-type]


# the hostile-input suite's invariants, on generated tamperings of a memory tier ---------------------------------------
TAMPERINGS = ("flip", "truncate", "link-out", "reseal", "extra", "fifo", "drop-commit")


@settings(max_examples=int(os.environ.get("PREEMPTIBLE_ENTRY_FUZZ_EXAMPLES", "20")), deadline=None)
@given(how=st.sampled_from(TAMPERINGS), which=st.integers(min_value=0, max_value=10), at=st.integers(min_value=0))
def test_a_tampered_memory_step_never_restores_wrong_state_nor_reads_outside(how: str, which: int, at: int) -> None:
    """Step 2 of a tier is tampered with as an attacker with the tier's files could (resealed manifests included):
    the restore raises nothing, opens nothing outside the tier (an audit hook sees every open), and gives either
    step 2 exactly or, when it was refused, step 1 exactly."""
    with tempfile.TemporaryDirectory(prefix="memtier-fuzz-") as tmp:
        base, secret = Path(tmp), Path(tmp) / "secret"
        secret.mkdir()
        (secret / "model.safetensors").write_bytes(b"\0" * 4096)
        t = tier(base, keep=2)
        state = build()
        saved = {}
        for step in (1, 2):
            train(state)
            assert t.save(state, step, reason="periodic")
            saved[step] = state["model"].weight.detach().clone()  # type: ignore[union-attr]
        part = Path(t.part_dir(2, 0))
        files = sorted(p for p in part.iterdir() if p.name != "COMMIT.json")
        victim = files[which % len(files)]
        commit = part / "COMMIT.json"
        if how == "flip":
            data = bytearray(victim.read_bytes())
            data[at % len(data)] ^= 0x01
            victim.write_bytes(bytes(data))
        elif how == "truncate":
            victim.write_bytes(victim.read_bytes()[: at % max(1, victim.stat().st_size)])
        elif how == "link-out":
            victim.unlink()
            victim.symlink_to(secret / "model.safetensors")
        elif how == "reseal":  # a record's size and checksum rewritten, the manifest sealed again
            m = Manifest.from_json(commit.read_bytes(), where="test", expect_step=2)
            name = sorted(m.files)[which % len(m.files)]
            rec = m.files[name]
            forged = {**m.files, name: type(rec)(rec.bytes + 1, "0" * len(rec.checksum))}
            commit.write_bytes(Manifest(**{**m.__dict__, "files": forged}).to_json())
        elif how == "extra":
            (part / "payload.py").write_text(f"open({str(secret / 'ran')!r}, 'w').close()\n")
        elif how == "fifo":
            commit.unlink()
            os.mkfifo(commit)
        else:
            commit.unlink()
        live = build(7)
        with watched() as seen:
            restored, _why = t.restore(live, durable=None)
        assert restored in (1, 2), (how, _why)
        assert torch.equal(live["model"].weight, saved[restored])  # type: ignore[union-attr]
        assert not (secret / "ran").exists()
        for kind, path, _detail in seen:
            if kind == "open":
                assert not os.path.realpath(path).startswith(str(secret)), f"opened {path} outside the tier"
