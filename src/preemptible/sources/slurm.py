"""SLURM: requeue the job after a successful emergency save.

With ``scontrol requeue $SLURM_JOB_ID`` the batch script runs again from the top, under the same job id, with
``SLURM_RESTART_COUNT`` incremented; `Run` then resumes from the checkpoint it just wrote.

Why not leave it to Slurm: a job that stops by itself after a notice (its checkpoint committed, exit 0) is
COMPLETED, also when partition preemption (``PreemptMode=REQUEUE``) or a ``--signal`` before the time limit sent
the notice: Slurm requeues only a job it has to kill. So by default (`decide`), after an emergency save the job
requeues itself when Slurm says it is requeueable (``Requeue=1``: ``--requeue``, or ``JobRequeue=1`` in slurm.conf)
and still RUNNING (a job cancelled by its user with ``scancel`` is CANCELLED/COMPLETING by the time its SIGTERM
arrives: it is not brought back). ``PREEMPTIBLE_SLURM_REQUEUE=1`` (or ``Run(requeue=True)``) requeues whatever
the state; ``=0`` (``requeue=False``) never.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping

log = logging.getLogger("preemptible")

REQUEUE_ENV = "PREEMPTIBLE_SLURM_REQUEUE"


def requeue_wanted(env: Mapping[str, str] | None = None) -> bool | None:
    """``$PREEMPTIBLE_SLURM_REQUEUE``: True (1/true/yes/on), False (0/false/no/off), or None (unset: decide)."""
    env = os.environ if env is None else env
    value = env.get(REQUEUE_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    if value:
        log.warning("ignoring %s=%r: expected 1 or 0", REQUEUE_ENV, value)
    return None


def job_info(env: Mapping[str, str] | None = None, *, timeout: float = 10.0) -> dict[str, str] | None:
    """``scontrol show job -o $SLURM_JOB_ID`` as a dict (``JobState``, ``Requeue``, ``Restarts``, ...), or None."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "")
    scontrol = shutil.which("scontrol", path=env.get("PATH"))
    if not job or scontrol is None:
        return None
    try:
        argv = [scontrol, "show", "job", "-o", job]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("scontrol show job %s failed: %s", job, e)
        return None
    if done.returncode != 0:
        return None
    return parse_job(done.stdout)


def parse_job(text: str) -> dict[str, str]:
    """``Key=Value`` fields of one line of ``scontrol show job -o`` (values without spaces; the rest is skipped)."""
    out = {}
    for token in text.split():
        key, eq, value = token.partition("=")
        if eq and key and key not in out:
            out[key] = value
    return out


def decide(wanted: bool | None, info: Mapping[str, str] | None) -> tuple[bool, str]:
    """Whether to requeue after an emergency save, and why (see the module docs)."""
    if wanted is False:
        return False, f"requeue is off ({REQUEUE_ENV}=0 or Run(requeue=False))"
    if wanted:
        return True, f"requeue asked for ({REQUEUE_ENV}=1 or Run(requeue=True))"
    if info is None:
        return (
            False,
            f"scontrol could not say whether the job is requeueable; not requeued (set {REQUEUE_ENV}=1 to force)",
        )
    if info.get("Requeue") != "1":
        return False, "the job is not requeueable (Requeue=0): submit it with --requeue to have it come back"
    state = info.get("JobState", "?")
    if state not in ("RUNNING", "SUSPENDED"):
        return False, f"the job is {state} (cancelled, or ending): not requeued"
    return True, "the job is requeueable and still running"


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
    argv = [scontrol, "requeue", job]
    sh = shutil.which("sh")
    if sh is not None:
        # The requeue ends the job step scontrol runs in, and slurmstepd's SIGTERM to the step's processes can reach
        # scontrol before it has read the controller's reply (seen: "exited -15" for a requeue that happened). An
        # ignored signal stays ignored across exec: scontrol finishes; SIGKILL after KillWait still applies.
        argv = [sh, "-c", 'trap "" TERM INT HUP; exec "$0" "$@"', *argv]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("scontrol requeue %s failed: %s", job, e)
        return False
    if done.returncode != 0:
        log.warning("scontrol requeue %s exited %d: %s", job, done.returncode, (done.stderr or done.stdout).strip())
        return False
    log.info("requeued SLURM job %s; it will resume from the checkpoint just written", job)
    return True
