"""What lines in logs mean: the rules ``preemptible diagnose`` matches, line by line.

Each rule names a verdict, a strength (``strong`` names the cause, ``weak`` is a symptom), what the line means,
and the platform that writes it. The formats come from the providers' and tools' documentation (see
shared/reference/cloud-notices.md); the rules for preemptible's own tagged lines are generated from the event
vocabulary (`preemptible.events.LOG_VERDICTS`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from preemptible.events import LOG_VERDICTS, Event, tag


@dataclass(frozen=True)
class Rule:
    verdict: str
    strength: str
    pattern: re.Pattern[str]
    why: str
    platform: str | None = None

    @property
    def needles(self) -> tuple[str, ...] | None:
        return needles(self.pattern)


def _r(verdict: str, strength: str, pattern: str, why: str, platform: str | None = None, *, flags: int = re.I) -> Rule:
    return Rule(verdict, strength, re.compile(pattern, flags), why, platform)


_NEEDLES: dict[re.Pattern[str], tuple[str, ...] | None] = {}
_MIN_NEEDLE = 3


def needles(pattern: re.Pattern[str]) -> tuple[str, ...] | None:
    """Lowercase strings one of which every line ``pattern`` matches contains (lowercased), or None when the
    pattern has no such literal. A cheap test that skips a rule on most lines: `str.__contains__` on a few needles
    instead of a regex search. Read from the pattern's parse tree: the longest literal run of a sequence, else the
    needles of a group or alternation the sequence cannot skip."""
    if pattern not in _NEEDLES:
        try:
            from re import _parser  # type: ignore[attr-defined]

            _NEEDLES[pattern] = _seq_needles(_parser.parse(pattern.pattern, pattern.flags))
        except Exception:  # another Python's parser: no prefilter, the rule is tried on every line
            _NEEDLES[pattern] = None
    return _NEEDLES[pattern]


def _seq_needles(seq: Any) -> tuple[str, ...] | None:
    from re import _constants as c  # type: ignore[attr-defined]

    choices: list[tuple[str, ...]] = []  # each a necessary condition; the most selective is kept
    run = ""
    for op, arg in [*seq, (None, None)]:
        if op is c.LITERAL:
            run += chr(arg)
            continue
        if len(run) >= _MIN_NEEDLE:
            choices.append((run.lower(),))
        run = ""
        found: tuple[str, ...] | None = None
        if op is c.SUBPATTERN:
            found = _seq_needles(arg[-1])
        elif op is c.BRANCH:
            parts = [_seq_needles(b) for b in arg[1]]
            found = None if any(p is None for p in parts) else tuple(n for p in parts if p for n in p)
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT) and arg[0] >= 1:
            found = _seq_needles(arg[2])
        if found:
            choices.append(found)
    return max(choices, key=_selective) if choices else None


_COMMON = frozenset({"train", "training", "nccl", "error", "system", "invalid", "internal", "failed", "step", "epoch"})
"""Words on most lines of a training log: a needle set holding one is kept only when there is no other."""


def _selective(found_in: tuple[str, ...]) -> int:
    return 0 if any(n.strip() in _COMMON for n in found_in) else min(map(len, found_in))


# Formats from the providers' and tools' documentation (see shared/reference/cloud-notices.md).

PEER_LOST = "a peer stopped answering (a connection reset, refused or closed; an aborted communicator)"
PEER_NODE = (
    "preemptible's EXIT_PEER_NODE: another node of the job went away (a notice there, or a node lost without one) "
    "and this one restarts with the nodes that remain"
)
"""What exit code 76 says: a consequence of another node's end, never its cause."""
MACHINE_GONE = (
    "the machine stopped answering without notice: most often reclaimed without one (a spot or preemptible machine); "
    "else a crash of the machine or a network partition"
)
BKILL = (
    "LSF: a user or an admin killed the job (bkill sends SIGINT, then SIGTERM, then SIGKILL: a KeyboardInterrupt "
    "before this record is the kill's, not a user's Ctrl-C)"
)
"""Why LSF's record of a bkill is evidence: it explains the interrupt the kill delivered first."""
MEMORY_PRESSURE = (
    "Kubernetes evicted the pod because its node ran low on memory (the kubelet's node-pressure eviction, not the "
    "kernel's OOM killer: it picks the pods furthest above their memory requests)"
)
"""The ``why`` of a memory-pressure eviction: ``terminated`` (the kubelet ended the pod), its competing verdict ``oom``
and its fix the pod's memory requests (`_verdict`, `_remedy`)."""
_KILLED_WORDS = (
    r"已杀死|[\u0423\u0443\u0412]\u0431\u0438\u0442\u043e|Getötet|強制終了|죽었음|Processus arrêté|"
    r"Terminado \(killed\)|Morto|Ucciso|Unicestwiony|Zabit|Dödad|Öldürüldü"
)
"""The shell's "Killed" (glibc's strsignal for SIGKILL) in other languages: zh_CN, ru, uk, de, ja, ko, fr, es, pt_BR,
it, pl, cs, sv, tr."""
SIGKILL_ANY_SENDER = "SIGKILL (an OOM kill, a grace period that ran out, or kill -9)"
"""What a SIGKILL reported without its sender says (a launcher's, a tool's, an exit code's): the verdict read from it
alone is the OOM killer's, with ``killed`` competing, and no surer than the shell's ``Killed``."""
SHELL_KILLED = (
    "the shell reports the command died of SIGKILL, naming no sender: most often the kernel's OOM killer (check the "
    "kernel log); else a kill -9 or a supervisor's"
)
"""The ``why`` of a shell's bare ``Killed``: weak ``oom`` evidence whose competing verdict is ``killed``. Where the
threads of the real corpus found the cause, the OOM killer sent it about 5 times in 8."""
REQUEUED = (
    "SLURM requeued the job (a preemption in requeue mode, or a requeue its own signal handler asked for before the "
    "time limit)"
)
"""The ``why`` of Slurm's requeue: weak ``preempted`` evidence, unless the job itself got its time-limit warning first
(`_verdict._decide`: then its own handler asked for the requeue)."""
CANCELLED = "its task was cancelled from outside it (what cancelled it decides: a stop, a timeout, a failure elsewhere)"
"""The ``why`` ending of an unhandled ``CancelledError`` (asyncio's, concurrent.futures'): a consequence."""
PARENT_GONE = (
    "a spawned child could not read what its parent sends it at start (the parent had died or failed: its end decides)"
)
"""The ``why`` ending of an exception a ``multiprocessing`` child raised while unpickling its start from its parent
(``EOFError: Ran out of input``, ``pickle data was truncated``): a consequence."""
CONSEQUENCES = (PEER_LOST, PEER_NODE, CANCELLED, PARENT_GONE)
"""The endings of the ``why`` of evidence that says only that another rank or node went away, or that a task was
cancelled: never the cause while something else explains it (`_verdict._decide`, `_incident.initiating`)."""
LOST_PEER = (
    "stopped answering its peers: its node was lost without notice, cut off from the network, or hung "
    "(preemptible's peer watch)"
)
"""The ending of the ``why`` of evidence that names a rank another rank's peer watch found gone (``event=peer_lost``,
``ranks [1] did not answer``): that rank is the initiating one."""
STORE_LOST = (
    "could not reach the job's store: the store's node was lost without notice, or this node was cut off "
    "(preemptible's peer watch)"
)
RELAYED = re.compile(r"\(seen by rank (\d+)\)")
"""A notice one rank got and the others learned through the job's store (`dist`): the rank that got it."""
PEER_LOST_TAG = tag(Event.PEER_LOST)
END_HOOK = re.compile(
    r'^\s*(File "[^"]*", line \d+, in |\S*\.py\S* in )(on_train_end|on_fit_end|on_training_end|on_train_finish|'
    r"on_run_end|on_experiment_end|_exit_function)\b"
)
"""A traceback's frame in an end-of-training hook (Keras, Hugging Face, Lightning, Ultralytics callbacks; Python's
exit handlers), as Python or IPython prints it: the loop had ended before what fails there."""
END_HOOK_WORDS = ("_end", "_finish", "_exit_function")
"""Needles of `END_HOOK`: the streamed reader (`_input.scan_keywords`) must not skip such a frame."""
COLLECTIVE_FRAME = re.compile(
    r'^\s*File "[^"]*distributed[^"]*", line \d+, in (barrier|monitored_barrier|_store_based_barrier|all_reduce\w*|'
    r"all_gather\w*|all_to_all\w*|broadcast\w*|reduce_scatter\w*|reduce|gather|scatter|send|recv|wait)\s*$"
)
"""A traceback's frame inside a torch.distributed collective or point-to-point operation: a timeout raised there is
the collective's, in whatever words."""
COLLECTIVE_FRAME_WORDS = ("distributed",)
SPAWN_CHILD_FRAME = re.compile(r'^\s*File "[^"]*multiprocessing[/\\]spawn\.py", line \d+, in (spawn_main|_main)\s*$')
"""A traceback's frame in a ``multiprocessing`` child's start (`PARENT_GONE`)."""
SPAWN_CHILD_WORDS = ("spawn.py",)
"""Needles of `COLLECTIVE_FRAME`, for the streamed reader as `END_HOOK_WORDS`."""
_MISSING = re.compile(r"\branks? \[([\d, ]+)\] did not answer\b")
_STORE = re.compile(r"\bthe job's store at (\S+?):\d+ is unreachable\b")


def peer_lost(line: str) -> tuple[list[int], str | None] | None:
    """What a line of preemptible's peer watch (``event=peer_lost``) says: the ranks that did not answer, and the
    store's host when the store itself did not answer; None for any other line."""
    if PEER_LOST_TAG not in line:
        return None
    missing = _MISSING.search(line)
    ranks = [int(r) for r in missing.group(1).replace(" ", "").split(",") if r] if missing else []
    store = _STORE.search(line)
    return ranks, store.group(1) if store else None


_JOB = r"(^|: |^\[\d+\][+-]? +|\bline \d+: +\d+ +)"
"""Where a shell's report of how a job ended starts: the line, bash's job status (``[1]+  ...``), a script's
``line 12: 208585 ...``, or after a program's name (``zsh: ...``)."""
_ZSH_JOB = r"^\[\d+\] *[+-]? +\d+ +"
"""zsh's job line, before how the job ended and its command: ``[1]  + 22082 killed     python train.py``."""
_SACCT_ROW = r"^\s*\d+(_\d+|_\[[\d,-]+\])?(\.\w+|\+)?[\s|].*"  # an sacct row: job id (array, step), then its fields
RULES: tuple[Rule, ...] = (
    # an OOM the program caught and went on from (fairseq skips the batch): not how the run ended
    _r(
        "oom",
        "hint",
        r"^\W*WARNING\W+(ran|running) out of memory\b|\bout of memory\b.*\bskipping (this |the )?batch\b|"
        r"\battempting to recover from OOM\b",
        "an out-of-memory error the program caught and went on from (it skipped the batch)",
        None,
    ),
    _r(
        "oom",
        "hint",
        r"\bkernel (for \S+ )?appears to have died\b|\bKernelRestarter: restarting kernel\b|"
        r"\btcmalloc: large alloc \d+ bytes\b",
        "Jupyter's kernel died without a word (most often it ran out of memory; else a native crash), or the process "
        "asked for a very large allocation (tcmalloc's warning, often just before a Colab runtime runs out of RAM)",
        "jupyter",
    ),
    # a scheduler's "preempted" that is really a node failure (PBS/Moab)
    _r(
        "killed",
        "strong",
        r"\bpreempted \(node failure\)",
        "the node failed (the scheduler calls it preempted): everything on it died at once",
        None,
    ),
    # preemption: the platform says so
    _r("preempted", "strong", r"\bJobState=PREEMPTED\b", "scontrol: job state PREEMPTED", "slurm"),
    _r(
        "preempted",
        "strong",
        r"\b(job |task |run )?([Ss]tate|[Ss]tatus)( is)?\W{1,3}PREEMPTED\b|\bJob has not timed out\b|"
        r"\bSimulation: preempting job\b",
        "the scheduler or platform reports the job's state PREEMPTED (submitit: stopped before its time limit)",
        None,
        flags=0,
    ),
    _r(
        "preempted",
        "strong",
        r"\*\*\* (JOB|STEP) \S+ (ON \S+ )?CANCELLED AT \S+ DUE TO PREEMPTION",
        "SLURM cancelled the job to preempt it",
        "slurm",
    ),
    _r(
        "preempted",
        "strong",
        _SACCT_ROW + r"\bPREEMPTED\b",
        "sacct: job state PREEMPTED",
        "slurm",
        flags=0,
    ),
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
        r"\bPreempted\s+(pod/\S+\s+)?by \S+ on node\b|\bPreemptionByScheduler\b|\bPreemptionByKubeScheduler\b|"
        r"\bevicted,? because of preempt",
        "Kubernetes scheduler preempted the pod for a higher-priority one",
        "k8s",
    ),
    _r(
        "preempted",
        "strong",
        r"spot instance interruption|\bSPOT_ITN\b|\bBidEvictedEvent\b|spot[ -]interruption notice|"
        r"\bSpot ?Instance ?Termination\b",
        "AWS Spot interruption notice",
        "aws",
    ),
    _r(
        "preempted",
        "strong",
        r"\bspot (instance|vm|node)s?\b( \S+){0,2} (was |were |has been |got )?"
        r"(terminated|stopped|interrupted|evicted)\b|"
        r"\bspot (vm )?eviction\b|\b(vm|vmss|virtual machine)s?\b( \S+){0,2} (was|has been|got) evicted\b",
        "a spot instance was interrupted (terminated by its cloud; Azure calls it an eviction)",
        None,
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
    _r(
        "preempted",
        "strong",
        r"\b(the )?cluster is preempted\b(?! or failed)",
        "SkyPilot's managed-job controller found the cluster preempted and is recovering it",
        "skypilot",
    ),
    _r(
        "preempted",
        "weak",
        r"\b[Cc]luster is preempted or failed\b|^\S+\s+.*\bRECOVERING\b",
        "SkyPilot's managed-job controller recovers the cluster: a preemption, or a failure it cannot tell apart",
        "skypilot",
        flags=0,
    ),
    _r(
        "preempted",
        "strong",
        r"\bnode (was|has been) preempted\b|\b(has|have|had) been (manually )?preempted\b|"
        r"\b(TPU|VM|instance|machine|host|worker|slice|allocation)s? (was|were|got|is being) pre-?empted\b",
        "the node, machine or TPU running the work was preempted (Ray, a cluster manager, a cloud)",
        None,
    ),
    _r(
        "preempted",
        "strong",
        r"\bPreemptionError\b|\bgot pre-?empted\b|\bpre-?emption warning signal\b",
        "Azure ML: the job's low-priority nodes were preempted",
        "azure",
    ),
    _r(
        "preempted",
        "strong",
        r"\\?\"action\\?\"\s*:\s*\\?\"(terminate|stop|hibernate)\\?\"",
        'an agent read AWS\'s spot instance-action notice ({"action": ..., "time": ...}) from the metadata service',
        "aws",
    ),
    _r(
        "preempted",
        "strong",
        r"\b(preemption|termination) is imminent\b|\bspot (instance )?interruption\b|\bSpotInterruption(Kind)?\b",
        "an agent read the cloud's reclaim notice from the metadata service",
        None,
    ),
    _r(
        "preempted",
        "strong",
        r"\bpreempt(ed|ing) to accommodate a\b|Preempted in order to admit critical pod|\bReason:\s*Preempting\b",
        "Kubernetes (scheduler, kubelet or Kueue) preempted the pod or workload for a higher-priority one",
        "k8s",
    ),
    _r(
        "preempted",
        "weak",
        r"Host EC2 \(instance \S+\) terminated",
        "AWS Batch: the host instance went away under the job (on Spot capacity, a reclaim)",
        "aws",
    ),
    _r(
        "preempted",
        "strong",
        r"\b(job|task|pod|instance|vm|node|worker|machine|allocation|trial|workload|replica|host)s?\b( \S+){0,3} "
        r"(was|were|has been|have been|got|is being|being) (preempted|reclaimed)\b(?! or)|^(job|task|instance|node) "
        r"(preempted|reclaimed)\b|\bpreempted by (a |an )?(higher|high)[- ]priority\b|\b(spot|preemptible) (instance|vm"
        r"|node|capacity)s? (was |were |has been )?(reclaimed|interrupted|preempted)\b|"
        r"\b(deleted|evicted|killed|terminated|cancell?ed|stopped)( \S+){0,2} (by|due to|for) (priority )?preemption\b",
        "the platform or scheduler reports the work was preempted (a reclaim, or a higher-priority job)",
        None,
    ),
    _r(
        "preempted",
        "strong",
        r"\bthis job is preempted\b",
        "submitit caught the scheduler's preemption signal and requeues the job",
        "submitit",
    ),
    _r(
        "preempted",
        "strong",
        r"\bULOG_JOB_EVICTED\b|\bJob was evicted\b|\bJobEvictedEvent\b",
        "HTCondor evicted the job from its slot (reclaimed by its owner or a higher-priority job); it goes back to "
        "the queue",
        "htcondor",
    ),
    _r(
        "preempted",
        "weak",
        r"Can ?not reconnect to \S+, rescheduling job",
        "HTCondor lost the machine the job ran on and reschedules it (on opportunistic or spot slots, a reclaim)",
        "htcondor",
    ),
    _r("preempted", "strong", r"\bTERM_PREEMPT\b", "LSF preempted the job", "lsf"),
    _r(
        "preempted",
        "weak",
        r"\bwill be terminated soon \(reason: ",
        "the cluster's autoscaler says an instance under the work is going away (a pod's or instance's termination: a "
        "reclaim, a scale-down, a drain)",
        "ray",
    ),
    _r(
        "preempted",
        "strong",
        r"\bAUTOSCALER_DRAIN_PREEMPTED\b|\bpreempted by (the )?autoscaler\b",
        "Ray: the node was drained because its instance was preempted",
        "ray",
    ),
    _r(
        "preempted",
        "weak",
        r"\bINSTANCE_UNREACHABLE\b|has been marked dead because the detector has missed too many heartbeats|"
        r"health check failed due to missing too many heartbeats|\bits node has died\b|\bNodeDiedError\b|"
        r"\bthe node it was running on is dead\b|\blame workers found\b|\bnode no longer exists\b|"
        r"\bshim health: SSH or tunnel error\b|\bPAPI error code 10\b|\bThe assigned worker has failed to complete the "
        r"operation\b|\[GOOGLE BATCH\].*\bCannot read exit status\b|\bContainer released on a \*?lost\*? node\b|"
        r"\bNodeNotReady\b",
        MACHINE_GONE,
        None,
    ),
    _r(
        "preempted",
        "strong",
        r"\bPREEMPTION_IN_PROGRESS\b|\bJob Preemption Started\b",
        "AWS Batch preempts the job to reclaim capacity",
        "aws",
    ),
    _r(
        "preempted",
        "strong",
        r"\bINTERRUPTED_BY_NO_CAPACITY\b|\binterrupted by no capacity\b",
        "dstack: the spot instance was interrupted (the cloud reclaimed the capacity)",
        "dstack",
    ),
    # time limits
    _r("time-limit", "strong", r"\bJobState=(TIMEOUT|DEADLINE)\b", "scontrol: job state TIMEOUT", "slurm"),
    _r(
        "time-limit",
        "strong",
        r"\b([Ss]tate|[Ss]tatus)( is)?\W{1,3}(TIMEOUT|DEADLINE)\b",
        "the scheduler reports the job's state TIMEOUT (seff, submitit, sacct's words)",
        "slurm",
        flags=0,
    ),
    _r(
        "time-limit",
        "strong",
        r"\*\*\* (JOB|STEP) \S+ (ON \S+ )?CANCELLED AT \S+ DUE TO TIME LIMIT",
        "SLURM time limit reached",
        "slurm",
    ),
    _r(
        "time-limit",
        "strong",
        _SACCT_ROW + r"\bTIMEOUT\b",
        "sacct: job state TIMEOUT",
        "slurm",
        flags=0,
    ),
    _r(
        "time-limit",
        "strong",
        r"Job was active longer than specified deadline|\bDeadlineExceeded\b|"
        r"\bPod was active on the node longer than the specified deadline\b",
        "Kubernetes Job activeDeadlineSeconds reached (a Job's or a pod's, as Argo's activeDeadlineSeconds sets it)",
        "k8s",
    ),
    _r(
        "preempted",
        "strong",
        r'"?messageKind"?[:=] ?"?spot_interrupted\b',
        "Karpenter's interruption controller: AWS reclaimed the spot node (a Spot interruption warning)",
        "aws",
    ),
    _r(
        "terminated",
        "strong",
        r"\bEvent:PodEvicted\b",
        "Volcano: a pod of the job was evicted, and the job's policy ended or restarted its task",
        "k8s",
    ),
    _r(
        "terminated",
        "hint",
        r"\bscale_down\.go:\d+\] \S+ was unneeded for\b",
        "the cluster autoscaler marked the node unneeded (it scales such nodes down, with what runs on them)",
        "k8s",
    ),
    _r(
        "terminated",
        "strong",
        r"^[$#] *(sudo +)?(docker|podman) +(container +)?stop\b",
        "a container stop typed in the log's shell: SIGTERM, then SIGKILL after the grace period (docker stop -t)",
        "docker",
    ),
    _r(
        "killed",
        "strong",
        r"^[$#] *(sudo +)?((docker|podman) +(container +)?kill\b(?!.*--signal)|"
        r"(kill|pkill|killall) +-(9|KILL|SIGKILL)\b)|\bprocess force killed by others\b",
        "a SIGKILL with its sender named: a kill -9 or docker kill typed in the log's shell, OpenPAI's 'force killed "
        "by others'",
        None,
    ),
    _r(
        "terminated",
        "strong",
        r"\bThe container could not be located when the pod was (terminated|deleted)\b",
        "Kubernetes: the pod was terminated or deleted from outside and its container was gone (its exit 137 is the "
        "kubelet's stand-in, not an OOM kill)",
        "k8s",
    ),
    _r(
        "terminated",
        "strong",
        r"\bStopped with strategy '(Terminate|Stop)'",
        "Argo Workflows: the workflow was stopped (argo terminate or argo stop, a shutdown strategy)",
        "k8s",
    ),
    _r(
        "time-limit",
        "strong",
        r"\bLaunch timed out, space was not healthy after \d+ ?min\b|"
        r"\bThis job was terminated because it ran longer than the maximum allowed job run time\b",
        "the platform's time limit: a Hugging Face Space's launch timeout, Galaxy's maximum job run time",
        None,
    ),
    _r(
        "oom",
        "strong",
        r"^\s*(Total hbm usage >=|Program hbm requirement|Largest program allocations in hbm)",
        "XLA's report of what did not fit in a TPU's or GPU's HBM (printed with RESOURCE_EXHAUSTED)",
        None,
    ),
    _r(
        "killed",
        "weak",
        r"\bWorker \(pid:\d+\) was sent SIGKILL! Perhaps out of memory\?",
        "gunicorn: a worker died of " + SIGKILL_ANY_SENDER,
        None,
    ),
    _r(
        "oom",
        "hint",
        r"\*\*\*LOW MEMORY\*\*\* less than \d+% of the memory on this node is available",
        "Ray: the node was nearly out of memory (Tune's status warning)",
        "ray",
    ),
    _r(
        "crashed",
        "strong",
        r"^Workflow failed\.\s*$|\] Task failed\.\s*$",
        "Metaflow: a step's task failed, and the workflow with it",
        None,
    ),
    _r(
        "time-limit",
        "strong",
        r"handling auto-requeue signal",
        "Lightning got SLURM's --signal (sent ahead of the time limit)",
        "slurm",
    ),
    _r(
        "time-limit",
        "strong",
        r"\bTERM_(RUNLIMIT|CPULIMIT|DEADLINE)\b",
        "LSF ended the job at its run-time limit",
        "lsf",
    ),
    _r(
        "time-limit",
        "strong",
        r"\bjob killed: (walltime|cput) \d+ exceeded limit\b|"
        r"^(?!Number of )(.*)\b(exceed(ed|s)?|reach(ed|es)?|due to|hit) (the |its |a |running |maximum |hard )?"
        r"(wall[ -]?clock|wall[ -]?time|run[ -]?time|job'?s? time|time) (time )?limit\b|"
        r"\b(wall ?time|time) limit (was )?(exceeded|reached)\b(?!\W{1,5}skipping\b)|\bwalltime exceeded\b|"
        r"\bDUE TO TIME LIMIT\b",
        "the scheduler ended the job at its wall-clock limit (PBS, Moab, HTCondor, SGE)",
        None,
    ),
    _r(
        "time-limit",
        "strong",
        r"\b(job|task|run|step|process|command|execution|attempt|script|function)\b[^.]{0,30}\btimed? ?out after "
        r"[\d.]+ ?(s|sec|secs|seconds|m|min|mins|minutes|h|hours)\b|\bduration exceeded (the )?timeout\b|"
        r"\bran longer than (the |its )?((configured|specified|allowed|maximum) )*(timeout|time ?limit|deadline|"
        r"time of \d+)\b|\b(has been|was) (initializing|starting|pending|running) for too long\b|"
        r"\bexceeded (its|the) wall ?(time|clock)\b|"
        r"\bexceeded (the |its )?(max(imum)? )?allowed (run ?|execution )?(time|duration)\b|"
        r"\bdue to task timeout\b|\bwith exit code 50005\b|\bexceeds job (hard|soft) limit \W?[hs]_(rt|cpu)\b",
        "the job or task ran past its time limit (AWS Batch and Lambda, Google Batch's 50005, Grid Engine, a runner's "
        "timeout)",
        None,
    ),
    _r(
        "time-limit",
        "weak",
        r"\bqmaster enforced h_rt, h_cpu,? or h_vmem limit\b",
        "SGE's qmaster killed the job at a hard limit: h_rt or h_cpu (a time limit; h_vmem makes allocations fail "
        "instead, which the program reports itself)",
        "sge",
    ),
    _r(
        "time-limit",
        "strong",
        r"\btimed-out and not checkpointable\b|\bJob (has )?timed out\b|\bMAX_DURATION_EXCEEDED\b|"
        r"\bFunctionTimeoutError\b|\bhit its timeout of \d+|\bMaxRuntimeExceeded\b|\bexceeded MaxRuntime|"
        r"\b(job|task|run|function) (has )?exceeded (the |its )?(configured |maximum )?timeout\b|"
        r"\b(exceeded |reached |hit )(the |its )?max(imum)? "
        r"(execution |run ?|allowed |session )?(time|duration)\b|\bmax(imum)?[ _]duration (was )?exceeded\b|"
        r"\bexecution time (limit )?(was )?exceeded\b|\b(the )?timeout was exceeded\b|"
        r"\b(Soft)?TimeLimitExceeded\b|\b(Hard|Soft) time limit \(\S+\) exceeded\b|\bjob\.exception type=timeout\b|"
        r"\breached runtime time limit\b|\bexceeded (its|the) (configured )?timeout of \d+|"
        r"\bTimeoutExpired: Command .{1,400} timed out after [\d.]+ seconds\b",
        "the job reached its time limit (submitit, dstack, Modal, CI runners, Celery, Flux, systemd; a script's "
        "subprocess timeout)",
        None,
    ),
    # out of memory
    _r("oom", "strong", r"\bJobState=OUT_OF_MEMORY\b", "scontrol: job state OUT_OF_MEMORY", "slurm"),
    _r(
        "oom",
        "strong",
        r"Out of memory: Killed process|\boom-kill\b|Memory cgroup out of memory|\boom_reaper\b|"
        r"killed by the OOM killer|\bout[- ]of[- ]memory killer\b|^(\S+ )*\[ *\d+\.\d+\] Killed process \d+ \(|"
        r"^Killed process \d+ \(\S+\) total-vm",
        "the kernel's OOM killer",
        "kernel",
    ),
    _r(
        "oom",
        "strong",
        r"Detected \d+ oom[-_]kill event|\bOUT_OF_MEMORY\b|\bOUT_OF_ME\+|"
        r"\bmay have been killed by the cgroup out-of-memory handler\b",
        "SLURM: the step was OOM-killed",
        "slurm",
    ),
    _r("oom", "strong", r"srun: error: \S+: tasks? [\d,-]+: Out Of Memory$", "srun: a task was OOM-killed", "slurm"),
    _r("oom", "strong", r"\bOOM[ -]?Killed\b(?![\"']?\s*[:=]\s*false)", "container OOM-killed", "k8s"),
    _r("oom", "strong", r"Out of memory: Kill process", "the kernel's OOM killer", "kernel"),
    _r(
        "oom",
        "strong",
        r"killed due to memory pressure \(OOM\)|\bNODE_OUT_OF_MEMORY\b|node running low on memory|"
        r"\bray-oom-prevention\b",
        "Ray's memory monitor killed workers: the node ran out of memory",
        "ray",
    ),
    _r("oom", "strong", r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory", "GPU out of memory", None),
    _r(
        "oom",
        "strong",
        r"Resource exhausted: (OOM when allocating|Failed to allocate request for)|No executable batch size found|"
        r"\bJavaScript heap out of memory\b|\bReached heap limit Allocation failed\b|\bOOM detected\b|"
        r"can't allocate memory|Cannot allocate memory",
        "out of memory (an allocation failed)",
        None,
    ),
    _r(
        "oom",
        "strong",
        r"\bContainer killed by YARN for exceeding (virtual |physical )?memory limits\b|"
        r"\bis running beyond physical memory limits\b|\b(exit ?(status|code)|exitCode)\W{0,3}-10[34]\b",
        "YARN killed the container for going over its memory (its NodeManager's check, physical or virtual; exit "
        "status -104 or -103: KILLED_EXCEEDED_PMEM, KILLED_EXCEEDED_VMEM)",
        "yarn",
    ),
    _r(
        "oom",
        "strong",
        r"\bTERM_(MEMLIMIT|SWAP)\b|\bjob killed: p?v?mem \d+\w* exceeded limit\b|exceeded a memory resource limit|"
        r"\bdue to memory usage\b|\bexceeded (the )?(mem|memory) usage (hard |soft )?limit\b|"
        r"^(?!.*\b(could|may|might) be caused by\b)(.*\b(excessive|too much) (memory|RAM)\b)|"
        r"^(?!Number of )(.*)\b(exceed(ed|s|ing)?|over) (the |its |a )?(requested |allocated |job'?s? )?memory"
        r"( usage)? limits?\b|\bmemory limit (was )?exceeded\b|\bexceed\w* (the )?h_vmem\b|(?<!or )\bh_vmem limit\b|"
        r"\bgone over (its |the )?(cgroup )?memory limit\b|\bexceeded request_memory\b",
        "the scheduler ended the job for using more memory than it asked for (LSF, PBS, HTCondor, SGE)",
        None,
    ),
    _r(
        "oom",
        "weak",
        r"\bslurmstepd: (error: )?Exceeded (step|job) memory limit\b",
        "SLURM: the step's memory cgroup reached its limit (a task was most likely OOM-killed; page cache counts "
        "too, so a step that finished may print it: sacct's State and MaxRSS decide)",
        "slurm",
    ),
    _r(
        "oom",
        "strong",
        r"\bexceeded \d+% memory budget\b",
        "Dask: a worker went over its memory budget (the nanny restarts a worker past 95% of its memory_limit)",
        "dask",
    ),
    _r(
        "oom",
        "strong",
        r"\bCUDA_ERROR_OUT_OF_MEMORY\b|\bnot enough memory: you tried to allocate\b|\bstd::bad_alloc\b|"
        r"\bResourceExhaustedError\b|\bRESOURCE_EXHAUSTED: Out of memory\b|^(\w+\.)*MemoryError\b|"
        r"tried to allocate more memory than is available|"
        r"\bUnable to allocate [\d.]+ [KMGT]i?B\b|\b(CUBLAS|CUDNN)_STATUS_ALLOC_FAILED\b|"
        r"\b(HIP|MPS|XPU|NPU)( backend)? out of memory\b|"
        r"\bkilled by (the )?(OOM|out of memory)\b|The paging file is too small for this operation|"
        r"^(?!.*\b(typically|usually|often|may|might|could|possibly|probably|likely|if|whether|means|"
        r"hint)\b).*"
        r"\b(ran|runs|running|run) out[- ]of[- ](GPU |host |system |device )?memory\b|"
        r"\bRESOURCE_EXHAUSTED: (Attempting to (reserve|allocate)|.*\b(memory|HBM)\b)|"
        r"^(\w+ )?(fatal )?error: out of memory\b|\bOut of memory error on GPU\b",
        "out of memory (an allocation failed, a worker went over its memory budget, or the notebook ran out of RAM)",
        None,
    ),
    _r(
        "oom",
        "weak",
        r"\b(do not|don't|does not|doesn't) have enough (GPU |host |system |device )?(memory|RAM)\b|"
        r"\bnot enough (GPU |host |system |device )?(memory|RAM)( available| left)?\b",
        "a program or library says there was not enough memory",
        None,
    ),
    _r(
        "oom",
        "weak",
        r"内存不足|显存不足|内存溢出|显存溢出|記憶體不足|メモリ不足|メモリが不足|메모리 부족|메모리가 부족|"
        r"[\u041d\u043d]едостаточно (оперативной |видео)?памяти|[\u041d\u043d]ехватка памяти|"
        r"\b[Ll][ií]mite de memoria excedido|mite de memoria excedido|\bmemoria insuficiente\b|"
        r"\bm[ée]moire insuffisante\b|\bnicht genügend (Arbeits)?speicher\b",
        "a program or platform says memory ran out (in the system's language)",
        None,
        flags=0,
    ),
    _r(
        "oom",
        "strong",
        r"\bsession crashed after using all available RAM\b",
        "Colab: the notebook's session ran out of RAM",
        "colab",
    ),
    _r(
        "oom",
        "strong",
        r"^.{0,60}\[ pid \]\s+uid\s+tgid\s+total_vm\s+rss\b.*\boom_score_adj\s+name\b",
        "the kernel's OOM-killer report (its table of the tasks it chose among)",
        None,
    ),
    _r(
        "oom",
        "weak",
        r"\bYour session crashed\b",
        "Colab restarted a session that crashed (most often it ran out of RAM)",
        "colab",
    ),
    # a collective that never completed: a rank stopped answering (hung, or gone without its peers being told)
    _r(
        "collective-timeout",
        "strong",
        r"Watchdog caught collective operation timeout|\bNCCL timeout\b|Timed out waiting \d+ ?ms for "
        r"(recv|send) operation|\bcollective operation timeout\b|\bNCCL watchdog thread terminated\b|"
        r"WorkNCCL\(SeqNum=\d+.*Timeout\(ms\)=\d+\) ran for|store based barrier|watchdog got stuck for \d+ "
        r"seconds|Terminating the process after attempting to dump debug info|\bgloo::TimeoutException\b|"
        r"\bgloo/transport/\S+\] TIMEOUT\b|\bApplication timeout caused pair closure\b|"
        r"^Exception raised from checkTimeout at\b|\bwatchdog hang due to timeout\b",
        "a collective timed out: a rank stopped answering (NCCL/Gloo watchdog)",
        "torchrun",
    ),
    # symptoms of another rank's end, on a rank that was waiting for it
    _r(
        "collective-timeout",
        "weak",
        r"Some NCCL operations have failed or timed out|we are taking the entire process down|"
        r"timed out after waiting for \d+ ?ms flight recorder dumps",
        "the NCCL watchdog found a failed or timed-out collective and is taking the process down",
        "torchrun",
    ),
    _r(
        "killed",
        "weak",
        r"A worker died or was killed while executing a task by an unexpected system error|"
        r"Worker exit type: SYSTEM_ERROR",
        "a Ray worker died unexpectedly (Ray names SIGKILL by the OOM killer, ray stop --force or a crash as causes)",
        "ray",
    ),
    _r(
        "crashed",
        "weak",
        r"remote process exited or there was a network error",
        PEER_LOST,
        "torchrun",
    ),
    # crashes
    _r(
        "crashed",
        "strong",
        r"\bNCCL error\b|\bnccl(InternalError|UnhandledCudaError|SystemError|InvalidUsage|InvalidArgument|"
        r"RemoteError)\b|\bunhandled cuda error\b",
        "an NCCL collective failed",
        "torchrun",
    ),
    _r(
        "crashed",
        "strong",
        r"^(?!.*\b(could|may|might) be caused by an? (segmentation fault|bus error)\b)"
        r"(.*(Segmentation fault|\bBus error\b|core dumped))",
        "the process died of a signal: native code crashed (a segfault, a bus error, an abort)",
        None,
    ),
    _r("crashed", "strong", r"Fatal Python error|illegal memory access", "the process crashed", None),
    _r(
        "crashed",
        "strong",
        _JOB + r"(段错误|[\u041e\u043e]шибка сегментирования|Speicherzugriffsfehler|Erreur de segmentation|"
        r"Violación de segmento|Falha de segmentação|セグメンテーション違反|세그멘테이션 오류|Errore di segmentazione)",
        "the process crashed: the shell reports a segmentation fault (in the system's language)",
        None,
    ),
    _r(
        "crashed",
        "strong",
        r"the monitored command dumped core|Windows fatal exception|\bSTATUS_ACCESS_VIOLATION\b|\b0xC0000005\b|"
        r"\b0xC0000409\b|\b0xC00000FD\b",
        "the process crashed (a Windows access violation or stack fault)",
        None,
    ),
    _r(
        "crashed",
        "strong",
        r"\bline \d+: +\d+ (Aborted|Floating point exception|Illegal instruction)\b|"
        r"^(Aborted|Floating point exception|Illegal instruction)( \(core dumped\))?$|"
        r"^\[\d+\][+-]? +(Aborted|Abgebrochen|Abandon|Аварийный останов|已放弃|Floating point exception|"
        r"Illegal instruction)( \(core dumped\)| \(Speicherabzug geschrieben\)| \(core dumped\))?\s+\S",
        "the process crashed: the shell reports it died of SIGABRT, SIGFPE or SIGILL",
        None,
        flags=0,
    ),
    _r(
        "crashed",
        "strong",
        r"\*\*\* SIG(SEGV|ABRT|BUS|FPE|ILL) \(@0x[0-9a-f]+\) received by PID\b|"
        r"\b(free|malloc|realloc)\(\): (invalid|corrupted|unaligned)|double free or corruption|munmap_chunk\(\): "
        r"invalid pointer|corrupted size vs\. prev_size|\bSignal: (Segmentation fault|Aborted|Bus error|"
        r"Floating point exception|Illegal instruction) \(\d+\)",
        "the process crashed (glibc found its heap corrupted and aborted it, or a signal handler reports the fault)",
        None,
    ),
    _r(
        "crashed",
        "strong",
        r"\bBLAS : Program is Terminated\. Because you tried to allocate too many memory regions\b",
        "OpenBLAS aborted the process: more threads than its build allows each asked for a buffer (set "
        "OPENBLAS_NUM_THREADS, or fewer worker processes)",
        None,
    ),
    _r(
        "crashed",
        "hint",
        r"\bPrimary job +terminated normally, but \d+ process(es)? returned\b",
        "a process of the job exited non-zero and mpirun aborted the rest (its next line, if given, says how it ended)",
        "mpirun",
    ),
    _r(
        "crashed",
        "strong",
        r"^Execution halted$|\bEXITING because of (a )?FATAL\b",
        "the program stopped on its own error (R's 'Execution halted', a tool's fatal error)",
        None,
        flags=0,
    ),
    _r(
        "crashed",
        "weak",
        r"executable file not found in \$PATH|: command not found$",
        "the job's program could not be started",
        None,
    ),
    _r(
        "crashed",
        "weak",
        r"^terminate called after throwing an instance of",
        "an uncaught C++ exception aborted the process (its 'what()' line says why: a watchdog's timeout, an error)",
        None,
    ),
    _r(
        "crashed",
        "strong",
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: F \S+:\d+\]|^F\d{4} [\d:.]+ +\d+ \S+:\d+\] Check failed: ",
        "a fatal check aborted the process (a glog FATAL line: TensorFlow, XLA, a native library)",
        None,
        flags=0,
    ),
    _r(
        "crashed",
        "strong",
        r"fallen off the bus|\bNVRM: Xid\b|^Check failed: |\] Check failed: ",
        "the GPU or a native library failed (an Xid error, a GPU off the bus, a failed CHECK)",
        None,
    ),
    _r(
        "crashed",
        "strong",
        r"DUE TO TASK FAILURE|\bExecuteUserScriptError\b",
        "a task of the job failed (the scheduler then cancelled the rest)",
        None,
    ),
    _r(
        "crashed",
        "weak",
        r"exited with a non-zero status of \d+\. Termination reason: Error|\bFailed - Training job failed\b|"
        r"\bCONTAINER_EXITED_WITH_ERROR\b|"
        r"\bJobStatus\.FAILED\b|\bJob finished \(status: FAILED\)|\bThe user job failed\b|"
        r"\bJob \d+ failed with return code\b|\bBackoffLimitExceeded\b|\bJob has reached the specified backoff limit\b",
        "the platform reports the job's program failed",
        None,
    ),
    _r(
        "killed",
        "strong",
        r"DUE TO JOB NOT ENDING WITH SIGNALS",
        "SLURM SIGKILLed the job's processes after they outlived the signals that should have ended them",
        "slurm",
    ),
    _r(
        "killed",
        "strong",
        r"DUE TO NODE FAILURE|\bNODE_FAIL\b|^srun: error: Node failure on \S+",
        "the node failed (everything on it died at once)",
        "slurm",
    ),
    # terminations: a signal, sender unknown
    _r(
        "terminated",
        "strong",
        r"Received (15|Signals\.SIGTERM) death signal|got (signal|sigval) ?: ?15\b|Signal 15 \(SIGTERM\) received",
        "torchrun received SIGTERM",
        "torchrun",
    ),
    _r(
        "terminated",
        "strong",
        r"Received (1|3|Signals\.SIG(HUP|QUIT)) death signal|got (signal|sigval) ?: ?(1|3)\b",
        "torchrun received a terminating signal",
        "torchrun",
    ),
    _r(
        "terminated",
        "strong",
        r"\*\*\* (JOB|STEP) \S+ (ON \S+ )?CANCELLED AT \S+( \*\*\*|$)",
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
    _r("terminated", "strong", r"Received SIG(TERM|USR1|USR2): \d+", "Lightning received a signal", None),
    _r(
        "terminated",
        "strong",
        r"\bThe node was low on resource: \[?memory\b|\bThe node had condition: \[MemoryPressure\]|"
        r"\bevicted due to memory pressure\b",
        MEMORY_PRESSURE,
        "k8s",
    ),
    _r(
        "terminated",
        "strong",
        r"\bThe node was low on resource\b|"
        r"\bThe node had condition: \[\w*Pressure\]|\bReason:\s*Evicted\b|Eviction manager: pod is evicted|"
        r"eviction manager: must evict|^\s*Warning\s+Evicted\s|\bephemeral local storage usage exceeds\b|"
        r"\bexceeded its local ephemeral storage limit\b",
        "Kubernetes evicted the pod (node pressure, or its disk over its ephemeral-storage limit)",
        "k8s",
    ),
    _r(
        "terminated",
        "weak",
        r"\bNode is shutting down, evicting pods\b|\bdetected new shutdown event\b|"
        r"\b(pod|container|workload)s? (was |were |has been |have been |got )?evicted\b|\bevicted due to (node|"
        r"memory|disk|ephemeral[- ]storage) pressure\b|\bpod deleted$",
        "Kubernetes evicted the pod (node pressure, a drain or the eviction API)",
        "k8s",
    ),
    _r(
        "terminated",
        "strong",
        r"(\bkubectl|^\W*k) delete (pods?|jobs?|jobsets?|pytorchjobs?|tfjobs?|mpijobs?|deployments?)\b|"
        r"\bkubectl drain\b",
        "a user deleted the pod or job (or drained its node): Kubernetes sent SIGTERM",
        "k8s",
    ),
    _r(
        "terminated",
        "strong",
        r"\bdisconnected due to executing code that is disallowed\b",
        "Colab stopped the runtime for running code its free tier does not allow",
        "colab",
    ),
    _r(
        "terminated",
        "strong",
        r"\b(STOPPED|TERMINATED|ABORTED)_BY_USER\b|\breason: user requested (pause|kill|cancel|stop)\b",
        "a user or an admin stopped the job (dstack, Determined)",
        None,
    ),
    _r(
        "terminated",
        "strong",
        r"\bTERM_(OWNER|ADMIN|FORCE_OWNER|FORCE_ADMIN|REQUEUE_OWNER|REQUEUE_ADMIN)\b",
        BKILL,
        "lsf",
    ),
    _r("terminated", "strong", r"^pod \"[^\"]+\" deleted$", "kubectl delete: the pod was deleted", "k8s", flags=0),
    _r(
        "completed",
        "strong",
        r"\bJob \S+ finished with status DONE\b|\bJOB_STATE_DONE\b|\bFlow run '[^']*' - Finished in state Completed\(",
        "the pipeline's runner reports the job done (Dataflow's DONE, Prefect's flow run Completed)",
        None,
    ),
    _r(
        "terminated",
        "weak",
        r"\b(Sent|Sending) SIG(TERM|INT) to (process|pid) \d+",
        "a supervisor (a test harness, a wrapper) reports it sent the process SIGTERM or SIGINT",
        None,
    ),
    _r(
        "completed",
        "weak",
        r"\bStopping worker at \S+\. Reason: scheduler-close\b",
        "Dask: the scheduler closed the cluster (the client's close at the end of its work)",
        "dask",
    ),
    _r(
        "crashed",
        "strong",
        r"^error: creating server: ",
        "Triton could not start (a model failed to load): what it logged while shutting down is its teardown",
        None,
    ),
    _r(
        "completed",
        "strong",
        r"\bExperiment has succeeded because\b|\breason: ExperimentMaxTrialsReached\b|\bExperimentGoalReached\b",
        "Katib: the experiment succeeded (its trial budget or its goal reached)",
        "k8s",
    ),
    _r(
        "terminated",
        "weak",
        r"^Finished: ABORTED$|^Aborted by \S",
        "Jenkins aborted the build: a user or an administrator stopped it (a timeout step says so first)",
        "jenkins",
        flags=0,
    ),
    _r(
        "interrupted",
        "weak",
        r"^Rejected by \S",
        "Jenkins: the user answered no at the pipeline's input step, which stops the build",
        "jenkins",
        flags=0,
    ),
    _r(
        "terminated",
        "weak",
        r"\bSent interrupt\. Waiting \d+\w* before force killing\b",
        "Nomad stopped the task (a job stop or update, a drain, a lost client's allocation): its kill signal, then "
        "SIGKILL after the kill timeout",
        "nomad",
    ),
    _r(
        "terminated",
        "weak",
        r"\bJob deleted at request of\b|\bPower key pressed\b|\bBypassing signal SIGTERM\b",
        "the job or its machine was stopped from outside (a deleted PBS job, an ACPI shutdown, a SIGTERM that "
        "submitit let through): who asked is not said",
        None,
    ),
    _r(
        "terminated",
        "strong",
        r"\"EventType\"\s*:\s*\"Terminate\"",
        "Azure Scheduled Events: Terminate (the VM is being deleted by its owner or scale set, not a Spot eviction)",
        "azure",
    ),
    _r(
        "terminated",
        "weak",
        r"\bjobs? SIGHUPed\b|\bReceived (OS )?signal '?hangup'?|\bline \d+: +\d+ Hangup\b|^Hangup$|"
        r"^\[\d+\][+-]? +(Hangup|Aufgelegt|Fin de la connexion \(raccroché\)|Обрыв терминальной линии)\s+\S",
        "the command was stopped from outside: its terminal or session hung up (SIGHUP)",
        None,
    ),
    _r(
        "terminated",
        "weak",
        r"\b(job|run|task|workflow|operation) (is being|was|has been) (cancell?ed|canceling|cancelling)\b|"
        r"\bJob '?\w+'? (was )?stopped\.?$|\bJob \S+ has been stopped\b",
        "the job was cancelled or stopped from outside: a user, a newer run that replaced it, the platform's timeout, "
        "or the runner or machine under it shutting down",
        None,
    ),
    _r(
        "terminated",
        "weak",
        r"closing signal SIG(HUP|QUIT)\b",
        "torchrun passed a terminal hang-up or interrupt on to its workers (it forwards only signals it received)",
        "torchrun",
    ),
    _r(
        "terminated",
        "weak",
        r"\bline \d+: +\d+ Terminated\b|^\[\d+\][+-]? +Terminated\b|^Terminated$|: tasks? [\d,-]+: Terminated|"
        r"\]Terminated\s*$",
        "the shell or srun reports the command died of SIGTERM",
        None,
        flags=0,
    ),
    _r(
        "terminated",
        "weak",
        r"(^|\s)(已终止|[\u0417\u0437]авершено|Beendet|Terminado|Complété|終了しました)\s*$|"
        r"^\[\d+\][+-]? +(已终止|[\u0417\u0437]авершено|Beendet|Terminado|Terminato|Complété|종료됨)\s+\S|"
        r"\bline \d+: +\d+ (已终止|[\u0417\u0437]авершено|Beendet|Terminado|Terminato|Complété|종료됨)\s|"
        r"^zsh: (terminated|hangup)\s|" + _ZSH_JOB + r"(terminated|hangup) +\S",
        "the shell reports the command died of SIGTERM (in the system's language)",
        None,
        flags=0,
    ),
    # a user's own stop
    _r(
        "interrupted",
        "strong",
        r"Received (2|Signals\.SIGINT) death signal|got (signal|sigval) ?: ?2\b|Received SIGINT: \d+|"
        r"Detected KeyboardInterrupt|^\s*KeyboardInterrupt:?\s*$|^KeyboardInterrupt\s+Traceback \(most recent call|"
        r"\binterrupt \(one more within \d+ sec to abort\)|"
        r"\bsending Ctrl-C to\b|hit ctrl-c again to forcibly terminate|\binterrupted by signal 2\b|"
        r"\bInterruptException\b|\binterrupted by (the )?user\b|\bkeyboard interrupt\b|"
        r"\bprogram aborting due to control-C event\b",
        "a user's interrupt (Ctrl-C, SIGINT)",
        None,
    ),
    _r(
        "interrupted",
        "weak",
        r"closing signal SIGINT\b",
        "torchrun passed an interrupt (Ctrl-C) on to its workers (it forwards only signals it received)",
        "torchrun",
    ),
    _r(
        "interrupted",
        "weak",
        r"\bGracefully stopping\.\.\. \(press Ctrl\+C again to force\)",
        "Docker Compose is stopping the services on a signal to `up` in the foreground: most often the user's Ctrl-C",
        "docker",
    ),
    # kills
    _r(
        "killed",
        "strong",
        r"failed to exit within \d+ seconds of (signal|kill)\b.*SIGKILL",
        "dockerd SIGKILLed a container that outlived its stop timeout",
        "docker",
    ),
    _r(
        "killed",
        "strong",
        r"forcefully exiting via Signals\.SIGKILL",
        "torchrun SIGKILLed workers that outlived the shutdown grace period",
        "torchrun",
    ),
    _r(
        "killed",
        "weak",
        r"Signal 9 \(SIGKILL\) received|got (signal|sigval) ?: ?9\b",
        SIGKILL_ANY_SENDER,
        "torchrun",
    ),
    _r(
        "time-limit",
        "strong",
        r"\bKilled\s+timeout( -s \w+| --signal=\w+| -k \S+)* \d+[smhd]? ",
        "timeout(1) killed the command at its time limit (the shell names the timeout command it ran)",
        None,
    ),
    _r(
        "oom",
        "weak",
        r"\bline \d+: +\d+ Killed\b|^\[\d+\][+-]? +Killed\b|^[*_]*Killed[*_]*$|"
        r"[\d\]%)]Killed\s*$|^zsh: killed\b|^Killed: 9$|^killed;?$|^[\w@/.-]+(:| +\|) Killed$|"
        r"" + _ZSH_JOB + r"killed +\S",
        SHELL_KILLED,
        None,
        flags=0,
    ),
    _r(
        "killed",
        "weak",
        r": tasks? [\d,-]+: Killed",
        "srun reports the task died of SIGKILL (Slurm names its own OOM kills: Out Of Memory)",
        "slurm",
        flags=0,
    ),
    _r(
        "oom",
        "weak",
        rf"(^|\s)({_KILLED_WORDS})\s*$|^\[\d+\][+-]? +({_KILLED_WORDS})\s+\S|"
        rf"^\S+: [^\d:]{{1,12}} ?\d+ ?: +\d+ ({_KILLED_WORDS})\s",
        SHELL_KILLED + " (in the system's language)",
        None,
    ),
    # completion
    _r(
        "completed",
        "weak",
        _SACCT_ROW + r"\bCOMPLETED\b",
        "sacct: job state COMPLETED",
        "slurm",
        flags=0,
    ),
    _r("completed", "weak", r"\bReason:\s*Completed\b", "Kubernetes: container completed", "k8s"),
    _r("completed", "strong", r"^Successfully completed\.$", "LSF's job report: the job exited 0", "lsf", flags=0),
    _r(
        "completed",
        "strong",
        r"\bMarking task as SUCCESS\b|\bState of this instance has been externally set to success\b",
        "Airflow: the task finished successfully (or was marked so: it then stops its process)",
        "airflow",
    ),
    _r(
        "completed",
        "weak",
        r"Local worker group finished \(WorkerState\.SUCCEEDED\)|\bworker group successfully finished\b",
        "torchrun: this node's workers all exited 0",
        "torchrun",
    ),
    _r(
        "crashed",
        "weak",
        _SACCT_ROW + r"\bFAILED[\s|]+[1-9]\d*:\d+",
        "sacct: job state FAILED (a non-zero exit)",
        "slurm",
        flags=0,
    ),
    _r(
        "terminated",
        "weak",
        _SACCT_ROW + r"\bCANCELLED\b",
        "sacct: job state CANCELLED (scancel, or an admin)",
        "slurm",
        flags=0,
    ),
    _r(
        "completed",
        "weak",
        r"^\S+\s+\d+/\d+\s+Completed\s+\d+|^\s*\S+\s+Succeeded\s+\d{4}-\d\d-\d\d",
        "Kubernetes: the pod or training job finished (kubectl get pods: Completed; a job's state: Succeeded)",
        "k8s",
        flags=0,
    ),
    _r("crashed", "weak", r"\bJobState=(FAILED|BOOT_FAIL)\b", "scontrol: job state FAILED", "slurm"),
    _r(
        "crashed",
        "weak",
        r"\bBack-off restarting failed container\b|\bTrial \S+ errored after \d+ iterations\b|"
        r"^(\w+\.)*RayTaskError\(\w+\)",
        "the program failed on its own (Kubernetes restarts its failed container; Ray reports a trial's or a task's "
        "error)",
        None,
    ),
    _r(
        "crashed",
        "hint",
        r"^\S+\s+\d+/\d+\s+(Error|CrashLoopBackOff)\s+\d+",
        "Kubernetes: the pod's container exited non-zero (kubectl get pods: Error; a status, not why: a hint)",
        "k8s",
        flags=0,
    ),
    _r("terminated", "weak", r"\bJobState=CANCELLED\b", "scontrol: job state CANCELLED", "slurm"),
    _r(
        "terminated",
        "strong",
        r"\b([Ss]tate|[Ss]tatus)\W{1,3}CANCELLED\b",
        "the scheduler reports the job's state CANCELLED (scancel, or an admin)",
        "slurm",
        flags=0,
    ),
    _r(
        "preempted",
        "weak",
        r"CANCELLED AT \S+ DUE TO JOB REQUEUE\b",
        REQUEUED,
        "slurm",
    ),
    _r("completed", "weak", r"\bJobState=COMPLETED\b", "scontrol: job state COMPLETED", "slurm"),
    _r(
        "completed",
        "strong",
        r"\*{5} train metrics \*{5}|Training completed\. Do not forget to share your model",
        "Hugging Face Trainer: training finished (its end-of-training metrics)",
        "transformers",
    ),
    _r(
        "completed",
        "strong",
        r"\breached (max_steps|max_epochs|the maximum number of (steps|epochs))\b|"
        r"\bReached training limit \(\d+ steps\)|"
        r"^(?P<all>\d+) of (?P=all) steps \(100%\) done$|"
        r"^(?!.*\b(epoch|iter|step)\w* ?\d)[\[\w\] :.,|/()=-]*"  # (not "epoch 3 training done")
        r"\b(training|train) (is )?(finished|completed?|done)\b(?! or )|"
        r"\boptimization (is )?(finished|completed?|done)\b(?! or | in \d)|'train_runtime':|"
        r"\bfinished (training|optimization)\b|\[after training is done\]|End time of running main|"
        r"\bExperiment \S+ has completed\b|\b\d+ epochs? completed in\b|\bdone training\b|\bTotal training time:|"
        r"\btraining of experiment is done\b|\bDONE_BY_RUNNER\b|\bLoss for final step:|\*\*\* Best metric:|"
        r"\bjob (completed|finished) successfully\b|\bStopping training early\b|\bearly stopping (triggered|"
        r"at epoch)\b|"
        r": early stopping$|\bEngine run complete\b|\bresults at the end of training\b|\btraining took\b|"
        r"\bOverall training speed: \d+ iterations in\b|\bThe training was finished at \d+ epochs\b|^\W*(training|"
        r"train) (is )?(done|finished)\b|"
        r"\b(saving|saved|writing|wrote) (the )?final (model|checkpoint|weights)\b|\bfinal (model|checkpoint|weights) "
        r"(is )?saved\b|\b(save|saving|saved) (the )?(model|checkpoint|weights) (to|at|in) \S*\bmodel_final\b|"
        r"(^|\] |\s)(train|training|steps|optimization|optimizing): +100%\|[^|]*\| *(?P<last>\d+)/(?P=last)\b",
        "the training loop reports it reached its end (its own words, or its progress bar at the last step)",
        None,
    ),
    _r(
        "completed",
        "weak",
        r"\b(run|job|pipeline|task|workflow) (has |was )?(completed|finished|succeeded) successfully\b|"
        r"\bReporting training SUCCESS\b|\bstatus: SUCCEEDED\b|"
        r"^Status: Succeeded$|\bJob '\S+' succeeded\b",
        "the job's runner reports it finished (its own status: succeeded, done)",
        None,
    ),
    _r(
        "completed",
        "weak",
        r"^wandb: Run (summary|history):|^wandb: Program ended successfully|^wandb: Waiting for W&B process to finish"
        r".*\(success\)|^wandb: Synced \d+ W&B file|^wandb: \S+ [\d.]+ [KMG]B of [\d.]+ [KMG]B uploaded",
        "wandb closed the run (its summary is printed when the script ends; a failed exit says 'failed')",
        "wandb",
        flags=0,
    ),
    _r(
        "crashed",
        "weak",
        r"^wandb: Waiting for W&B process to finish.*\(failed \d+\)|^wandb: Program failed with code \d+",
        "wandb saw the script exit non-zero",
        "wandb",
        flags=0,
    ),
    _r(
        "crashed",
        "hint",
        r"^(\S+ )?(job failed|run failed)\.?$|^Status: Failed$|\bJob '\S+' failed\b|\bChildFailedError\b",
        "the job's runner reports it failed (how is not said: a crash, or an end from outside)",
        None,
    ),
    _r(
        "completed",
        "weak",
        r"destroy_process_group\(\) was not called before program exit|process group has NOT been destroyed before",
        "the program reached its exit (PyTorch warns of a process group left open as the interpreter shuts down); "
        "a failure logged before it would have ended the run",
        "torchrun",
    ),
    _r(
        "completed",
        "strong",
        r"`Trainer\.fit` stopped: `max_(epochs|steps|time)=",
        "Lightning: the fit reached its configured end (max_epochs / max_steps)",
        "lightning",
    ),
    _r(
        "completed",
        "strong",
        r"Completed - Training job completed|Job status: JobStatus\.SUCCEEDED\b|^Job succeeded(\.$|\s+duration_s=)|"
        r"\bphase:\s*Succeeded\b|\bTrainingJobStatus: Completed\b|\bNormal termination \(return value 0\)|"
        r"\bNormal termination of \w+|"
        r"\b(Simulation )?App(lication)? Shutting Down\b|\bEnd of program\b|"
        r"^\W*(Program|Simulation|Execution) (finished|completed|ended)( successfully| normally)?\W*$",
        "the platform or the program reports the job reached its end (SageMaker, SkyPilot, Kubernetes, HTCondor; a "
        "program's 'End of program', 'Normal termination of', an application shutting down)",
        None,
    ),
    # other tools' documented words for how a job ended (each quoted from the tool's source or documentation)
    _r(
        "preempted",
        "strong",
        r"\bContainer preempted by scheduler\b|\bBESTEFFORT_KILL\b|\bnode state: preempted\b|"
        r"\bdue to Spot Preemption\b|\bSecondaryStatus: Interrupted\b|\bPreemption detected, saving checkpoint\b|"
        r"\bYour Spot Task was interrupted\b|\bstopCode\W{1,4}SpotInterruption\b",
        "the scheduler or the cloud preempted the job (YARN, OAR's best-effort jobs, Azure Batch, GCP Batch, SageMaker "
        "managed spot, ECS and AWS Batch on Fargate Spot, NeMo's preemption callback)",
        None,
    ),
    _r(
        "time-limit",
        "strong",
        r"\bAirflowTaskTimeout\b|\bremaining timeouts\)|\bexceeded hard wallclock time\b|"
        r"\bStep exceeded its deadline\b|\bdue to task runs over the maximum runtime\b|"
        r"^\[exiting program after [\d.]+ minutes\]",
        "the job reached its time limit (Airflow, submitit's requeue, Grid Engine, Argo, GCP Batch, Megatron's "
        "--exit-duration-in-mins)",
        None,
    ),
    _r(
        "preempted",
        "strong",
        r"\b(exit ?(status|code)|exitCode)\W{0,3}-102\b",
        "YARN preempted the container (exit status -102: PREEMPTED)",
        "yarn",
    ),
    _r(
        "collective-timeout",
        "strong",
        r"\bfailed to pass monitoredBarrier in \d+ ?ms\b|\breached monitoredBarrier, but received errors while "
        r"waiting\b",
        "a rank did not reach the barrier in time (Gloo's monitored barrier)",
        "torchrun",
    ),
    _r(
        "collective-timeout",
        "weak",
        r"\bsubmitted to be reduced, gathered or broadcasted by subset of ranks\b",
        "Horovod: ranks wait for others that never submitted their tensors (a stall)",
        "horovod",
    ),
    _r(
        "interrupted",
        "strong",
        r"\bExecution was aborted by an interrupt signal\b",
        "Prefect: the run was interrupted (SIGINT)",
        "prefect",
    ),
    _r(
        "terminated",
        "strong",
        r"\bExecution was aborted by a termination signal\b|\bJob was aborted by the user\b|"
        r"\bTrainingJobStatus: Stopped, SecondaryStatus: Stopped\b|"
        r"\bExecution was cancelled by the runtime environment\b|\bflow runs? awaiting cancellation\b",
        "a stop from outside (Prefect's SIGTERM or cancellation, HTCondor's condor_rm, SageMaker's StopTrainingJob)",
        None,
    ),
    _r(
        "terminated",
        "weak",
        r"\bDisrupting NodeClaim\b|\bdeleting pod for node scale down\b",
        "the cluster took the node away (Karpenter's disruption, the cluster autoscaler's scale-down)",
        "k8s",
    ),
    _r(
        "terminated",
        "weak",
        r"\bEC2_INSTANCE_TERMINATE\b|\b_terminate_if_down\b",
        "the cluster took the node away (ParallelCluster's scaling daemons terminating an instance)",
        None,
    ),
    # operating systems', CI systems' and platforms' documented words for how a process or job ended
    _r(
        "oom",
        "strong",
        r"\binvoked oom-killer: gfp_mask=|\"reason\" : \"(vm-pageshortage|per-process-limit)\"",
        "the kernel's OOM killer ran (Linux), or jetsam ended the process for memory (macOS)",
        None,
    ),
    _r(
        "oom",
        "weak",
        r"\bJetsamEvent\b|^\W*\"bug_type\"\W+298\b",
        "macOS wrote a JetsamEvent report: it ended processes under memory pressure (its largest process first)",
        "macos",
    ),
    _r(
        "killed",
        "strong",
        r"\bload code signature error \d+ for file\b|\bSecurity policy would not allow process\b|"
        r"\binvalid signature \(code or signature have been modified\)|\bNamespace CODESIGNING\b|"
        r"\bSIGKILL \(Code Signature Invalid\)|\bCODE SIGNING: cs_invalid_page\b.*\bsending SIGKILL\b",
        "macOS refused the binary's code signature and SIGKILLed it at launch (the shell's 'Killed: 9', exit 137): "
        "not memory; re-sign it (codesign --force --sign -)",
        "macos",
    ),
    _r(
        "crashed",
        "strong",
        r"" + _ZSH_JOB + r"(abort|segmentation fault|bus error) +\S|"
        r"(" + _JOB + r"|" + _ZSH_JOB + r")(illegal hardware instruction|Abort trap: 6|Illegal instruction: 4|"
        r"Segmentation fault: 11|Bus error: 10)\b|"
        r"^zsh: (abort|segmentation fault|bus error|illegal hardware instruction)\b|"
        r"\bOMP: Error #15: Initializing \S+, but found \S+ already initialized\b",
        "the process died of a signal: zsh's and macOS's words for SIGILL, SIGABRT, SIGSEGV, SIGBUS; or OpenMP's "
        "runtime found itself loaded twice and aborts the process",
        None,
    ),
    _r(
        "interrupted",
        "strong",
        r"\bprogram aborting due to window-CLOSE event\b",
        "the user closed the Windows console the run was in (Intel's Fortran runtime, loaded with MKL, reports it)",
        "windows",
    ),
    _r(
        "terminated",
        "strong",
        r"\bprogram aborting due to (logoff|shutdown) event\b",
        "Windows ended the console the run was in: the user logged off, or the machine shut down",
        "windows",
    ),
    _r(
        "crashed",
        "strong",
        r"\*\*\* An error occurred in MPI_\w+|\bMPI_ERRORS_ARE_FATAL \(processes in this communicator will now abort\b",
        "an MPI call failed and the job aborts (Open MPI's MPI_ERRORS_ARE_FATAL); the scheduler then ends the rest",
        "mpirun",
    ),
    _r(
        "collective-timeout",
        "strong",
        r"\bretrieving ncclUniqueId from \[\d+\] via c10d key-value store\b.*\bgot error: "
        r"(Socket Timeout|wait timeout)",
        "a rank waited for rank 0's NCCL id in the store and timed out: a rank (most often 0) never reached the "
        "communicator's setup (it crashed, hung or is slower to start)",
        "torchrun",
    ),
    _r(
        "oom",
        "strong",
        r"\bwas killed: (out of swap space|failed to reclaim memory)\b",
        "the FreeBSD kernel killed the process: memory and swap ran out",
        "kernel",
    ),
    _r(
        "terminated",
        "strong",
        r"\b(Workload)?EvictedDueTo(PodsReadyTimeout|AdmissionCheck|ClusterQueueStopped|InactiveWorkload|"
        r"LocalQueueStopped)\b|"
        r"\bExceeded the PodsReady timeout\b|\bMPIJobEvicted\b|\b\d+/\d+ workers are evicted\b",
        "the job's pods were evicted from outside the program: Kueue evicted the workload (its pods not ready in time, "
        "an admission check, a stopped queue), or the MPIJob failed because a worker pod was evicted",
        "k8s",
    ),
    _r(
        "preempted",
        "strong",
        r"\b(Workload)?EvictedDueToPreempted\b",
        "Kueue preempted the workload for another with a higher priority or a fairer share",
        "k8s",
    ),
    _r(
        "completed",
        "strong",
        r"\b(ActionPhase|WorkflowExecutionPhase|TaskExecutionPhase|NodeExecutionPhase)\.SUCCEEDED\b",
        "Flyte reports the run or task succeeded",
        None,
    ),
    _r(
        "oom",
        "strong",
        r"\bsystemd-oomd killed (\d+|some) process\(es\)|"
        r"\bFAIL: call='cudaMalloc\([^)]*\)'\. Reason: ?out of memory\b|"
        r"\b(RE)?SOURCE_EXHAUSTED: Failed to allocate request for [\d.]+ ?\w*B\b",
        "out of memory: systemd-oomd killed the unit's processes under memory pressure; a CUDA allocation failed "
        "(RAPIDS' allocator); an accelerator could not allocate (XLA's RESOURCE_EXHAUSTED, wrapped)",
        None,
    ),
    _r(
        "crashed",
        "strong",
        r"\bOMP: Error #\d+: Assertion failure at\b",
        "the OpenMP runtime failed an assertion and aborts the process",
        None,
    ),
    _r(
        "time-limit",
        "strong",
        r"\bAutoMLException: .*\btotal_time_limit\b|^\W*Ran out of time, early stopping on iteration \d+",
        "the AutoML run's own time budget stopped the training (mljar's total_time_limit, AutoGluon's time_limit)",
        None,
    ),
    _r(
        "completed",
        "weak",
        r"\[flaml\.automl\.logger: [^\]]*\] \{\d+\} INFO - retrained model: |"
        r"\bProgress on:train (?P<it>\d+)it/(?P=it)it\b",
        "the run reached its end: FLAML retrained the best model after its search budget; Levanter's progress at its "
        "last step",
        None,
    ),
    _r(
        "crashed",
        "strong",
        r"^FATAL: +(While \w+ |container creation failed|could not open image|Unable to )|"
        r"^ERROR ~ Script compilation failed$",
        "the job failed to start: Apptainer/Singularity could not run the container (its FATAL), Nextflow could not "
        "compile the pipeline's script",
        None,
        flags=0,
    ),
    _r(
        "interrupted",
        "strong",
        r"^Terminate batch job \(Y/N\)\?",
        "Windows' cmd asks after a Ctrl-C reached the batch file running the command",
        "windows",
        flags=0,
    ),
    _r(
        "terminated",
        "weak",
        r"^client_loop: send disconnect: Broken pipe$|^packet_write_wait: Connection to \S+( port \d+)?: Broken pipe$",
        "the SSH session running the command dropped (the network, or the laptop slept): what it ran got SIGHUP unless "
        "it was detached (nohup, tmux, setsid)",
        None,
        flags=0,
    ),
    _r(
        "oom",
        "weak",
        r"\bfatal error: Killed signal terminated program (cc1plus|cc1|lto1|ld)\b|^Killed \(program cc1(plus)?\)$",
        "the compiler was SIGKILLed: most often the OOM killer (a build with too many parallel jobs for the memory)",
        None,
    ),
    _r(
        "oom",
        "strong",
        r"^memory allocation of \d+ bytes failed$",
        "out of memory: Rust's allocator could not allocate (it aborts the process)",
        None,
        flags=0,
    ),
    _r(
        "crashed",
        "strong",
        r"^thread '[^']+' panicked at |^Exception in thread \"[^\"]+\" (java|kotlin|scala)\.[\w.]+(Exception|Error)\b",
        "the program failed: a Rust panic, an uncaught JVM exception",
        None,
        flags=0,
    ),
    _r(
        "interrupted",
        "strong",
        r"^\S+:\d+:in [`'][^']*': Interrupt$",
        "Ruby raised Interrupt: the user's Ctrl-C",
        None,
        flags=0,
    ),
    _r(
        "crashed",
        "strong",
        r"\berror while loading shared libraries: |^Exception Type: +EXC_(BAD_ACCESS|CRASH|BAD_INSTRUCTION)\b|"
        r"\bKernel panic - not syncing: ",
        "the process could not start (a library missing), crashed (macOS's crash report), or the kernel panicked",
        None,
    ),
    _r(
        "time-limit",
        "strong",
        r"\bCancelling nested steps due to timeout\b|\bBuild timed out \(after \d+ minutes\)|"
        r"\"result_state\": \"TIMEDOUT\"|^Timeout has been exceeded$|"
        r"\bToo long with no output \(exceeded [\dhms.]+\)|"
        r"\bNo output has been received in the last \d+ ?\w*, this potentially indicates a stalled build\b",
        "the job reached its time limit (Jenkins, Databricks; CircleCI's and Travis CI's limit on time without output)",
        None,
    ),
    _r(
        "terminated",
        "strong",
        r"\bERROR: Job failed: canceled\b|^# Received cancellation signal, interrupting\b|"
        r"\"result_state\": \"CANCELED\"",
        "a user cancelled the job (GitLab, Buildkite, Databricks)",
        None,
    ),
    _r(
        "crashed",
        "weak",
        r"\"life_cycle_state\": \"INTERNAL_ERROR\"|\"code\": \"DRIVER_ERROR\"",
        "Databricks: the run failed (its driver, or the platform)",
        None,
    ),
    # training frameworks' documented words for how their loop ended (early stopping, a stop rule, a signal)
    _r(
        "completed",
        "strong",
        r"\bdid not improve in the last \d+ records\b|\bStopping training due to num_updates: \d+ >= max_update\b|"
        r"\bearly stop since valid performance hasn't improved\b|\bEarlyStopping: Stop training\b|"
        r"\bStopping training because (the mean reward|there was no new best model)\b|"
        r"\bExiting after successful completion\b|^\[exiting program at iteration \d+\]|"
        r"\bRequesting early stopping at global step\b|\bRestoring model weights from the end of the best epoch\b|"
        r"\bLoading best model from \S+ \(score: |\bTraining stopped early as no improvement observed\b|"
        r"\bStopping threshold reached: |\bEnd of training reached at step \d+|\bEarly stop requested\. Stopping "
        r"training\b|\[Early stopping\] .* The training was stopped\b|\bFinal validation metrics: \{|"
        r"\bthis is expected if you're using an IterableDataset\b|^Training time \d+",
        "the training loop reports it reached its end (early stopping, its configured steps, its stop rule)",
        None,
    ),
    _r(
        "completed",
        "weak",
        r"\bProcess \d+ exits successfully\.|\bRank \d+ finished successfully\.|\bTotal run time: [\d.]+ seconds\b",
        "a launcher reports its workers exited 0 (DeepSpeed, Composer), or Ray Tune ended its run",
        None,
    ),
    _r(
        "interrupted",
        "strong",
        r"\bCtrl \+ C detected\. Stopping sweep\b|^KeyboardInterrupt, exit$|\bCtrl-C received; terminating training\b",
        "a user's interrupt (Ctrl-C) in wandb's, Paddle's or Composer's words",
        None,
    ),
    _r(
        "interrupted",
        "weak",
        r"\bStop signal received \(e\.g\. via SIGINT/Ctrl\+C\)|\bExperiment has been interrupted\b",
        "Ray Tune stopped on a signal: most often Ctrl-C (a SIGTERM reads the same)",
        "ray",
    ),
    _r(
        "time-limit",
        "strong",
        r"\bStopping training due to cumulative_training_time: ",
        "fairseq stopped at its configured time limit (--stop-time-hours)",
        "fairseq",
    ),
    _r(
        "time-limit",
        "weak",
        r"\bRequeued SLURM job: \d+|\bRequeuing SLURM job \d+",
        "Lightning requeued the job on Slurm's signal before its time limit (or a preemption)",
        "lightning",
    ),
    _r(
        "preempted",
        "strong",
        r"\bTermination caught in main thread on preempted worker\b|\bPreemption signal received\.|"
        r"\bGrace period almost ended\. Final call to save a checkpoint\b",
        "TensorFlow's preemption handler: the worker was preempted",
        None,
    ),
    _r(
        "crashed",
        "strong",
        r"\bInvalid loss, terminating training\b|\bis not finite\. Previous best value was\b|"
        r"\bDivergence threshold reached: |\bTerminateOnNan: Output .* contains NaN or Inf\b|"
        r"\bloss scale is already at minimum\b|\bThe gradients at all steps are invalid in this epoch\b",
        "the training stopped itself on a diverged loss (NaN or Inf)",
        None,
    ),
    _r(
        "crashed",
        "weak",
        r"\bsigkill_handler\] Killing subprocess\b|\bABORT!!! Out of all \d+ trainers\b|\bException during training:",
        "the launcher stopped the others after a worker failed (DeepSpeed, Paddle), or the trainer reports the failure",
        None,
    ),
    _r(
        "terminated",
        "strong",
        r"\bUser aborted: stopping task\b",
        "ClearML: a user aborted the task",
        "clearml",
    ),
    _r(
        "killed",
        "strong",
        r"\bwith SIGTERM; terminating with SIGKILL instead\b",
        "Composer SIGKILLed a worker that outlived the SIGTERM",
        None,
    ),
    _r(
        "oom",
        "strong",
        r"\bmemory isn't enough and alloc failed\b",
        "MindSpore: a device allocation failed",
        None,
    ),
    _r(
        "crashed",
        "weak",
        r"\bFAILED \(non-zero exit code or other failure mode\)|\bNormal termination \(return value [1-9]\d*\)|"
        r"\bCrash detected! Execution was interrupted by an unexpected exception\b|\bError executing rule\b|"
        r"\bExiting because a job execution failed\b|\bjobset failed due to reaching max number of restarts\b|"
        r"\bReachedMaxRestarts\b|\b(is|has) failed because \d+ \w+ replica\(s\) failed\b",
        "the job's program failed (Slurm's step, HTCondor, Prefect, Snakemake, JobSet, Kubeflow's training operator)",
        None,
    ),
    _r(
        "crashed",
        "weak",
        r"^(\[[^\]]*\] ?)*(Fatal )?Error: (?!.*\b(retry|retrying|ignored|ignoring|skipping|warning)\b)[A-Z]\w+ error\b",
        "the program reports an error of its own (a native library's, such as CUDA's or cuRAND's) as it stops",
        None,
        flags=0,
    ),
    _r(
        "crashed",
        "strong",
        r"<flow \w+ step \w+> failed\b",
        "Metaflow: a step failed (its own error, above)",
        None,
    ),
    _r(
        "crashed",
        "weak",
        r"\bhas terminated without calling MPI_Finalize\(\)",
        "MPI: a rank ended without finishing MPI (a crash, unless a signal's line says otherwise)",
        "mpirun",
    ),
    _r(
        "terminated",
        "strong",
        r"\bTERM_EXTERNAL_SIGNAL\b|\bkilled due to exceeding (\w+ )?(jobfs|disk|scratch|storage|file ?system) quota\b",
        "the scheduler or a signal from outside ended the job (LSF's TERM_EXTERNAL_SIGNAL; PBS at a disk quota)",
        None,
    ),
    _r(
        "interrupted",
        "strong",
        r"\bTerminating processes on user request\b",
        "Snakemake: the user pressed Ctrl-C",
        None,
    ),
    # batch services', CI runners' and schedulers' documented words for a job's end, in their general forms
    _r(
        "collective-timeout",
        "weak",
        r"\[c10d\] waitForInput: socket .* timed out after \d+ ?ms\b",
        "c10d: a wait on a peer's socket timed out (a peer of the process group stopped answering)",
        "torchrun",
    ),
    _r(
        "crashed",
        "weak",
        r"\berror during training\b|\bA remote actor call has failed\b",
        "the program reports an error during training (or a remote actor's call failed)",
        None,
    ),
    _r(
        "crashed",
        "strong",
        r"\bAn internal error has occurred in ORTE\b|\bFORCE-TERMINATE AT\b|"
        r"\bA fatal error has been detected by the Java Runtime Environment\b|"
        r"\bCrash detected! Execution was aborted by\b",
        "the runtime reports its own fatal error (Open MPI's ORTE, the JVM's crash report, Prefect's crash)",
        None,
    ),
    _r(
        "time-limit",
        "strong",
        r"\bexceeded (the )?CPU time limit\b|\bMaximum CPU time exceeded\b|\bProcess timed out, PID: \d+",
        "the task ran past its time limit (a CPU-time limit; Airflow's execution_timeout)",
        None,
    ),
    _r("interrupted", "strong", r"\baborted via GUI RPC\b", "BOINC: the user aborted the task in the manager", None),
    _r(
        "completed",
        "weak",
        r"\bShutdown hook called before final status was reported\b",
        "YARN: the application's shutdown hook ran before it reported its final status (its work had run; the FAILED "
        "status is the report's)",
        "yarn",
    ),
    _r(
        "time-limit",
        "strong",
        r"\bERROR: Job failed: execution took longer than\b",
        "GitLab CI: the job ran past its timeout (the job's timeout:, or the project's)",
        "gitlab",
    ),
    _r(
        "time-limit",
        "strong",
        r"\bexecution took longer than\b",
        "a CI runner ended the job at its time limit (GitHub Actions' timeout-minutes, a runner's timeout)",
        None,
    ),
    _r(
        "terminated",
        "strong",
        r"\bAgent received command: stop\b|\bABORT \(\w+\) command received\b",
        "the run's controller told it to stop (a W&B sweep agent's stop, NVFlare's abort command)",
        None,
    ),
    _r(
        "completed",
        "strong",
        r"\bTrial detected as completed\b|\bJob finished: SUCCEEDED\b",
        "the runner reports the trial or job finished (Ray Tune, TorchX)",
        None,
    ),
    _r(
        "collective-timeout",
        "strong",
        r"\bDEADLINE_EXCEEDED: Barrier timed out\b",
        "JAX's coordination service: a barrier timed out (a host never arrived: it crashed, hung or was never started)",
        None,
    ),
    _r(
        "terminated",
        "strong",
        r"\bnode was terminated expectedly: received SIGTERM\b",
        "Ray: the actor's node was terminated (a SIGTERM to the node: the autoscaler's scale-down, a drain)",
        "ray",
    ),
    _r(
        "killed",
        "strong",
        r"\bState '(stop|final)-sig(term|int)' timed out\. Killing\b",
        "systemd: the service outlived its stop timeout after SIGTERM and was SIGKILLed",
        "systemd",
    ),
    _r(
        "interrupted",
        "strong",
        r"\b(training|learning) (was|has been) interrupted by (the )?user\b",
        "the trainer reports the user's interrupt",
        None,
    ),
    _r(
        "oom",
        "weak",
        r"\bunder_oom detected\b|\bre-enabling OOM killer\b",
        "the cgroup's memory reached its limit (the OOM killer was enabled for it)",
        "kernel",
    ),
    _r(
        "terminated",
        "weak",
        r"\bfailed liveness probe, will be restarted\b|\bLiveness probe failed\b",
        "Kubernetes: the container failed its liveness probe and the kubelet restarts it (SIGTERM, then SIGKILL after "
        "the grace period)",
        "k8s",
    ),
    _r(
        "interrupted",
        "strong",
        r"^zsh: interrupt\b|" + _ZSH_JOB + r"interrupt +\S",
        "zsh: the command was interrupted (Ctrl-C)",
        None,
    ),
    _r(
        "oom",
        "strong",
        r"\bPlease use an instance type with more memory\b|\bfatal error: runtime: out of memory\b",
        "out of memory (SageMaker's advice for a job that ran out of it; Go's runtime)",
        None,
    ),
    _r(
        "crashed",
        "strong",
        r"\bMPI_ABORT was invoked on rank \d+\b",
        "an MPI rank called MPI_Abort (the program's own error)",
        "mpirun",
    ),
    _r(
        "preempted",
        "strong",
        r"\bcapacity (was |has been )?reclaimed\b|\bpreemption notice (was )?(received|detected)\b|"
        r"\b(received|got|detected) (a |the )?(preemption|spot interruption) (notice|signal|warning|event)\b",
        "the platform reclaimed the machine's capacity (a preemption notice)",
        None,
    ),
    _r(
        "preempted",
        "strong",
        r"\bdue to (Spot )?VM preemption\b|\bwith exit code 50001\b",
        "Google Batch: the task's Spot VM was preempted (exit code 50001)",
        "gcp",
    ),
    _r(
        "oom",
        "strong",
        r"\bexceeds job (hard|soft) limit \W?([hs]_vmem|h_rss|mem_free)\b",
        "Grid Engine: the job went over its memory limit (h_vmem)",
        "sge",
    ),
    _r(
        "terminated",
        "strong",
        r"\b(aborted|cancell?ed|killed|stopped|terminated) by (the )?(admin|administrator|root|operator|sysadmin)\b|"
        r"\bvia condor_rm\b",
        "an administrator or condor_rm stopped the job",
        None,
    ),
    _r(
        "terminated",
        "strong",
        r"\bexternally set to (failed|success|up_for_retry|skipped)\b",
        "Airflow: the task's state was set from outside (a user, the scheduler's zombie or heartbeat check), and "
        "Airflow stopped the task",
        "airflow",
    ),
    _r(
        "terminated",
        "weak",
        r"\b(runner|agent|worker|node) has received a shutdown signal\b|\bTaintManagerEviction\b|"
        r"\bMarking for deletion Pod\b",
        "the machine's agent or the node was shut down under the job (a runner's service stopped; Kubernetes' taint "
        "manager evicting the pods of a node gone NotReady)",
        None,
    ),
    _r(
        "time-limit",
        "strong",
        r"\b(task|job) timeout after \d+ ?(s|sec|secs|seconds|minutes)\b",
        "the task's runner ended it at its maximum run time (Taskcluster, CI runners)",
        None,
    ),
    _r(
        "completed",
        "strong",
        r"\bTrain(ing)? model END\b",
        "the training loop reports it reached its end",
        None,
        flags=0,
    ),
)


PLATFORM_SEEN = "the job runs here (a line only this platform writes): its advice fits this platform"
PLATFORM_MARKS: tuple[Rule, ...] = (
    _r("unknown", "context",
       r"^##\[group\]|^##\[endgroup\]|^Run actions/|\buses: actions/|^Cleaning up orphan processes$|"
       r"^(##\[error\])?The runner has received a shutdown signal\b|"
       r"^(##\[error\])?Process completed with exit code \d+\.$",
       PLATFORM_SEEN, "github-actions", flags=0),
    _r("unknown", "context", r"^Exited with code exit status \d+$|^Too long with no output \(exceeded", PLATFORM_SEEN,
       "circleci", flags=0),
    _r("unknown", "context",
       r"^zsh: |\bAbort trap: \d+$|\bKilled: 9$|^/Users/|[\s'\"(]/Users/|\.dylib\b|\bMPS backend\b",
       PLATFORM_SEEN, "macos", flags=0),
    _r("unknown", "context", r"[A-Z]:\\Users\\|[A-Z]:\\Program Files|\bKERNELBASE\.dll\b|\bWinError \d+",
       PLATFORM_SEEN, "windows", flags=0),
    _r("unknown", "context", r"\bKernelRestarter\b|/dist-packages/google/colab/", PLATFORM_SEEN, "jupyter", flags=0),
    _r("unknown", "context", r"^=>> PBS: |^PBS Job Id: |\bPBS: job killed\b|^qsub: ", PLATFORM_SEEN, "pbs", flags=0),
    _r("unknown", "context", r"^Sender: LSF System\b|^Subject: Job \d+: <|^TERM_[A-Z]+: |^Job <\d+> is submitted\b",
       PLATFORM_SEEN, "lsf", flags=0),
    _r("unknown", "context", r"^\S+ exited with code \d+$|\bdocker-compose |\bdocker compose ", PLATFORM_SEEN, "docker",
       flags=0),
    _r("unknown", "context", r"\bDocker container exited with non-zero exit code\b", PLATFORM_SEEN, "docker"),
    _r("unknown", "context", r"\bThe job running on runner .+ has exceeded the maximum execution time of \d+ minutes",
       PLATFORM_SEEN, "github-actions"),
)  # fmt: skip
"""Lines that say where the job runs without saying how it ended (a CI runner's group markers, a Mac's shell and
paths, a Windows path, Jupyter's kernel restarter, Compose's service prefixes): never evidence, only the platform
whose advice fits (`_remedy.for_platforms`)."""


SPOT_CONTEXT = _r(
    "preempted",
    "context",
    r"\b(spot|preemptible|low-priority) (instances?|nodes?|vms?|workers?|capacity|pool|machines?)\b|\buse_spot\b|"
    r"\b(spot|preemptible): true\b|polling for termination-time|\bprovisioningModel\W+SPOT\b|"
    r"capacity[-_]type\W+spot\b|lifecycle\W+spot\b|gke-(spot|preemptible)\b|\bpriority\W+(Spot|Low)\b",
    "the machine is a spot/preemptible instance: a stop from outside it is most likely a reclaim",
    None,
)
"""A line that says the work runs on spot/preemptible capacity. Not evidence of an end: it makes a stop from
outside (a SIGTERM whose sender is not named, an ACPI shutdown, a node that stopped answering) read as a reclaim."""


# Collateral: what the other ranks of a job log once one of them is gone. Never a cause (they do not decide the
# verdict); `_incident.initiating` lists them after the event that caused them.
COLLATERAL_RULES: tuple[Rule, ...] = (
    _r(
        "terminated",
        "collateral",
        r"Sending process \d+ closing signal SIGTERM|Closing process \d+ via signal SIGTERM|"
        r"\bForce Terminated (StepId|job step)",
        "the launcher stopped the other workers after one failed (torchrun's or srun's teardown)",
        "torchrun",
    ),
    _r(
        "collective-timeout",
        "collateral",
        r"^(?!.*\bslurmstepd\b).*"  # (not Slurm's own daemons talking to each other)
        r"(Connection reset by peer|Connection closed by (remote )?peer|remote process exited or there was a network "
        r"error|NCCL communicator was aborted|RendezvousClosedError|RendezvousConnectionError|"
        r"failed to send a keep-alive heartbeat|Connection was likely closed|\bNo route to host\b|"
        r"\bConnection refused\b|\bBroken pipe\b|"
        r"\bSocket Timeout\b|\bDistNetworkError\b|Horovod has been shut down|"
        r"\bActorDiedError: The actor died unexpectedly before finishing this task\b|"
        r"\bORTE has lost communication with a remote daemon\b|\b(StreamClosedError|CommClosedError)\b|"
        r"\bRemote end closed connection without response\b)",
        PEER_LOST,
        "torchrun",
    ),
)


@dataclass(frozen=True)
class ExitRule:
    """A line that reports how a process ended: its exit code (group ``code``), signal number (``signum``) or
    signal name (``signame``: ``SIGKILL``, or strsignal's ``Killed``, ``Segmentation fault``, ``Bus error``)."""

    pattern: re.Pattern[str]
    what: str
    strong: bool = False
    platform: str | None = None


EXIT_RULES: tuple[ExitRule, ...] = (
    ExitRule(
        re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank"),
        "torchrun: the first worker failed, exitcode",
        True,
    ),
    ExitRule(re.compile(r"exits with return code = (?P<code>-?\d+)"), "DeepSpeed launcher: a worker exited with", True),
    ExitRule(
        re.compile(r"Signal (?P<signum>\d+) \(SIG\w+\) received by PID"), "torchrun: a worker died of signal", True
    ),
    ExitRule(
        re.compile(r"^\*\*\* (?P<signame>SIG(TERM|INT|HUP|KILL|QUIT|USR1|USR2)) \(@0x[0-9a-f]+\) received by PID"),
        "glog's signal handler: the process received",
    ),
    ExitRule(re.compile(r"terminated with exit code \(?(?P<code>\d+)\)?"), "a worker terminated with exit code"),
    ExitRule(re.compile(r"\bExited with exit code (?P<code>\d+)"), "srun: a task exited with code"),
    ExitRule(
        re.compile(r"\bContainer rank \d+ status failed\b.* code (?P<code>-?\d+)"), "Paddle's launcher: a rank exited"
    ),
    ExitRule(
        re.compile(r"Process finished with exit code (?P<code>\d+|-\d{6,})"), "the process finished with exit code"
    ),
    ExitRule(re.compile(r"returned non-zero exit status (?P<code>-?\d+)"), "a command returned exit status"),
    ExitRule(re.compile(r"\breturn code Negsignal\.(?P<signame>SIG[A-Z0-9]+)"), "Airflow: the task died of"),
    # Go's os/exec ("exited with error: signal: illegal instruction"), a runtime's own handler ("Signal Received: 15
    # (Terminated)"), Nextflow's session ("Session aborted -- Cause: SIGINT")
    ExitRule(
        re.compile(
            r"\bsignal: (?P<signame>killed|terminated|interrupt|hangup|illegal instruction|segmentation fault|aborted|"
            r"bus error|floating point exception|trace/breakpoint trap)\b"
        ),
        "the process died of",
    ),
    ExitRule(re.compile(r"\bSignal Received: (?P<signum>\d+) \("), "the process's handler reports it received signal"),
    # billiard's (Celery's pool) exception for a worker a signal ended: "Terminated: 9", "Terminated(15,)"
    ExitRule(
        re.compile(r"^(\w+\.)*Terminated: (?P<signum>\d+)\s*$|\bTerminated\((?P<signum2>\d+),?\)"),
        "billiard: the pool's worker died of signal",
    ),
    ExitRule(re.compile(r"\b[Cc]ause: (?P<signame>SIG(INT|TERM|HUP|KILL))\b"), "the session was aborted by"),
    # a runner that prints only the signal's name on a line of its own when the process dies of it (the four
    # whose names give the scan's gate a needle of 4 bytes)
    ExitRule(
        re.compile(r"^\W{0,3}(?P<signame>SIGKILL|SIGTERM|SIGSEGV|SIGABRT)\W{0,3}$"),
        "the process died of",
    ),
    ExitRule(
        re.compile(r"Process `[^`]*` terminated with an error exit status \((?P<code>-?\d+)\)"),
        "Nextflow: the task's process exited with",
        platform="nextflow",
    ),
    ExitRule(re.compile(r"\"ExitCode\"\s*:\s*(?P<code>\d+)"), "container state ExitCode"),
    ExitRule(re.compile(r"exited on signal (?P<signum>\d+)"), "mpirun: a rank exited on signal"),
    ExitRule(re.compile(r"\bexited prematurely: signal (?P<signum>\d+)"), "Celery: a worker exited prematurely"),
    ExitRule(
        re.compile(r"\bContainer killed on request\. Exit code is (?P<code>\d+)"), "YARN: the container exited with"
    ),
    # MPICH's Hydra banner ("BAD TERMINATION ... EXIT CODE: 9"): a signal's number where a signal ended the rank
    ExitRule(re.compile(r"^=\s+EXIT CODE: ((?P<signum>[2679]|11|15)|(?P<code>\d+))\s*$"), "MPICH: a rank ended with"),
    ExitRule(re.compile(r"WTERMSIG (?P<signum>\d+)"), "slurmctld: the job ended by signal"),
    ExitRule(
        re.compile(r"terminated with signal (?P<signame>SIG[A-Z0-9]+)|died with <Signals\.(?P<signame2>SIG[A-Z0-9]+)"),
        "a worker process died of",
    ),
    ExitRule(re.compile(r"is killed by signal: (?P<signame>[A-Za-z ]+)\."), "a DataLoader worker died of"),
    # Vertex AI / AI Platform ("The replica workerpool0-0 exited with a non-zero status of 137. Termination reason:
    # ..."), SageMaker ("AlgorithmError: Exit Code: 139"): the container's exit code
    ExitRule(re.compile(r"exited with a non-zero status of (?P<code>\d+)"), "the platform: a replica exited with"),
    ExitRule(re.compile(r"AlgorithmError: Exit Code: (?P<code>\d+)"), "SageMaker: the training container exited with"),
    # Torque/PBS: "Exit_status=271" is 256 + the signal (SIGTERM); a negative status is PBS's own (not a signal)
    ExitRule(re.compile(r"\bExit_status=(?P<torque>\d+)"), "PBS: the job's exit status"),
    ExitRule(re.compile(r"\(Linux Signal (?P<signum>\d+) SIG\w+"), "PBS: the job's exit status is the signal"),
    # systemd: "Main process exited, code=killed, status=9/KILL", "code=exited, status=1/FAILURE"
    ExitRule(
        re.compile(r"\bcode=(killed|dumped), status=(?P<signum>\d+)/"), "systemd: the service's process died of signal"
    ),
    ExitRule(re.compile(r"\bcode=exited, status=(?P<code>\d+)/"), "systemd: the service's process exited with"),
    # a signal in anyone's words: "terminated by signal 15", "died of SIGKILL", "exited with signal 9"; a process's
    # own handler: "Received SIGTERM, shutting down", "caught signal 2" (the same verdict as dying of it)
    ExitRule(
        re.compile(
            r"\b(terminated|killed|exited|died|ended|stopped|aborted|interrupted|exiting|shutting down|stopping)\b"
            r"( \w+){0,2} (by|with|on|of|from|due "
            r"to|after)( the| a)? (signal:? ?(?P<signum>\d+)\b|(signal:? ?)?(?P<signame>SIG[A-Z0-9]+)\b)",
            re.I,
        ),
        "a process ended by signal",
    ),
    ExitRule(
        re.compile(
            r"(\b(received|receiving|caught|catching|trapped|handling)\b:? |\bgot )(the |a )?(signal:? ?"
            r"(?P<signum>(1|2|3|9|10|12|15))\b|(signal:? ?)?(?P<signame>SIG(TERM|INT|HUP|QUIT|KILL|USR1|USR2))\b)",
            re.I,
        ),
        "the process received signal",
    ),
    ExitRule(
        re.compile(
            r"\b(signal \(?(?P<signum>1|2|3|10|12|15)\)?|(?P<signame>SIG(TERM|INT|HUP|QUIT|USR1|USR2))) (was )?"
            r"(received|caught)\b",
            re.I,
        ),
        "the process received signal",
    ),
    # a structured log's field: 'initiating hard shutdown signal="SIGTERM"', '"signal":"SIGTERM"'
    ExitRule(
        re.compile(r"(?<![\w.-])\"?signal\"?\s?[=:]\s?\"?(?P<signame>SIG(TERM|INT|HUP|QUIT|USR1|USR2))\b"),
        "the process logged the signal it received",
    ),
    ExitRule(
        re.compile(r"\bexited with (exit |status )?(code|status):? (?P<code>-?\d+)\b", re.I), "a process exited with"
    ),
    # the same facts in a tool's own words: "error code -9", "exit status 137", "exitCode: 137", "returncode=-9"
    ExitRule(
        re.compile(
            r"\b(exit|return)[ _]?(code|status)s?( (is|was))?\b\W{0,4}(?<!-)(?P<code>\d+|-[2-9]|-[1-6]\d)\b", re.I
        ),
        "a tool reports the exit code",
    ),
    ExitRule(
        re.compile(r"\berror code\W{0,4}(?P<code>-\d+|1[2-5]\d)\b", re.I),
        "a tool reports the exit code (a signal's)",
    ),
)
"""Lines that say how a process ended; ``diagnose`` reads them as exit codes (a SIGKILL, a SIGSEGV, a code 1)."""


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
