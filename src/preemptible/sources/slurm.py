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
import re
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


_STATE = re.compile(r"[A-Z][A-Z_]{1,31}", re.ASCII)
_FLAG = {"1": "1", "yes": "1", "true": "1", "0": "0", "no": "0", "false": "0"}


def job_info(env: Mapping[str, str] | None = None, *, timeout: float = 10.0) -> dict[str, str] | None:
    """The job's ``JobState`` and ``Requeue`` flag, or None when they cannot be had.

    Asked of ``squeue`` with a format string that names those two fields alone (``--Format=State,Requeue``), so that
    nothing the job's owner chose (its name, comment, working directory) is in the output: a job name holding
    ``JobState=RUNNING Requeue=1`` cannot be read as those fields. The output is decoded with errors replaced (a
    non-UTF-8 byte never raises), and anything but exactly one line of two known tokens is None ("cannot say")."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "")
    squeue = shutil.which("squeue", path=env.get("PATH"))
    if not job or squeue is None:
        return None
    argv = [squeue, "--noheader", "--states=all", "--jobs", job, "--Format=State:40,Requeue:12"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("squeue for job %s failed: %s", job, e)
        return None
    if done.returncode != 0:
        log.warning("squeue for job %s exited %d", job, done.returncode)
        return None
    return parse_job(done.stdout.decode("utf-8", errors="replace"))


def parse_job(text: str) -> dict[str, str] | None:
    """``squeue --noheader --Format=State,Requeue`` output as ``{"JobState": ..., "Requeue": "1" | "0"}``, or None
    when it is not exactly one line of a state and a flag."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        return None
    tokens = lines[0].split()
    if len(tokens) != 2 or not _STATE.fullmatch(tokens[0]) or tokens[1].lower() not in _FLAG:
        return None
    return {"JobState": tokens[0], "Requeue": _FLAG[tokens[1].lower()]}


def decide(wanted: bool | None, info: Mapping[str, str] | None) -> tuple[bool, str]:
    """Whether to requeue after an emergency save, and why (see the module docs)."""
    if wanted is False:
        return False, f"requeue is off ({REQUEUE_ENV}=0 or Run(requeue=False))"
    if wanted:
        return True, f"requeue asked for ({REQUEUE_ENV}=1 or Run(requeue=True))"
    if info is None:
        return (
            False,
            f"squeue could not say whether the job is requeueable (not on PATH, failed, or an answer that is not one "
            f"state and one flag); not requeued (set {REQUEUE_ENV}=1 to force)",
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
