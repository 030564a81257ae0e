"""SLURM: requeue the job after a successful emergency save (opt-in).

With ``scontrol requeue $SLURM_JOB_ID`` the batch script runs again from the top, under the same job id, with
``SLURM_RESTART_COUNT`` incremented; `Run` then resumes from the checkpoint it just wrote.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping

log = logging.getLogger("preemptible")

REQUEUE_ENV = "PREEMPTIBLE_SLURM_REQUEUE"


def requeue_wanted(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(REQUEUE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def requeue(env: Mapping[str, str] | None = None, *, timeout: float = 15.0) -> bool:
    """Run ``scontrol requeue $SLURM_JOB_ID``; True on success. Never raises."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "")
    if not job:
        log.warning("requeue asked for, but SLURM_JOB_ID is not set: not in a SLURM job")
        return False
    scontrol = shutil.which("scontrol", path=env.get("PATH"))
    if scontrol is None:
        log.warning("requeue asked for, but scontrol is not on PATH; requeue job %s by hand", job)
        return False
    try:
        done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("scontrol requeue %s failed: %s", job, e)
        return False
    if done.returncode != 0:
        log.warning("scontrol requeue %s exited %d: %s", job, done.returncode, (done.stderr or done.stdout).strip())
        return False
    log.info("requeued SLURM job %s; it will resume from the checkpoint just written", job)
    return True
