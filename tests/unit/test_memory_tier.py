"""The memory tier in one process: which step is restored (property-based, over random tier contents), its bound
in bytes, parts torn mid-write, the emergency save's order, and restoring from memory ahead of the durable root.
The multi-node cases (a lost node, a damaged replica, a node and its peer lost) run under torchrun in
tests/e2e/test_memory_tier_nodes.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import preemptible
from conftest import clean_env
from preemptible.checkpoint.memtier import Holding, MemoryTier, Tier, choose, peers

# which step: a pure function of the reports ------------------------------------------------------------------------
reports_strategy = st.integers(min_value=1, max_value=4).flatmap(
    lambda world: st.tuples(
        st.just(world),
        st.lists(  # one report per rank: step -> (saving world, parts held by the rank's node)
            st.dictionaries(
                st.integers(min_value=0, max_value=8),
                st.tuples(
                    st.sampled_from([world, world, world, world + 1]),
                    st.frozensets(st.integers(min_value=0, max_value=world - 1), min_size=1),
                ),
                max_size=5,
            ),
            min_size=world,
            max_size=world,
        ),
        st.one_of(st.none(), st.integers(min_value=0, max_value=8)),
    )
)


@settings(max_examples=400, deadline=None)
@given(reports_strategy)
def test_the_step_restored_is_the_newest_complete_one_never_older_than_the_durable_one(case: object) -> None:
    world, raw, durable = case  # type: ignore[misc]
    reports = [{s: Holding(w, parts) for s, (w, parts) in r.items()} for r in raw]
    choice = choose(reports, world=world, durable=durable)

    def complete(step: int) -> bool:
        held = [r[step] for r in reports if step in r]
        return (
            bool(held)
            and {h.world for h in held} == {world}
            and set().union(*(h.parts for h in held)) == set(range(world))
        )

    every = sorted({s for r in reports for s in r}, reverse=True)
    expected = [s for s in every if complete(s) and (durable is None or s >= durable)]
    assert choice.steps == expected
    for step in choice.steps:  # every part has a holder, and each holder's node holds it
        assert set(choice.holders[step]) == set(range(world))
        for part, ranks in choice.holders[step].items():
            assert all(part in reports[r][step].parts for r in ranks)
    if not choice.steps:
        assert choice.why  # the fallback says why


def test_replicas_go_to_other_nodes_and_each_part_is_received_once() -> None:
    for world, local in ((2, 1), (4, 1), (8, 2), (6, 3)):
        nodes = world // local
        for k in (1, 2, 5):
            sent = {r: peers(r, world, local, k)[0] for r in range(world)}
            received = {r: peers(r, world, local, k)[1] for r in range(world)}
            for r, to in sent.items():
                assert len(to) == min(k, nodes - 1)
                assert all(d // local != r // local for d in to)  # never on its own node
                assert all(r in received[d] for d in to)  # what one sends, the other expects


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [({"every": 0}, "every"), ({"replicas": -1}, "replicas"), ({"keep": 0}, "keep"), ({"max_bytes": True}, "max")],
)
def test_bad_settings_are_refused_by_name(kwargs: dict[str, object], what: str) -> None:
    with pytest.raises(ValueError, match=what):
        MemoryTier(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="memory_tier"):
        MemoryTier.of("yes")  # type: ignore[arg-type]


# one process: the tier on this machine -------------------------------------------------------------------------------
def build() -> dict[str, object]:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters())}


def train(state: dict[str, object], steps: int) -> None:
    model, opt = state["model"], state["optimizer"]
    for _ in range(steps):
        loss = model(torch.randn(4, 64)).pow(2).mean()  # type: ignore[operator]
        opt.zero_grad()  # type: ignore[attr-defined]
        loss.backward()
        opt.step()  # type: ignore[attr-defined]


def tier(tmp_path: Path, **kwargs: object) -> Tier:
    ck = preemptible.Checkpointer(str(tmp_path / "root"))
    made = Tier.of(MemoryTier(dir=str(tmp_path / "mem"), **kwargs), ck)  # type: ignore[arg-type]
    assert made is not None
    return made


def test_the_tier_keeps_its_bound_in_bytes_dropping_the_oldest_first(tmp_path: Path) -> None:
    state = build()
    train(state, 1)  # the optimizer's moments exist from here on: every step's part has the same size
    t = tier(tmp_path, keep=5)
    assert t.save(state, 1, reason="periodic")
    one = t.usage()
    bounded = tier(tmp_path, keep=5, max_bytes=int(one * 2.5))
    for step in (2, 3, 4):
        train(state, 1)
        assert bounded.save(state, step, reason="periodic")
        assert bounded.usage() <= int(one * 2.5)
    assert sorted(bounded.holdings()) == [3, 4]  # 1 and 2 went first
    too_small = tier(tmp_path, max_bytes=one // 2)
    assert not too_small.save(state, 5, reason="periodic")  # cannot fit even alone: skipped, nothing lost
    assert sorted(too_small.holdings()) == [3, 4]  # nothing lost: the older steps stay
    assert not (tmp_path / "mem" / "step-000000000005").exists()


def test_a_part_torn_mid_write_is_no_part(tmp_path: Path) -> None:
    state = build()
    t = tier(tmp_path)
    assert t.save(state, 7, reason="periodic")
    part = Path(t.part_dir(7, 0))
    torn = Path(t.part_dir(8, 0) + ".tmp-123")  # a save or a replica cut off before its rename
    torn.mkdir(parents=True)
    for f in part.iterdir():
        (torn / f.name).write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    assert sorted(t.holdings()) == [7]
    (part / "COMMIT.json").write_text("{}")  # a manifest that does not parse: absent too
    assert t.holdings() == {}


@pytest.mark.parametrize(("stop_at", "tier_used"), [(8, "durable"), (7, "memory")])
def test_the_newer_of_the_two_tiers_restores_and_a_finished_run_frees_its_memory(
    tmp_path: Path, stop_at: int, tier_used: str
) -> None:
    """Durable saves at 4 and 8, memory saves at 3 and 6. Left at 8: the durable 8 is newer than memory's 6, which
    is never restored. Left at 7: memory's 6 is newer than the durable 4, and restores."""
    mem = str(tmp_path / "mem")
    root = str(tmp_path / "root")
    weights = {}

    def make() -> tuple[preemptible.Run, dict[str, object]]:
        state = build()
        run = preemptible.Run(root, save_every=4, memory_tier=MemoryTier(every=3, dir=mem), sources="signal", **state)
        return run, state

    run, state = make()
    with run:
        for step in run.steps(100):
            weights[step] = state["model"].weight.detach().clone()  # type: ignore[union-attr]
            if step == stop_at:
                break  # the process ends here: no final save, the tier stays
            train(state, 1)
    restored = 8 if tier_used == "durable" else 6
    run, state = make()
    with run:
        assert run.start_step == restored
        assert torch.equal(state["model"].weight, weights[restored])  # type: ignore[union-attr]
        # restored from the durable root: memory's steps belong to a timeline left behind, and go
        assert os.path.exists(os.path.join(mem, "step-000000000006")) == (tier_used == "memory")
        for _ in run.steps(restored + 1):
            train(state, 1)
    events = [json.loads(x) for p in sorted(Path(root, "journal").glob("*.jsonl")) for x in p.read_text().splitlines()]
    resumed = [e for e in events if e["event"] == "resume"][-1]
    assert (resumed["step"], resumed["tier"]) == (restored, tier_used)
    if tier_used == "durable":
        why = [e for e in events if e["event"] == "tier_fallback"][-1]["why"]
        assert "older than the newest durable checkpoint (step 8)" in why
    assert not os.path.exists(mem)  # the second run finished: its final checkpoint is durable, the memory freed


EMERGENCY = """
import os, signal, sys, torch, preemptible
root, mem, grace = sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else None
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run = preemptible.Run(root, model=model, optimizer=opt, save_every=100,
                      memory_tier=preemptible.MemoryTier(dir=mem), sources="signal", grace=grace)
for step in run.steps(50):
    model(torch.randn(2, 8)).sum().backward(); opt.step(); opt.zero_grad()
    if step == 5:
        os.kill(os.getpid(), signal.SIGTERM)
"""


@pytest.mark.parametrize("grace", [None, 0.001])
def test_a_notice_saves_to_memory_first_then_to_the_durable_root_as_time_allows(
    tmp_path: Path, grace: float | None
) -> None:
    """A real SIGTERM: the memory tier first, then the durable root; with no time left for the durable save (a
    window of a millisecond), it is left out, journaled, and the process still exits cleanly."""
    script = tmp_path / "train.py"
    script.write_text(EMERGENCY)
    root, mem = tmp_path / "root", tmp_path / "mem"
    done = subprocess.run(
        [sys.executable, str(script), str(root), str(mem), *([str(grace)] if grace is not None else [])],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(x) for p in (root / "journal").glob("*.jsonl") for x in p.read_text().splitlines()]
    saves = [(e.get("tier", "durable"), e["step"]) for e in events if e["event"] == "save_committed"]
    exit_event = [e for e in events if e["event"] == "exit"][-1]
    assert exit_event["saved"] is True
    assert os.path.exists(mem / "step-000000000006" / "part-00000" / "COMMIT.json")
    if grace is None:
        assert saves == [("memory", 6), ("durable", 6)]
    else:
        assert saves == [("memory", 6)]
        (skipped,) = [e for e in events if e["event"] == "save_skipped" and e["reason"] == "emergency"]
        assert "the memory tier holds it" in skipped["why"]


# plan: each tier against the window --------------------------------------------------------------------------------
def test_plan_shows_each_tier_against_the_window_and_recommends_the_memory_tier_when_only_it_fits() -> None:
    from preemptible import budget

    p = budget.evaluate(size=budget.StateSize(params=7e9, world_size=8), bandwidth=2e8, platform="gcp", mtbf_hours=24)
    assert not p.fits  # 10.5 GB a node at 200 MB/s: about 53 s, past a 30 s window
    tiers = budget.memory_tier_plan(p, copy_bytes_per_s=5e9, link_bytes_per_s=1.25e9, replicas=1, step_time=0.0)
    durable, memory = tiers
    assert (durable["tier"], durable["fits"], memory["tier"], memory["fits"]) == ("durable", False, "memory", True)
    nbytes = p.state_bytes / 8
    assert memory["predicted_save_s"] == pytest.approx(nbytes / 5e9 + nbytes / 1.25e9 + 0.05 + 0.5, rel=1e-3)
    assert memory["interval_s"] < durable["interval_s"]  # a cheaper save: Young/Daly saves it more often
    slow_link = budget.memory_tier_plan(p, copy_bytes_per_s=5e9, link_bytes_per_s=1e8, replicas=1, step_time=0.0)
    assert not slow_link[1]["fits"]  # a replica over a slow link does not fit either: the plan says so
    one_node = budget.memory_tier_plan(
        p, copy_bytes_per_s=5e9, link_bytes_per_s=1.25e9, replicas=1, step_time=0.0, ranks_per_node=8
    )[1]
    assert (one_node["nodes"], one_node["replicas"]) == (1, 0)  # 8 ranks, one node: no peer to replicate to
    assert "no replica" in one_node["how"]
    assert one_node["predicted_save_s"] == pytest.approx(8 * nbytes / 5e9 + 0.05 + 0.5, rel=1e-3)


def test_plan_cli_memory_tier(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "preemptible", "plan", str(tmp_path), "--params", "7e9", "--world-size", "8"),
            *("--platform", "gcp", "--bandwidth", "2e8", "--compress", "off", "--memory-tier", "--json"),
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr  # the durable save does not fit
    doc = json.loads(done.stdout)
    assert [t["tier"] for t in doc["tiers"]] == ["durable", "memory"]
    names = [r["name"] for r in doc["recommendations"]]
    assert ("memory tier" in names) == doc["tiers"][1]["fits"]  # recommended exactly when it fits


def test_a_tier_directory_others_could_write_is_refused(tmp_path: Path) -> None:
    from preemptible.checkpoint.memtier import own_directory

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="writable by others"):
        own_directory(str(shared))
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(PermissionError, match="not a directory"):
        own_directory(str(tmp_path / "link"))
    state = build()
    t = Tier.of(MemoryTier(dir=str(shared)), preemptible.Checkpointer(str(tmp_path / "root")))
    assert t is not None
    with pytest.raises(PermissionError, match="MemoryTier"):
        t.save(state, 1, reason="periodic")
    own_directory(str(tmp_path / "mine"))  # made here: this user's, 0700
    assert oct((tmp_path / "mine").stat().st_mode & 0o777) == "0o700"


def test_a_part_that_names_files_its_manifest_does_not_list_is_no_part(tmp_path: Path) -> None:
    from preemptible.store.layout import Manifest

    state = build()
    t = tier(tmp_path)
    assert t.save(state, 3, reason="periodic")
    commit = Path(t.part_dir(3, 0)) / "COMMIT.json"
    m = Manifest.from_json(commit.read_bytes(), where="test", expect_step=3)
    forged = Manifest(**{**m.__dict__, "extra": {**m.extra, "memory_files": ["../../../etc/passwd"]}})
    commit.write_bytes(forged.to_json())  # sealed again: only the names are wrong
    assert t.holdings() == {}


@pytest.mark.parametrize("allow_fresh_start", [False, True])
def test_a_memory_step_rejected_after_loading_never_becomes_a_fresh_start(
    tmp_path: Path, allow_fresh_start: bool
) -> None:
    """The step's bytes pass their checksums, so it is loaded; then its probe does not match (here: the restarted
    job's probe differs). With no durable checkpoint to load over the live objects, the run refuses to train on
    them, even with allow_fresh_start; the step is gone from the tier, so a new process starts fresh."""
    mem, root = str(tmp_path / "mem"), str(tmp_path / "root")
    x = torch.randn(4, 64)

    def make(shift: float, **kw: object) -> tuple[preemptible.Run, dict[str, object]]:
        state = build()
        model = state["model"]
        probe = lambda: float(model(x).pow(2).mean()) + shift  # type: ignore[operator]  # noqa: E731
        tier_ = MemoryTier(every=3, dir=mem)
        return preemptible.Run(
            root, save_every=1000, memory_tier=tier_, probe=probe, sources="signal", **kw, **state
        ), state

    run, state = make(0.0)
    with run:
        for step in run.steps(100):
            if step == 4:
                break
            train(state, 1)
    run, _ = make(1.0, allow_fresh_start=allow_fresh_start)
    with pytest.raises(preemptible.CheckpointCorruptError, match="memory tier's step 3 was loaded"), run:
        _ = run.start_step  # the resume
    assert not os.path.exists(os.path.join(mem, "step-000000000003", "part-00000"))
    run, _ = make(1.0)
    with run:
        assert run.start_step == 0  # a new process, new objects: fresh, as the error said


def test_diagnose_and_report_tell_memory_saves_from_durable_ones(tmp_path: Path) -> None:
    mem, root = str(tmp_path / "mem"), str(tmp_path / "root")
    state = build()
    run = preemptible.Run(root, save_every=1000, memory_tier=MemoryTier(every=3, dir=mem), sources="signal", **state)
    with run:
        for step in run.steps(100):
            if step == 7:
                break
            train(state, 1)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "preemptible", *args],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    diagnosed = cli("diagnose", "--root", root, "--json")
    ck = json.loads(diagnosed.stdout)["checkpoint"]
    assert (ck["last_committed"], ck["last_memory"]) == (None, 6), ck
    reported = cli("report", root)
    assert reported.returncode == 0, reported.stderr
    assert "saves by tier: memory 2" in reported.stdout, reported.stdout
