"""The recipes in recipes/: the Kubernetes and SkyPilot files are parsed and checked for the fields and exit codes
preemptible relies on (not applied: no cluster or cloud runs here); the bare-VM loop is run. The Slurm batch script
runs on a real cluster in tests/e2e/test_slurm.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO, clean_env
from preemptible.sources.detect import WINDOWS

RECIPES = REPO / "recipes"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("name", ["job.yaml", "gke-spot-job.yaml"])
def test_kubernetes_jobs_retry_a_preemption_but_not_a_finished_run(name: str) -> None:
    job = load(RECIPES / "kubernetes" / name)
    assert job["kind"] == "Job" and job["apiVersion"] == "batch/v1"
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
    (container,) = pod["containers"]
    assert container["command"] == ["preemptible", "run", "--"]  # exec form: PID 1 that passes SIGTERM on
    env = {e["name"]: e["value"] for e in container["env"]}
    code = int(env["PREEMPTIBLE_EXIT_CODE"])
    rules = job["spec"]["podFailurePolicy"]["rules"]
    ignored = {v for r in rules if r["action"] == "Ignore" and "onExitCodes" in r for v in r["onExitCodes"]["values"]}
    assert code in ignored and 0 not in ignored and 75 not in ignored  # preempted: retried; finished or failed: not
    assert any(c["type"] == "DisruptionTarget" for r in rules for c in r.get("onPodConditions", []))
    assert all(r["onExitCodes"]["containerName"] == container["name"] for r in rules if "onExitCodes" in r)
    grace = pod["terminationGracePeriodSeconds"]
    assert int(env["PREEMPTIBLE_GRACE"]) == grace
    if "spot" in name:  # graceful node shutdown gives a GKE Spot pod 15 s, whatever the pod asks for
        assert grace == WINDOWS["gke"] == 15
        assert pod["nodeSelector"] == {"cloud.google.com/gke-spot": "true"}
    assert job["spec"]["backoffLimit"] >= 1


def test_skypilot_managed_job_restarts_after_a_notice() -> None:
    task = load(RECIPES / "skypilot" / "train.yaml")
    resources = task["resources"]
    assert resources["use_spot"] is True
    assert resources["job_recovery"]["max_restarts_on_errors"] >= 1  # the exit after a notice is an error to restart
    assert int(task["envs"]["PREEMPTIBLE_EXIT_CODE"]) != 0
    assert task["run"].strip().startswith("preemptible run -- ")


def test_slurm_recipe_asks_for_what_the_library_relies_on() -> None:
    text = (RECIPES / "slurm" / "train.sbatch").read_text()
    for line in ("#SBATCH --requeue", "#SBATCH --signal=USR1@", "#SBATCH --open-mode=append", 'exec srun "$@"'):
        assert line in text
    assert "DONE.json" in text


def trainer_pid(root: Path) -> int:
    """The process running examples/train.py for ``root`` itself (its argv starts with the interpreter)."""
    want = [sys.executable, str(REPO / "examples" / "train.py"), "--root", str(root)]
    for p in Path("/proc").iterdir():
        try:
            argv = (p / "cmdline").read_bytes().decode().split("\0")
        except (OSError, ValueError):
            continue
        if p.name.isdigit() and argv[: len(want)] == want:
            return int(p.name)
    raise AssertionError(f"no trainer process for {root}")


def test_the_vm_loop_restarts_after_a_notice_until_done(tmp_path: Path) -> None:
    """The until loop, run: the trainer gets SIGTERM once, checkpoints, exits; the loop starts it again; it resumes
    and finishes; the loop stops at DONE.json. The result is the uninterrupted run's."""
    root = tmp_path / "ckpt"
    train = [sys.executable, str(REPO / "examples" / "train.py"), "--root", str(root), "--steps", "200"]
    env = clean_env(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    loop = subprocess.Popen(
        [str(RECIPES / "vm" / "run-until-done.sh"), str(root), *train, "--step-time", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert loop.stdout is not None
    lines = []
    for line in loop.stdout:
        lines.append(line)
        if line.startswith("step 50 "):
            os.kill(trainer_pid(root), signal.SIGTERM)  # the trainer alone, not the loop or its wrapper
            break
    out = "".join(lines) + loop.communicate(timeout=120)[0]
    assert loop.returncode == 0, out
    assert "run-until-done: attempt 2" in out and "run-until-done: attempt 3" not in out
    assert "emergency checkpoint of step" in out and "finished" in out
    reference = subprocess.run(
        [*train[:3], str(tmp_path / "ref"), *train[4:]], capture_output=True, text=True, env=env, check=True
    )
    final = [x for x in out.splitlines() if x.startswith("final step=200 ")]
    assert len(final) == 1 and final[0].rsplit("digest=", 1)[1] == reference.stdout.rsplit("digest=", 1)[1].strip()
