"""What to change after a diagnosis, and the command that shows the change worked.

For each verdict: the concrete fix for this run (which `Run` option, which scheduler or container setting) and
the command that verifies it, most often a `preemptible drill` line that rehearses the same notice. Items tagged
with a platform ("SLURM: ...") are shown only when the evidence names that platform (or when none is named).
"""

from __future__ import annotations

from typing import Any

TAGS = {
    "slurm": "SLURM", "k8s": "Kubernetes", "aws": "AWS", "gcp": "GCP", "azure": "Azure", "docker": "Docker",
    "nextflow": "Nextflow", "dask": "Dask", "yarn": "YARN", "airflow": "Airflow", "gitlab": "GitLab CI",
    "systemd": "systemd", "github-actions": "GitHub Actions", "circleci": "CircleCI", "macos": "macOS",
    "windows": "Windows", "jupyter": "Jupyter", "pbs": "PBS", "lsf": "LSF", "sge": "SGE", "colab": "Colab",
}  # fmt: skip
RUNS_JOBS = frozenset(TAGS) | {"htcondor", "ray", "skypilot", "dstack", "prefect", "nomad", "jenkins"}
"""Platforms that run the job: where the evidence names one, items tagged for the others are left out (a desktop's
operating system and a CI service count: a run on a Mac, a Windows machine or a CI runner has no scheduler's settings
to change). (Not the launchers and libraries that run anywhere: torchrun, mpirun, Lightning.)"""
_RETRY = "errorStrategy { task.exitStatus in 137..140 ? 'retry' : 'terminate' } with maxRetries 3"
_DRILL_SOURCE = {"aws": "aws", "gcp": "gcp", "azure": "azure", "slurm": "slurm"}
_TRAIN = "python train.py"  # stands for the user's own command in the printed lines

FIX: dict[str, list[str]] = {
    "preempted": [
        "train with preemptible.Run(root, ...): the notice then only sets a flag, and the loop commits a checkpoint at "
        "the next step boundary and exits cleanly",
        "AWS: the 2-minute notice comes only from the instance metadata service: leave Run's sources to "
        "auto-detection (sources=None polls it on EC2) or name it (sources='signal,aws')",
        "GCP: the notice is a SIGTERM about 30 s before the stop: check the save fits with preemptible plan ROOT "
        "--params N --platform gcp, else bf16_moments=True or prestage_every=K",
        "Azure: the notice is a Scheduled Events 'Preempt' document (30 s): keep Run's default sources",
        "Kubernetes: terminationGracePeriodSeconds above the predicted emergency save (preemptible plan ROOT --params "
        'N --platform k8s), and the trainer must receive SIGTERM: exec form (CMD ["python", ...] or exec python ...)',
        "SLURM: #SBATCH --requeue (preemptible then requeues the job after its checkpoint; recipes/slurm/train.sbatch)",
        "Nextflow: aws.batch.maxSpotAttempts or google.batch.maxSpotAttempts (a reclaimed task is rerun), or " + _RETRY,
        "resubmit or requeue the job: Run resumes from the newest checkpoint that verifies",
    ],
    "time-limit": [
        "SLURM: sbatch --signal=USR1@120 (B:USR1@120 when a batch script wraps srun) so Run saves before the limit, "
        "and --requeue with Run(requeue=True) to continue in a new job",
        "Kubernetes: activeDeadlineSeconds ended the Job: raise it, or let Run save on the SIGTERM that follows",
        "Nextflow: time { 4.h * task.attempt } with " + _RETRY + " (140: the executor's time limit)",
        "GitLab CI: the job's timeout: keyword (or the project's CI/CD timeout), or save and stop before it",
        "GitHub Actions: timeout-minutes on the job or the step (360 minutes by default, and the most a job may run "
        "on a GitHub-hosted runner: past it, a self-hosted runner, or save before it and resume in the next job)",
        "CircleCI: no_output_timeout on the step (10 minutes by default) ended a step that printed nothing that long: "
        "most often it hung (py-spy dump --pid in the step); print progress, or raise it",
        "PBS: a longer #PBS -l walltime=HH:MM:SS; at the limit PBS sends SIGTERM, then SIGKILL after the server's "
        "kill_delay: Run saves on the SIGTERM if the save fits in it, else stop before the limit yourself",
        "LSF: a longer bsub -W, and bsub -wa USR1 -wt 5 so LSF sends SIGUSR1 5 minutes before the run limit (Run "
        "saves on SIGUSR1)",
        "SGE: a longer -l h_rt, and -l s_rt a few minutes below it: SGE sends SIGUSR1 at s_rt (Run saves on it) "
        "before h_rt's SIGKILL",
        "or stop on time yourself: Run saves on SIGTERM at the limit if the save fits in the grace period (preemptible "
        "plan ROOT --params N --window S)",
    ],
    "oom": [
        "GPU: a smaller micro-batch with more gradient accumulation, activation checkpointing, or a sharded optimizer",
        "GPU: under XLA on a TPU or a GPU: a smaller batch or sequence, rematerialisation (jax.checkpoint), or more "
        "sharding of the parameters and optimizer state over the device mesh",
        "host memory: fewer DataLoader workers or a smaller prefetch_factor; if the saves push memory over, "
        "Run(async_save=False) and no pre-staging (prestage_every=None) stage no second copy of the state",
        "SLURM: a larger --mem (sacct MaxRSS shows what the step used)",
        "Kubernetes: resources.limits.memory above the peak (kubectl top pod during a save)",
        "Nextflow: memory { 8.GB * task.attempt } with " + _RETRY + ": the task comes back with more memory",
        "Dask: a larger memory_limit per worker (dask worker --memory-limit, LocalCluster(memory_limit=...)), fewer "
        "threads per worker or smaller partitions",
        "YARN: a larger spark.executor.memoryOverhead (spark.yarn.executor.memoryOverhead before Spark 2.3) or "
        "executor memory; for the virtual-memory check, yarn.nodemanager.vmem-check-enabled=false or a higher "
        "yarn.nodemanager.vmem-pmem-ratio",
        "Docker: a larger --memory for the container (Docker Desktop's own memory setting caps every container), and "
        "--shm-size (or --ipc=host) for the DataLoader workers' shared memory",
        "GitHub Actions: a runner with more memory (a larger runs-on label), or less parallelism in the job (make -j, "
        "pytest -n, DataLoader workers)",
        "macOS: a smaller batch; PYTORCH_MPS_HIGH_WATERMARK_RATIO lets the Apple GPU use more of the unified memory "
        "(0.0 lifts the cap, and the system may then swap)",
        "Windows: a larger paging file (System > Advanced system settings > Performance > Virtual memory) for 'The "
        "paging file is too small', or a smaller batch",
        "Jupyter: a runtime with more RAM, or load less at once (a streamed dataset, mmap, a smaller model)",
        "Colab: a high-RAM runtime (Runtime > Change runtime type), or load less at once (a streamed dataset, mmap, "
        "a smaller model, low_cpu_mem_usage=True when loading a checkpoint)",
        "PBS: a larger #PBS -l mem= (or select=...:mem=) above the job's peak",
        "LSF: a larger bsub -M (and -R 'rusage[mem=...]') above the job's peak",
        "SGE: a larger -l h_vmem (per slot) above the job's peak",
    ],
    "interrupted": [
        "nothing failed: the run was stopped by hand; Run saves on SIGINT like on SIGTERM (its default signal "
        "source includes SIGINT), so the next start resumes from the step the interrupt reached",
        "to stop a run on purpose without losing the step, send SIGTERM (kill PID, scancel) or preemptible drill",
    ],
    "collective-timeout": [
        "fix the rank that stopped answering (see 'initiating'): its crash, hang or lost node is the cause; a longer "
        "timeout only waits longer",
        "with preemptible.Run a notice on one rank stops every rank at the same step, so a preempted node does not "
        "leave its peers waiting in a collective",
        "if one rank is legitimately slow (data loading, a save), raise init_process_group(timeout=...) above it",
    ],
    "crashed": [
        "fix the first traceback (later ones are its consequences), then restart: Run resumes from the newest "
        "checkpoint that verifies and falls back to the previous one if it does not",
    ],
    "terminated": [
        "a SIGTERM with no notice before it: Run saves on SIGTERM by default (the signal source), so the run loses "
        "only the current step if the signal reaches the trainer",
        'Docker: exec form (CMD ["python", ...]) so PID 1 is the trainer, and docker stop -t above the predicted save',
        "Kubernetes: exec form (the shell form's sh does not forward SIGTERM) and terminationGracePeriodSeconds above "
        "the predicted save",
        "SLURM: scancel sends SIGTERM then SIGKILL after KillWait: scancel --signal=USR1 --full first to save",
        "Airflow: the task's state was set from outside: the scheduler's log says by whom (a user's clear or mark, a "
        "zombie task whose heartbeat was missed under load: scheduler_zombie_task_threshold)",
        "systemd: TimeoutStopSec above the predicted save (systemd sends SIGTERM, then SIGKILL after it)",
        "GitHub Actions: a cancelled run (a user, or concurrency's cancel-in-progress for a newer push) gets SIGINT "
        "then SIGTERM: Run saves on them; keep the checkpoint in a cache or an artifact so the next run resumes. 'The "
        "runner has received a shutdown signal' is the machine under the job: a self-hosted runner's service "
        "restarted, a spot runner reclaimed, or a runner that ran out of memory",
    ],
    "killed": [
        "SIGKILL ends a process without a save: if it followed a SIGTERM, the grace period was shorter than the save; "
        "raise it above preemptible plan's prediction, or shrink the save (bf16_moments=True, prestage_every=K)",
        "Kubernetes: terminationGracePeriodSeconds above the predicted save",
        "Docker: docker stop -t (or stop_grace_period in Compose) above the predicted save",
        "SLURM: GraceTime (preemption) or KillWait (scancel, the time limit) above the predicted save",
        "systemd: TimeoutStopSec above the predicted save (systemd sends SIGTERM, then SIGKILL after it)",
        "Nextflow: a task's 137 is most often its executor's memory limit: nextflow log shows its peak_rss against "
        "memory; " + _RETRY,
        "if nothing sent SIGTERM first, look for the OOM killer (dmesg) before anything else",
        "macOS: a program killed at launch (Killed: 9) whose code signature is invalid: codesign --force --sign - on "
        "the binary (tools that rewrite a binary, install_name_tool, invalidate its signature)",
    ],
    "completed": ["nothing to fix: the run finished"],
    "unknown": ["give diagnose more to read: the scheduler's log, --exit-code, and the run's checkpoint --root"],
}


def verify(verdict: str, platforms: set[str], root: str | None) -> list[str]:
    """The commands that show the fix worked."""
    where = root or "ROOT"
    source = next((_DRILL_SOURCE[p] for p in sorted(platforms) if p in _DRILL_SOURCE), "signal")
    drill = f"preemptible drill --source {source} --reference -- {_TRAIN}"
    plan = f"preemptible plan {where} --params N" + (f" --platform {source}" if source != "signal" else " --window S")
    return {
        "preempted": [drill, plan],
        "time-limit": [
            f"preemptible drill --source {'slurm' if 'slurm' in platforms else source} --reference -- {_TRAIN}",
            plan,
        ],
        "oom": [
            f"{_TRAIN} for a few steps, watching torch.cuda.max_memory_allocated() (GPU) or sacct -o MaxRSS (host)"
        ],
        "collective-timeout": [
            "preemptible drill --source signal -- torchrun --nproc-per-node 2 train.py",
            "TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 torchrun ... (the flight recorder names "
            "the stuck collective and rank)",
        ],
        "interrupted": [f"preemptible verify {where}", f"{_TRAIN} (it resumes; the journal records the restore)"],
        "crashed": [f"preemptible verify {where}", f"{_TRAIN} (it resumes; the journal records the restore)"],
        "terminated": [f"preemptible drill --source signal --reference -- {_TRAIN}", plan],
        "killed": [plan, f"preemptible drill --source signal --window S --reference -- {_TRAIN}"],
        "completed": [f"preemptible verify {where}"],
        "unknown": [],
    }[verdict]


MEMORY_EVICTION = [
    "Kubernetes: the kubelet evicted the pod because the node ran low on memory, and it evicts first the pods furthest "
    "above their memory requests: set resources.requests.memory to the pod's peak (requests equal to limits makes it "
    "Guaranteed, evicted last), or give it a node with more memory",
    FIX["oom"][1],
]
"""The fix for a memory-pressure eviction (`_rules.MEMORY_PRESSURE`): the pod's memory, before the signal's."""
STORAGE_EVICTION = (
    "Kubernetes: the pod was evicted for its disk (ephemeral-storage: its writable layer, logs and emptyDir over its "
    "request or limit, or the node's disk full): set resources.requests and limits.ephemeral-storage to what it "
    "writes, or write scratch files, logs and checkpoints to a volume (a PVC, an emptyDir with a sizeLimit)"
)
"""The fix for an eviction for ephemeral storage, before the signal's."""


HANGUP = [
    "a hangup (SIGHUP): the terminal or SSH session that started the run closed; start it detached from the session "
    "(setsid python train.py > train.log 2>&1 < /dev/null &, tmux or screen, or nohup ... & followed by disown) or "
    "under a scheduler",
    "Run does not save on SIGHUP by default (its signals are SIGTERM, SIGINT and SIGUSR1): add it with "
    "sources=[preemptible.sources.SignalSource(['SIGTERM', 'SIGINT', 'SIGUSR1', 'SIGHUP'])] to save on a hangup too",
]
"""The fix for a hangup (a closed terminal or session), not a SIGTERM's."""


def remedy(
    verdict: str,
    platforms: set[str],
    root: str | None = None,
    *,
    saved_at: int | None = None,
    memory: bool = False,
    hangup: bool = False,
    memory_kind: str | None = None,
    storage: bool = False,
) -> dict[str, Any]:
    """``{"fix": [...], "verify": [...]}`` for ``verdict``, the platform-tagged items only for ``platforms``.
    ``saved_at``: the step the journal shows committed after the notice (the save path needs no fix then).
    ``memory``: a ``terminated`` that was a memory-pressure eviction (its memory fix comes first). ``hangup``: a
    ``terminated`` by SIGHUP (a closed session: its own fix). ``memory_kind``: "gpu" or "host" when the evidence
    says which memory ran out (the other's items are left out). ``storage``: a ``terminated`` that was an eviction
    for ephemeral storage (its disk fix comes first)."""
    fix = for_platforms(FIX[verdict], platforms)
    fix = for_memory(fix, memory_kind)
    if memory:
        fix = [*MEMORY_EVICTION, *fix]
    if storage:
        fix = [STORAGE_EVICTION, *fix]
    if hangup:
        fix = [*HANGUP, *fix[1:]]
    if saved_at is not None and verdict in ("preempted", "time-limit", "terminated"):
        saved = (
            f"nothing to fix in the save: the run committed step {saved_at} after the notice; make sure the job "
            "comes back (requeue or resubmit) and it resumes there"
        )
        fix = [saved, *fix[1:]]
    return {"fix": fix, "verify": verify(verdict, platforms, root)}


def for_memory(items: list[str], kind: str | None) -> list[str]:
    """Without the items for the memory that did not run out ("GPU: ..." for host memory; for a GPU's or a TPU's,
    "host memory: ..." and the platforms' items, which are about the host's: a scheduler's or a container's memory
    limit, a paging file; a Mac's unified memory is both)."""
    other = {"host": "GPU:", "gpu": "host memory:"}.get(kind or "")
    kept = items if other is None else [i for i in items if not i.startswith(other)]
    if kind == "gpu":
        kept = [i for i in kept if i.split(":", 1)[0] not in _HOST_MEMORY_TAGS]
    return kept


_HOST_MEMORY_TAGS = frozenset(TAGS.values()) - {TAGS["macos"]}
"""The platforms whose memory items are about the host's memory (all but a Mac's, whose memory the GPU shares)."""


def for_platforms(items: list[str], platforms: set[str]) -> list[str]:
    """Items tagged "SLURM: ..." etc. only for the named platforms (when the evidence names no platform that runs
    jobs, `RUNS_JOBS`, those of the platforms most jobs run on, `UNNAMED`)."""
    named: frozenset[str] = frozenset(TAGS[p] for p in platforms if p in TAGS)
    if not named and not platforms & RUNS_JOBS:
        named = UNNAMED
    return [i for i in items if i.split(":", 1)[0] not in TAGS.values() or i.split(":", 1)[0] in named]


UNNAMED = frozenset({TAGS["slurm"], TAGS["k8s"], TAGS["docker"]})
"""The platforms whose items a log that names none gets: those most of the corpus's jobs ran on (a line only another
platform writes names it, and brings its own items; a long list of every platform's buries the few that fit)."""
