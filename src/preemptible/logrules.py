"""What lines in logs mean: the rules ``preemptible diagnose`` matches, line by line.

Each rule names a verdict, a strength (``strong`` names the cause, ``weak`` is a symptom), what the line means,
and the platform that writes it. The formats come from the providers' and tools' documentation (see
shared/reference/cloud-notices.md); the rules for preemptible's own tagged lines are generated from the event
vocabulary (`preemptible.events.LOG_VERDICTS`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preemptible.events import LOG_VERDICTS, tag


@dataclass(frozen=True)
class Rule:
    verdict: str
    strength: str
    pattern: re.Pattern[str]
    why: str
    platform: str | None = None


def _r(verdict: str, strength: str, pattern: str, why: str, platform: str | None = None, *, flags: int = re.I) -> Rule:
    return Rule(verdict, strength, re.compile(pattern, flags), why, platform)


# Formats from the providers' and tools' documentation (see shared/reference/cloud-notices.md).

RULES: tuple[Rule, ...] = (
    # preemption: the platform says so
    _r(
        "preempted",
        "strong",
        r"\*\*\* (JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO PREEMPTION",
        "SLURM cancelled the job to preempt it",
        "slurm",
    ),
    _r("preempted", "strong", r"^\s*\d+(\.\w+)?\s.*\bPREEMPTED\b", "sacct: job state PREEMPTED", "slurm", flags=0),
    _r(
        "preempted",
        "strong",
        r"terminated in response to imminent node shutdown",
        "Kubernetes graceful node shutdown (GKE Spot/preemptible node reclaimed)",
        "k8s",
    ),
    _r(
        "preempted",
        "strong",
        r"\bReason:\s*NodeShutdown\b|\"reason\":\s*\"NodeShutdown\"",
        "Kubernetes pod ended by a node shutdown",
        "k8s",
    ),
    _r(
        "preempted",
        "strong",
        r"\bPreempted by \S+ on node\b|\bPreemptionByScheduler\b|\bPreemptionByKubeScheduler\b",
        "Kubernetes scheduler preempted the pod for a higher-priority one",
        "k8s",
    ),
    _r(
        "preempted",
        "strong",
        r"spot instance interruption|\bSPOT_ITN\b|\bBidEvictedEvent\b|spot[ -]interruption notice",
        "AWS Spot interruption notice",
        "aws",
    ),
    _r(
        "preempted",
        "strong",
        r"spot/instance-action|\"action\"\s*:\s*\"(terminate|stop|hibernate)\"\s*,\s*\"time\"",
        "AWS IMDS spot instance-action document",
        "aws",
    ),
    _r(
        "preempted",
        "strong",
        r"compute\.instances\.preempted|instance was preempted|instance/preempted\W+TRUE",
        "GCP preempted the VM (Spot/preemptible)",
        "gcp",
    ),
    _r(
        "preempted",
        "strong",
        r"\"EventType\"\s*:\s*\"Preempt\"",
        "Azure Scheduled Events: Preempt (Spot eviction)",
        "azure",
    ),
    _r(
        "preempted",
        "strong",
        r"preemptible run: (aws|gcp|azure) \w+ notice",
        "preemptible run relayed a cloud's notice to the command",
        "preemptible",
    ),
    _r(
        "preempted",
        "strong",
        r"\] (aws|gcp|azure) notice \(.*\) received; stopping at step",
        "preemptible: a cloud's notice reached the run",
        "preemptible",
    ),
    _r(
        "preempted",
        "strong",
        r"\b(managed |spot )?job\b.*\bwas preempted\b|\bpreempted, recovering\b",
        "the job manager reports a preemption",
        None,
    ),
    # time limits
    _r(
        "time-limit",
        "strong",
        r"\*\*\* (JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT",
        "SLURM time limit reached",
        "slurm",
    ),
    _r("time-limit", "strong", r"^\s*\d+(\.\w+)?\s.*\bTIMEOUT\b", "sacct: job state TIMEOUT", "slurm", flags=0),
    _r(
        "time-limit",
        "strong",
        r"Job was active longer than specified deadline|\bDeadlineExceeded\b",
        "Kubernetes Job activeDeadlineSeconds reached",
        "k8s",
    ),
    _r(
        "time-limit",
        "strong",
        r"handling auto-requeue signal",
        "Lightning got SLURM's --signal (sent ahead of the time limit)",
        "slurm",
    ),
    # out of memory
    _r(
        "oom",
        "strong",
        r"Out of memory: Killed process|\boom-kill\b|Memory cgroup out of memory|\boom_reaper\b",
        "the kernel's OOM killer",
        "kernel",
    ),
    _r("oom", "strong", r"Detected \d+ oom[-_]kill event|\bOUT_OF_MEMORY\b", "SLURM: the step was OOM-killed", "slurm"),
    _r("oom", "strong", r"\bOOMKilled\b", "container OOM-killed", "k8s"),
    _r("oom", "strong", r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory", "GPU out of memory", None),
    # a collective that never completed: a rank stopped answering (hung, or gone without its peers being told)
    _r(
        "collective-timeout",
        "strong",
        r"Watchdog caught collective operation timeout|\bNCCL timeout\b|Timed out waiting \d+ ?ms for "
        r"(recv|send) operation|\bcollective operation timeout\b|\bNCCL watchdog thread terminated\b",
        "a collective timed out: a rank stopped answering (NCCL/Gloo watchdog)",
        "torchrun",
    ),
    # crashes
    _r(
        "crashed",
        "strong",
        r"\bNCCL error\b|nccl(Internal|UnhandledCuda|System|Invalid)(Error|Usage)",
        "an NCCL collective failed",
        "torchrun",
    ),
    _r(
        "crashed",
        "strong",
        r"Segmentation fault|Fatal Python error|illegal memory access|\bBus error\b|core dumped",
        "the process crashed",
        None,
    ),
    _r(
        "killed",
        "strong",
        r"DUE TO NODE FAILURE|\bNODE_FAIL\b",
        "the node failed (everything on it died at once)",
        "slurm",
    ),
    # terminations: a signal, sender unknown
    _r(
        "terminated",
        "strong",
        r"Received (15|Signals\.SIGTERM) death signal|got signal: 15\b|Signal 15 \(SIGTERM\) received",
        "torchrun received SIGTERM",
        "torchrun",
    ),
    _r(
        "terminated",
        "strong",
        r"Received (1|2|3|Signals\.SIG(HUP|INT|QUIT)) death signal|got signal: (1|2|3)\b",
        "torchrun received a terminating signal",
        "torchrun",
    ),
    _r(
        "terminated",
        "strong",
        r"\*\*\* (JOB|STEP) \S+ ON \S+ CANCELLED AT \S+( \*\*\*|$)",
        "SLURM job cancelled (scancel by a user or admin)",
        "slurm",
    ),
    _r(
        "terminated",
        "strong",
        r"\] signal notice \((SIG\w+)\) received; stopping at step",
        "preemptible: a signal reached the run",
        "preemptible",
    ),
    _r("terminated", "strong", r"Received SIG(TERM|INT|USR1|USR2): \d+", "Lightning received a signal", None),
    _r(
        "terminated",
        "strong",
        r"\bThe node was low on resource\b|\bReason:\s*Evicted\b",
        "Kubernetes evicted the pod (node pressure)",
        "k8s",
    ),
    _r(
        "terminated",
        "weak",
        r"\b\d+ Terminated\b|^Terminated$|: task \d+: Terminated",
        "the shell or srun reports the command died of SIGTERM",
        None,
    ),
    _r("terminated", "weak", r"^\s*KeyboardInterrupt\s*$", "interrupted (SIGINT / Ctrl-C)", None),
    # kills
    _r(
        "killed",
        "strong",
        r"forcefully exiting via Signals\.SIGKILL",
        "torchrun SIGKILLed workers that outlived the shutdown grace period",
        "torchrun",
    ),
    _r("killed", "weak", r"Signal 9 \(SIGKILL\) received|got signal: 9\b", "SIGKILL (cannot be caught)", "torchrun"),
    _r("killed", "weak", r"\b\d+ Killed\b|^Killed$", "the shell reports the command died of SIGKILL", None),
    # completion
    _r("completed", "weak", r"^\s*\d+(\.\w+)?\s.*\bCOMPLETED\b", "sacct: job state COMPLETED", "slurm", flags=0),
    _r("completed", "weak", r"\bReason:\s*Completed\b", "Kubernetes: container completed", "k8s"),
)


def _tagged_rules() -> tuple[Rule, ...]:
    """Rules for preemptible's own tagged log lines, generated from the event vocabulary (`events.LOG_VERDICTS`):
    they match the tag `events.tag` writes, so rewording the rest of a line cannot break them."""
    return tuple(
        _r(
            verdict,
            "strong",
            re.escape(tag(event, **{field: value})) + r"\b",
            f"preemptible's own log: {event.value} from {field} {value}",
            "preemptible",
        )
        for (event, field, value), verdict in LOG_VERDICTS.items()
    )


RULES = _tagged_rules() + RULES
