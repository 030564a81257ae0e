#!/usr/bin/env python3
"""A one-node Slurm cluster on loopback, for the tests and for trying the Slurm recipes by hand.

    python3 scripts/slurm_cluster.py start DIR     # writes DIR/slurm.conf, starts munged, slurmctld, slurmd
    export SLURM_CONF=DIR/slurm.conf               # then sbatch, srun, squeue, scontrol, sacct work
    python3 scripts/slurm_cluster.py stop DIR      # stops them by the pids in DIR

Needs root (slurmd launches jobs as their user) and Debian's ``slurm-wlm`` and ``munge`` packages
(``scripts/install-system`` installs them). Everything it writes is under DIR: the configuration, a munge socket, the
daemons' state, spool, logs and pid files. Nothing under /etc changes.

The node declares 8 CPUs whatever the machine has (jobs are CPU-light training steps; several run side by side).
Two partitions: ``low`` (the default, ``PriorityTier=1``, ``PreemptMode=REQUEUE``, ``GraceTime=30``) and ``high``
(``PriorityTier=10``): a job in ``high`` that needs the node preempts the jobs in ``low``
(``PreemptType=preempt/partition_prio``). A requeued job may start again after the credential lifetime, lowered
from 120 s to 10 s (``AuthInfo=cred_expire=10``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

CPUS = 8
GRACE_S = 30
DAEMONS = ("slurmd", "slurmctld", "munged")  # stopped in this order


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing() -> str | None:
    """Why a cluster cannot start here, or None."""
    if os.geteuid() != 0:
        return "not root (slurmd must run as root to launch jobs)"
    tools = [t for t in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol") if shutil.which(t) is None]
    if tools:
        return (
            f"{', '.join(tools)} not installed (apt-get install slurm-wlm munge; scripts/install-system does it as root)"
        )
    if not Path("/etc/munge/munge.key").exists():
        return "/etc/munge/munge.key is missing (the munge package creates it; or run mungekey)"
    return None


def conf_text(d: Path, munge: Path) -> str:
    host = socket.gethostname()
    return f"""# written by scripts/slurm_cluster.py: a one-node test cluster on loopback
ClusterName=preemptible
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge}/munge.socket,cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SlurmdParameters=config_overrides
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
MessageTimeout=10
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.log
NodeName={host} NodeAddr=127.0.0.1 CPUs={CPUS} State=UNKNOWN
PartitionName=low Nodes={host} Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime={GRACE_S} MaxTime=INFINITE State=UP
PartitionName=high Nodes={host} PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
"""


def start(d: Path, *, timeout: float = 60.0) -> Path:
    """Write the configuration under ``d`` and start the daemons; returns the path of slurm.conf."""
    why = missing()
    if why is not None:
        raise RuntimeError(f"cannot start a Slurm cluster: {why}")
    d = d.resolve()
    for sub in ("state", "spool"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    # munged runs as the munge user, which must reach its directory: one of its own under /tmp (d's parents may
    # be private to root, as pytest's are), named in d/munge.dir
    munge = Path(tempfile.mkdtemp(prefix="preemptible-munge-"))
    (d / "munge.dir").write_text(str(munge))
    user = pwd.getpwnam("munge")
    os.chown(munge, user.pw_uid, user.pw_gid)
    munge.chmod(0o755)
    conf = d / "slurm.conf"
    conf.write_text(conf_text(d, munge))
    _run(
        [
            "runuser", "-u", "munge", "--", "munged",
            f"--socket={munge}/munge.socket", f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
            f"--seed-file={munge}/munged.seed", "--force",
        ],
        d,
    )  # fmt: skip
    _wait(lambda: (munge / "munge.socket").exists(), timeout, "munged to create its socket", d)
    (d / "munged.pid").write_text((munge / "munged.pid").read_text())
    env = dict(os.environ, SLURM_CONF=str(conf))
    _run(["slurmctld", "-f", str(conf), "-c", "-i"], d, env)
    _run(["slurmd", "-f", str(conf), "-c"], d, env)

    def idle() -> bool:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env, check=False)
        return out.returncode == 0 and out.stdout.strip().split("\n")[0] in ("idle", "mix", "alloc")

    _wait(idle, timeout, "the node to come up idle (sinfo)", d)
    return conf


def _run(argv: list[str], d: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        stop(d)
        raise RuntimeError(
            f"{argv[0]} {argv[-1]!r}... exited {done.returncode}: {(done.stderr or done.stdout).strip()}"
        )


def _wait(ok: Callable[[], bool], timeout: float, what: str, d: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            logs = "".join(
                f"\n--- {p.name} ---\n{p.read_text(errors='replace')[-1500:]}"
                for p in (d / "slurmctld.log", d / "slurmd.log", _munge_dir(d) / "munged.log")
                if p.exists()
            )
            stop(d)
            raise RuntimeError(f"expected {what} within {timeout:.0f} s; it did not. Logs:{logs}")
        time.sleep(0.2)


def _munge_dir(d: Path) -> Path:
    try:
        return Path((d / "munge.dir").read_text().strip())
    except OSError:
        return d / "munge"


def stop(d: Path) -> None:
    """Stop the daemons started in ``d`` by their pid files (a daemon already gone is fine)."""
    for name in DAEMONS:
        pidfile = d / f"{name}.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
    munge = _munge_dir(d)
    if munge.name.startswith("preemptible-munge-"):
        shutil.rmtree(munge, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(__doc__, file=sys.stderr)
        return 2
    d = Path(argv[1])
    if argv[0] == "stop":
        stop(d)
        return 0
    try:
        conf = start(d)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"export SLURM_CONF={conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
