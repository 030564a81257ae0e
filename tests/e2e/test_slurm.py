"""Real Slurm (22.05, Debian's slurm-wlm): a one-node cluster on loopback (scripts/slurm_cluster.py), real sbatch
jobs running ``srun python examples/train.py`` and ``srun torchrun ... examples/train_ddp.py``.

Each scenario ends with the job's final digest equal to an uninterrupted run's (bit-identical), and the journal
shows what happened: the notice, the emergency checkpoint, the requeue (or, after a user's plain ``scancel``, none).

The cluster needs root and the packages (``scripts/install-system`` installs them). Without them these tests skip,
saying why; under ``CI=true`` they fail instead.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, clean_env
from torchrunkit import free_port, journals

spec = importlib.util.spec_from_file_location("slurm_cluster", REPO / "scripts" / "slurm_cluster.py")
assert spec is not None and spec.loader is not None
slurm_cluster = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slurm_cluster)

PY = sys.executable
TRAIN = REPO / "examples" / "train.py"
DDP = REPO / "examples" / "train_ddp.py"
WAIT_S = 240  # a guard against a hung cluster, not a bound on the work: Slurm's own delays are tens of seconds


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    why = slurm_cluster.missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the Slurm tests must run in CI, but the cluster cannot start: {why}")
        pytest.skip(f"no Slurm cluster here: {why}")
    d = tmp_path_factory.mktemp("slurm")
    conf = slurm_cluster.start(d)
    try:
        yield clean_env(SLURM_CONF=str(conf))
    finally:
        slurm_cluster.stop(d)


def sbatch(env: dict[str, str], script: str) -> str:
    done = subprocess.run(["sbatch", "--parsable"], input=script, capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip().split(";")[0]


def job(env: dict[str, str], job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, env=env, check=True)
    return dict(t.partition("=")[::2] for t in out.stdout.split() if "=" in t)


def wait_for(env: dict[str, str], job_id: str, states: tuple[str, ...]) -> dict[str, str]:
    deadline = time.monotonic() + WAIT_S
    while True:
        info = job(env, job_id)
        if info["JobState"] in states:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} never reached {states}: {info}")
        time.sleep(0.5)


def wait_for_output(path: Path, text: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not (path.exists() and text in path.read_text(errors="replace")):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never said {text!r}")
        time.sleep(0.2)


def batch(out: Path, *lines: str, partition: str = "high", cpus: int = 1, extra: tuple[str, ...] = ()) -> str:
    head = [f"--partition={partition}", f"--cpus-per-task={cpus}", f"--output={out}", "--open-mode=append", *extra]
    body = ["#!/bin/bash", *(f"#SBATCH {h}" for h in head), 'echo "attempt restart=${SLURM_RESTART_COUNT:-0}"']
    return "\n".join([*body, *lines]) + "\n"


class References:
    """Uninterrupted runs of the same commands outside Slurm, started at once in the background: their digests."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[tuple[str, ...], subprocess.Popen[str]] = {}

    def start(self, *args: str, ddp: bool = False) -> None:
        args = _no_sleep(args)
        if args in self.procs:
            return
        root = self.tmp / f"ref-{len(self.procs)}"
        if ddp:
            cmd = [PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
            cmd += ["--master-port", str(free_port()), str(DDP), "--root", str(root), *args]
        else:
            cmd = [PY, str(TRAIN), "--root", str(root), *args]
        self.procs[args] = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=clean_env()
        )

    def digest(self, *args: str) -> str:
        out, _ = self.procs[_no_sleep(args)].communicate(timeout=WAIT_S)
        return digest(out)


def _no_sleep(args: tuple[str, ...]) -> tuple[str, ...]:
    """--step-time only sleeps: the digest does not depend on it."""
    out = list(args)
    if "--step-time" in out:
        i = out.index("--step-time")
        del out[i : i + 2]
    return tuple(out)


def digest(text: str) -> str:
    finals = [line for line in text.splitlines() if line.startswith("final step=")]
    assert finals, f"no final line in:\n{text[-3000:]}"
    return finals[-1].rsplit("digest=", 1)[1]


def events(root: Path, name: str) -> list[dict[str, Any]]:
    return [e for evs in journals(root).values() for e in evs if e["event"] == name]


def notice_to_commit(root: Path) -> list[tuple[float, float]]:
    """(seconds from each notice's arrival to its emergency commit, the window the notice gave), from the journal."""
    from datetime import datetime

    def t(stamp: str) -> float:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    out = []
    for evs in journals(root).values():
        for i, e in enumerate(evs):
            if e["event"] == "notice":
                commit = next(x for x in evs[i:] if x["event"] == "save_committed")
                window = t(e["deadline"]) - t(e["received_at"]) if e.get("deadline") else float("nan")
                out.append((round(t(commit["t"]) - t(e["received_at"]), 3), round(window, 1)))
    return out


# Long enough that neither low job can finish before the other has started and reached step 20 (torchrun's start
# on a loaded 2-core machine took longer than the single job's 120 steps once), when the high job preempts both.
PREEMPT = ("--steps", "300", "--step-time", "0.05", "--save-every", "1000")
PREEMPT_DDP = ("--steps", "160", "--step-time", "0.05", "--save-every", "1000")
TIMELIMIT = ("--steps", "140", "--step-time", "0.25", "--save-every", "1000")  # 35 s: past t=30 s, the latest USR1
CANCEL = ("--steps", "400", "--step-time", "0.05", "--save-every", "1000")
MODES = {"batch": ("--signal=B:USR1@30", "exec srun"), "step": ("--signal=USR1@30", "recipes/slurm/train.sbatch")}
RECIPE = REPO / "recipes" / "slurm" / "train.sbatch"


@pytest.fixture(scope="module")
def campaign(cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every scenario's jobs, submitted so that they run side by side: first the jobs to preempt, then (once the
    preempting job holds the node, so it preempts exactly them) the time-limit and scancel jobs."""
    tmp = tmp_path_factory.mktemp("jobs")
    refs = References(tmp)
    for args, ddp in ((PREEMPT, False), (PREEMPT_DDP, True), (TIMELIMIT, False), (CANCEL, False)):
        refs.start(*args, ddp=ddp)
    jobs: dict[str, Any] = {"refs": refs, "tmp": tmp}

    def submit(name: str, command: str, **kw: Any) -> None:
        out = tmp / f"{name}.out"
        jobs[name] = (sbatch(cluster, batch(out, command, **kw)), out, tmp / name)

    port = free_port()
    torchrun = f"{PY} -m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 --master-port {port}"
    low = {"partition": "low", "extra": ("--requeue",)}
    submit("preempt", f"exec srun {PY} {TRAIN} --root {tmp / 'preempt'} {' '.join(PREEMPT)}", **low)
    submit(
        "preempt_ddp", f"exec srun {torchrun} {DDP} --root {tmp / 'preempt_ddp'} {' '.join(PREEMPT_DDP)}", cpus=2, **low
    )
    wait_for_output(jobs["preempt"][1], "step 20 ")
    wait_for_output(jobs["preempt_ddp"][1], "step 20 ")
    submit("high", "sleep 2", cpus=slurm_cluster.CPUS)  # needs the whole node: both low jobs must go
    wait_for(cluster, jobs["high"][0], ("RUNNING", "COMPLETED"))
    signal, launch = MODES["batch"]
    command = f"{launch} {PY} {TRAIN} --root {tmp / 'batch'} {' '.join(TIMELIMIT)}"
    submit("batch", command, extra=("--requeue", "--time=1", signal))
    # --signal=USR1@N to the steps: the recipe as a user would submit it, its own #SBATCH lines overridden
    out = tmp / "step.out"
    argv = ["sbatch", "--parsable", "--partition=high", f"--output={out}", "--time=1", MODES["step"][0]]
    argv += [str(RECIPE), PY, str(TRAIN), "--root", str(tmp / "step"), *TIMELIMIT]
    recipe_env = {**cluster, "CKPT_ROOT": str(tmp / "step")}
    done = subprocess.run(argv, capture_output=True, text=True, env=recipe_env, check=True)
    jobs["step"] = (done.stdout.strip().split(";")[0], out, tmp / "step")
    for name in ("cancel", "cancel_usr1"):
        submit(name, f"exec srun {PY} {TRAIN} --root {tmp / name} {' '.join(CANCEL)}", extra=("--requeue",))
    for name, how in (("cancel", []), ("cancel_usr1", ["--signal=USR1"])):  # a user's scancel, mid-run
        wait_for_output(jobs[name][1], "step 20 ")
        subprocess.run(["scancel", *how, jobs[name][0]], env=cluster, check=True)
    return jobs


def finished(cluster: dict[str, str], entry: tuple[str, Path, Path]) -> dict[str, str]:
    info = wait_for(cluster, entry[0], ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"))
    assert info["JobState"] == "COMPLETED", entry[1].read_text(errors="replace")[-3000:]
    return info


@pytest.mark.timeout(WAIT_S + 60)
def test_partition_preemption_requeues_and_resumes_bit_identical(
    cluster: dict[str, str], campaign: dict[str, Any]
) -> None:
    """Jobs in `low` (PreemptMode=REQUEUE, GraceTime=30) are preempted by one in `high` that needs the node: they
    checkpoint on SIGTERM, requeue themselves (Slurm leaves a job that ends by itself COMPLETED, not requeued), and
    resume when the node is free: one process, and torchrun with 2 ranks."""
    refs = campaign["refs"]
    for name, args in (("preempt", PREEMPT), ("preempt_ddp", PREEMPT_DDP)):
        _, out, root = campaign[name]
        assert int(finished(cluster, campaign[name])["Restarts"]) >= 1, "preempted, so requeued at least once"
        assert digest(out.read_text()) == refs.digest(*args)
        requeues = events(root, "requeue")
        assert requeues and requeues[0]["ok"] is True and {e["rank"] for e in requeues} == {0}  # rank 0 alone
        # Slurm signals every task; under torchrun a rank may first hear of it from another ("SIGTERM (seen by rank 1)")
        assert all(e["detail"].startswith("SIGTERM") for e in events(root, "notice"))
        print(f"{name}: notice->commit (s, window s):", notice_to_commit(root))


@pytest.mark.timeout(WAIT_S + 60)
@pytest.mark.parametrize("mode", list(MODES))
def test_signal_before_the_time_limit_requeues_and_resumes(
    cluster: dict[str, str], campaign: dict[str, Any], mode: str
) -> None:
    """``--time=1 --signal=USR1@30`` (to the steps; the recipe recipes/slurm/train.sbatch) and
    ``--signal=B:USR1@30`` (to the batch shell, which is srun after ``exec``): Slurm sends USR1 up to 60 s early;
    the run checkpoints, requeues and resumes, attempt after attempt, until it finishes."""
    _, out, root = campaign[mode]
    assert int(finished(cluster, campaign[mode])["Restarts"]) >= 1
    assert digest(out.read_text()) == campaign["refs"].digest(*TIMELIMIT)
    notices = events(root, "notice")
    assert notices and {e["detail"] for e in notices} == {"SIGUSR1"}
    assert all(e["ok"] for e in events(root, "requeue"))
    if mode == "step":  # the recipe: one log across attempts, each attempt announced
        assert out.read_text().count("attempt ") == int(finished(cluster, campaign[mode])["Restarts"]) + 1
    print(f"{mode}: notice->commit (s, window s):", notice_to_commit(root))


@pytest.mark.timeout(WAIT_S + 60)
def test_scancel_by_a_user_checkpoints_and_stays_cancelled(cluster: dict[str, str], campaign: dict[str, Any]) -> None:
    """``scancel JOB``: Slurm sends SIGTERM; the run checkpoints and exits, and is *not* requeued (its user
    cancelled it: the job is CANCELLED when the signal arrives). ``scancel --signal=USR1 JOB``: a checkpoint and a
    requeue, like the warning before a time limit."""
    (a, plain, root_a), (_, usr1, _) = campaign["cancel"], campaign["cancel_usr1"]
    assert wait_for(cluster, a, ("CANCELLED",))["Restarts"] == "0"
    wait_for_output(plain, "SLURM: the job is")
    (requeue,) = events(root_a, "requeue")
    assert requeue["ok"] is False and "not requeued" in requeue["why"]
    assert not (root_a / "DONE.json").exists()
    assert [e["reason"] for e in events(root_a, "save_committed")] == ["emergency"]
    assert int(finished(cluster, campaign["cancel_usr1"])["Restarts"]) >= 1
    assert digest(usr1.read_text()) == campaign["refs"].digest(*CANCEL)
