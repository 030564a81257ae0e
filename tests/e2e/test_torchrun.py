"""Real torchrun, gloo, CPU: ranks stop together at one agreed step, save striped, commit once, resume exactly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, clean_env, final_digest, wait_for_event
from preemptible.emulate import AwsEmulator
from torchrunkit import EXAMPLE, FSDP, Torchrun, free_port, journals, last

ARGS = ("--steps", "90", "--save-every", "40")
SLOW = ("--step-time", "0.02")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    digests = {}
    for nproc in (2, 3):
        code, out, err = Torchrun(tmp_path_factory.mktemp(f"ref{nproc}") / "ckpt", nproc, *ARGS).finish()
        assert code == 0, err
        digests[nproc] = final_digest(out)
    return digests


@pytest.mark.parametrize("nproc", [2, 3])
def test_sigterm_to_torchrun_stops_every_rank_at_one_step_and_resumes_exactly(
    tmp_path: Path, reference: dict[int, str], nproc: int
) -> None:
    root = tmp_path / "ckpt"
    t = Torchrun(root, nproc, *ARGS, *SLOW)
    t.wait_for_step(50)
    t.proc.send_signal(signal.SIGTERM)
    code, _, err = t.finish()
    assert code == 1, err  # torchrun raises SignalException after a SIGTERM to its agent, whatever the workers did
    ranks = journals(root)
    assert sorted(ranks) == list(range(nproc))
    stops = {r: last(ev, "exit")["step"] for r, ev in ranks.items()}
    assert len(set(stops.values())) == 1, stops
    stop = stops[0]
    assert all(last(ev, "exit")["code"] == 0 and last(ev, "exit")["saved"] for ev in ranks.values())
    commit = json.loads((root / f"step-{stop:012d}" / "COMMIT.json").read_text())
    assert commit["world_size"] == nproc
    assert {f"_rng-r{r:05d}.safetensors" for r in range(nproc)} <= set(commit["files"])

    code, out, err = Torchrun(root, nproc, *ARGS).finish()
    assert code == 0, err
    assert f"resumed_from={stop}" in out
    assert final_digest(out) == reference[nproc]

    # What the preemption cost, from the journals of both attempts (every rank writes one; rank 0's is read).
    from preemptible import report
    from preemptible.store.io import storage_for

    doc = report.report(storage_for(str(root)))
    assert doc["attempts"] == 2 and doc["finished"] is True
    assert [(r["from_step"], r["to_step"], r["redone_steps"]) for r in doc["runs"]] == [(0, stop, 0), (stop, 90, 0)]
    (p,) = doc["preemptions"]
    assert (p["step"], p["resumed_from"], p["steps_lost"]) == (stop, stop, 0) and p["notice_to_commit_s"] > 0
    assert 0 < doc["goodput"] < 1

    # The same checkpoint restores into a single process (2 or 3 ranks -> 1), replicated state intact.
    import torch

    import preemptible

    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.7)
    ck = preemptible.Checkpointer(str(root))
    assert (
        ck.restore({"model": model, "optimizer": opt, "scheduler": sched, "_rng": preemptible.RNGState()}, step=stop)
        == stop
    )
    assert sched.last_epoch == stop
    # ... and the striped weights load whole for inference, as the restore put them in place
    whole = preemptible.load(str(root), step=stop, entry="model")
    assert whole.keys() == model.state_dict().keys()
    assert all(torch.equal(whole[k], v) for k, v in model.state_dict().items())


def test_the_readmes_bare_loop_under_torchrun_stops_both_ranks_at_one_step_each_with_its_own_random_streams(
    tmp_path: Path,
) -> None:
    """The docs' custom loop (`tests/scripts/bare_loop.py`) launched by torchrun as it stands: SIGTERM to
    torchrun stops both ranks at one step, whose checkpoint holds each rank's random streams in a file of its own
    (``per_rank=["rng"]``; without it the emergency save reports that the streams differ between ranks); both
    ranks resume there and end bit-identical to a run never stopped."""
    script = REPO / "tests" / "scripts" / "bare_loop.py"
    code, out, err = Torchrun(tmp_path / "ref", 2, "--steps", "200", script=script).finish()
    assert code == 0, err
    finals = re.findall(r"final resumed_from=([0-9]+) digest=([0-9a-f]{16})", out)
    assert len(finals) == 2 and set(finals) == {("0", finals[0][1])}, finals  # both ranks, one digest
    digest = finals[0][1]

    root = tmp_path / "ckpt"
    t = Torchrun(root, 2, "--steps", "200", *SLOW, script=script)
    t.wait_for_step(40)
    t.proc.send_signal(signal.SIGTERM)
    code, out, err = t.finish()
    assert code == 1, err  # torchrun's own SignalException, whatever the workers did
    # the two ranks print to one pipe: a line of one may run into the other's (seen beside a CPU-heavy process)
    saved = re.findall(r"saved step=[0-9]+ plan=(?:general|refilled|made)", out)
    assert len(saved) == 2 and len(set(saved)) == 1, saved
    stop = int(saved[0].split()[1].removeprefix("step="))
    commit = json.loads((root / f"step-{stop:012d}" / "COMMIT.json").read_text())
    assert commit["world_size"] == 2
    assert {"rng-r00000.safetensors", "rng-r00001.safetensors"} <= set(commit["files"])
    assert "differ between ranks" not in err

    code, out, err = Torchrun(root, 2, "--steps", "200", script=script).finish()
    assert code == 0, err
    assert (
        re.findall(r"final resumed_from=[0-9]+ digest=[0-9a-f]{16}", out)
        == [f"final resumed_from={stop} digest={digest}"] * 2
    )


def test_sigterm_to_one_worker_stops_all_ranks_together(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    t = Torchrun(root, 2, *ARGS, *SLOW)
    t.wait_for_step(45)
    worker = last(journals(root)[1], "start")["pid"]
    os.kill(worker, signal.SIGTERM)
    code, _, err = t.finish()
    assert code == 0, err  # every worker exited 0 after its checkpoint: torchrun reports success
    ranks = journals(root)
    assert last(ranks[1], "notice")["detail"] == "SIGTERM"
    assert last(ranks[0], "notice")["detail"] == "SIGTERM (seen by rank 1)"
    assert last(ranks[0], "exit")["step"] == last(ranks[1], "exit")["step"]
    assert (root / f"step-{last(ranks[0], 'exit')['step']:012d}" / "COMMIT.json").exists()


def test_a_cloud_notice_polled_by_one_rank_reaches_all(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    with AwsEmulator() as emu:
        # AWS is polled once a second: the run must outlast a poll after the notice (90 steps of 0.02 s left 0.9 s,
        # and the notice was now and then seen only after the run had finished)
        t = Torchrun(
            root,
            2,
            "--steps",
            "1500",
            "--save-every",
            "40",
            *SLOW,
            env={"PREEMPTIBLE_SOURCES": "signal,aws", "PREEMPTIBLE_AWS_ENDPOINT": emu.url},
        )
        t.wait_for_step(45)
        emu.notice()
        code, _, err = t.finish()
        gets = [r for r in emu.requests if r.method == "GET"]
    assert code == 0, err
    ranks = journals(root)
    assert last(ranks[0], "notice")["source"] == "aws"
    assert last(ranks[1], "notice")["source"] == "aws"
    assert "seen by rank 0" in last(ranks[1], "notice")["detail"]  # local rank 1 never polled
    assert last(ranks[0], "exit")["step"] == last(ranks[1], "exit")["step"] < 1500  # stopped by the notice
    assert gets


def test_a_rank_killed_during_the_save_means_no_commit(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    env = {"PREEMPTIBLE_COORD_TIMEOUT": "5"}
    t = Torchrun(root, 2, "--steps", "1000", "--save-every", "20", "--hidden", "200000", env=env)
    wait_for_event(root, lambda e: e["event"] == "save_committed" and e["step"] == 20 and e["rank"] == 0, timeout=90)
    started = wait_for_event(
        root, lambda e: e["event"] == "save_started" and e["step"] == 40 and e["rank"] == 1, timeout=90
    )
    pids = {rank: next(e["pid"] for e in events if e["event"] == "start") for rank, events in journals(root).items()}
    os.kill(pids[1], signal.SIGKILL)
    failed = wait_for_event(root, lambda e: e["event"] == "save_failed" and e["rank"] == 0, timeout=90)
    # rank 0 gave up on the save; it is now blocked in DDP's allreduce with a dead peer, and torchrun would wait 30 s
    # before SIGKILLing it: end it now
    os.kill(pids[0], signal.SIGKILL)
    code, _, _ = t.finish(timeout=120)
    assert code != 0
    assert started["step"] == 40 and failed["step"] == 40
    assert not (root / "step-000000000040" / "COMMIT.json").exists()
    from preemptible import Checkpointer

    assert Checkpointer(str(root)).verify(20).step == 20  # the previous checkpoint is intact


def test_fsdp2_sharded_state_saved_per_rank_resumes_exactly_and_on_another_world_size(tmp_path: Path) -> None:
    ref = Torchrun(tmp_path / "ref", 2, script=FSDP)
    code, out, err = ref.finish()
    assert code == 0, err
    root = tmp_path / "ckpt"
    t = Torchrun(root, 2, *SLOW, script=FSDP)
    t.wait_for_step(50)
    t.proc.send_signal(signal.SIGTERM)
    t.finish()
    stop = last(journals(root)[0], "exit")["step"]
    files = set(json.loads((root / f"step-{stop:012d}" / "COMMIT.json").read_text())["files"])
    assert {"model-r00000.safetensors", "model-r00001.safetensors", "optimizer-r00001.safetensors"} <= files
    code, resumed, err = Torchrun(root, 2, script=FSDP).finish()
    assert code == 0, err
    assert f"resumed_from={stop}" in resumed
    assert final_digest(resumed) == final_digest(out)
    # The final checkpoint's weights exported whole, for inference in one process without torch.distributed: the
    # same bytes the run's full_tensor() digest saw, and a plain model of the same shape takes them strictly.
    import hashlib

    import torch
    from safetensors.torch import load_file

    from preemptible import load
    from preemptible.cli import main

    assert main(["export", str(root), "--entry", "model", "--out", str(tmp_path / "export")]) == 0
    weights = load_file(str(tmp_path / "export" / "model.safetensors"))
    h = hashlib.sha256()
    for key in ("0.weight", "0.bias", "3.weight", "3.bias"):
        h.update(weights[key].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    assert h.hexdigest()[:16] == final_digest(out)
    plain = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 1))
    plain.load_state_dict(weights)
    full = load(str(root), entry="optimizer")
    assert full["state"][0]["exp_avg"].shape == (64, 16)  # the moments whole too
    # another world size reshards (tests/e2e/test_reshard.py)
    code, grown, err = Torchrun(root, 3, "--steps", "92", script=FSDP).finish()
    assert code == 0, err
    assert "resumed_from=90" in grown and "final step=92" in grown


def test_drill_of_a_torchrun_job(tmp_path: Path) -> None:
    # SIGTERM to the agent: every rank stops at one step and commits; the agent itself exits 1 (its
    # SignalException), which the drill reports as torchrun's doing rather than a failed stop
    root = tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(EXAMPLE), "--root", str(root)]
    cmd += ["--steps", "100000", "--save-every", "1000"]
    proc = subprocess.run(
        [sys.executable, "-m", "preemptible", "drill", "--at", "0.5", "--json", "--", *cmd],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
        check=False,
    )
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["passed"], json.dumps(doc, indent=1) + "\n" + proc.stderr[-4000:]
    assert doc["checkpoint_step"] == doc["resumed_step"] > 0
    (exited,) = [c for c in doc["checks"] if c["name"] == "the process exited cleanly"]
    assert "torchrun's agent" in exited["detail"]


PER_RANK_SCRIPT = REPO / "tests" / "scripts" / "per_rank_dict.py"


def test_bug_per_rank_dict_replaced_by_rank0_after_resume(tmp_path: Path) -> None:
    """Regression (issue 13, bug 2): the reported script, unchanged (no per_rank=). SIGTERM -> the emergency save
    finds the dict differs between ranks, writes it per rank and says so; the resume gives each rank its own."""
    root = tmp_path / "ckpt"
    t = Torchrun(root, 2, "--steps", "40", "--step-time", "0.05", script=PER_RANK_SCRIPT)
    t.wait_for_step(5)
    t.proc.send_signal(signal.SIGTERM)
    code, _, err = t.finish()
    assert code == 1, err
    ranks = journals(root)
    stop = last(ranks[0], "exit")["step"]
    assert all(last(ev, "exit")["saved"] for ev in ranks.values()), err
    diverged = last(ranks[0], "state_diverged")
    assert diverged["keys"] == ["mine"] and diverged["ranks"] == [1]
    assert "per_rank=" in err
    files = json.loads((root / f"step-{stop:012d}" / "COMMIT.json").read_text())["files"]
    assert {"state-r00000.json", "state-r00001.json"} <= set(files)

    code, out, err = Torchrun(root, 2, "--steps", "40", script=PER_RANK_SCRIPT).finish()
    assert code == 0, err
    # two ranks print to one pipe: print() writes its text and its newline apart, so lines can interleave
    found = re.findall(r"final rank (\d+) offset (\d+) resumed_from=(\d+|None)", out)  # not \w+: "6final rank 1"
    finals = {int(r): (int(o), f) for r, o, f in found}
    assert finals == {0: (40, str(stop)), 1: (1040, str(stop))}, (out[-3000:], err[-3000:], journals(root))
    starts = {r: [e["attempt"] for e in ev if e["event"] == "start"] for r, ev in journals(root).items()}
    assert starts == {0: [1, 2], 1: [1, 2]}, starts  # one number per launch, the same on every rank


def test_periodic_save_of_divergent_state_is_a_clear_error(tmp_path: Path) -> None:
    code, _, err = Torchrun(tmp_path / "ckpt", 2, "--steps", "6", "--save-every", "2", script=PER_RANK_SCRIPT).finish()
    assert code != 0
    assert "StateDivergenceError" in err and "['mine']" in err and "per_rank=" in err and "rank(s) [1]" in err
    assert not list((tmp_path / "ckpt").glob("step-*/COMMIT.json"))  # nothing committed with rank 0's values only
