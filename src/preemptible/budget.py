"""Will the emergency checkpoint fit in the window? Size math, a bandwidth probe on the real destination,
the prediction, the verdict, what would make it fit, and the Young/Daly periodic interval.

``predicted emergency save = time to the boundary (one step) + bytes / bandwidth + commit + exit``, measured on
the storage the checkpoints will go to, compared with the platform's notice window.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from preemptible.emergency import SAFETY_MARGIN
from preemptible.events import Event
from preemptible.sources.detect import WINDOWS
from preemptible.store import layout
from preemptible.store.io import Storage, storage_for
from preemptible.store.roots import is_url

if TYPE_CHECKING:
    from preemptible.store import compress

OPTIMIZER_MOMENTS = {"adamw": 2, "adam": 2, "sgd": 1, "none": 0}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
EXIT_S = 0.5
"""Seconds from the commit to the process being gone (journal, handlers, interpreter teardown; measured ~0.3 s)."""
DEFAULT_PROBE_BYTES = 256 << 20
HEADROOM = SAFETY_MARGIN
"""A plan fits when the prediction leaves this share of the window (the same margin as the emergency path)."""


@dataclass(frozen=True, kw_only=True)
class StateSize:
    """What is saved, described rather than measured: ``params`` parameters with an optimizer.

    Weights take the dtype's bytes; Adam/AdamW keep two moments and SGD (momentum) one, in the parameters' own
    dtype as PyTorch does (fp32 for fp32 weights), or bfloat16 with ``bf16_moments``. The state is striped
    across ``world_size`` ranks (replicated data parallel: each writes a share).
    """

    params: float
    optimizer: str = "adamw"
    dtype: str = "fp32"
    bf16_moments: bool = False
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZER_MOMENTS:
            raise ValueError(f"expected optimizer among {sorted(OPTIMIZER_MOMENTS)}, found {self.optimizer!r}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"expected dtype among {sorted(DTYPE_BYTES)}, found {self.dtype!r}")
        if self.params <= 0 or self.world_size < 1:
            raise ValueError(f"expected params > 0 and world_size >= 1, found {self.params} and {self.world_size}")

    @property
    def bytes(self) -> int:
        weight = DTYPE_BYTES[self.dtype]
        moment = 2 if self.bf16_moments else weight
        return int(self.params * (weight + OPTIMIZER_MOMENTS[self.optimizer] * moment))

    @property
    def bytes_per_rank(self) -> int:
        return math.ceil(self.bytes / self.world_size)


def live_bytes(state: Mapping[str, Any] | Any) -> int:
    """Exact tensor bytes of a live state (a `Run` or a mapping of stateful objects), as the writer would write."""
    from preemptible.state import capture, flatten

    if hasattr(state, "state") and hasattr(state, "checkpointer"):  # a Run
        return flatten(capture(state.state)).tensor_bytes
    return flatten(capture(state)).tensor_bytes


def _live_flat(state: Mapping[str, Any] | Any) -> Any:
    from preemptible.state import capture, flatten

    if hasattr(state, "state") and hasattr(state, "checkpointer"):  # a Run
        return flatten(capture(state.state))
    return flatten(capture(state))


def measure_compression(
    *, state: Mapping[str, Any] | Any = None, size: StateSize | None = None
) -> compress.Measured | None:
    """This state's compression on this CPU: sampled from a live state, or, for a described one, from Gaussian
    weights of its dtype (trained weights are close to Gaussian) and moments of theirs, weighted by their bytes."""
    import torch

    from preemptible.store import compress

    if not compress.available():
        return None
    if state is not None:
        flat = _live_flat(state)
        return compress.measure((t, flat.stored_dtype(n)) for n, t in flat.tensors.items())
    if size is None:
        return None
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1 << 21, generator=g) * 0.02
    wdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[size.dtype]
    mdtype = torch.bfloat16 if size.bf16_moments else wdtype
    parts = [(compress.measure([(w, wdtype)]), DTYPE_BYTES[size.dtype])]
    moments = OPTIMIZER_MOMENTS[size.optimizer]
    if moments:
        m = (w * 1e-3).abs() ** 2  # a second moment's spread; the first moment compresses alike
        parts.append((compress.measure([(m, mdtype)]), moments * mdtype.itemsize))
    known = [(x, share) for x, share in parts if x is not None]
    if not known:
        return None
    total = sum(share for _, share in known)
    ratio = sum(x.ratio * share for x, share in known) / total
    seconds_per_byte = sum(share / x.rate for x, share in known) / total
    return compress.Measured(ratio, 1 / seconds_per_byte, sum(x.sampled for x, _ in known))


def window_for(platform: str | None, window: float | None) -> tuple[float, str]:
    """(seconds, where it comes from): an explicit window wins, else the platform's documented one."""
    if window is not None:
        if window <= 0:
            raise ValueError(f"expected a window > 0 seconds, found {window}")
        return float(window), "given"
    if platform is None:
        return WINDOWS["k8s"], "default (30 s: GCP, Azure and Kubernetes grace)"
    if platform not in WINDOWS:
        raise ValueError(f"expected a platform among {sorted(k for k in WINDOWS if k != 'local')}, found {platform!r}")
    note = {
        "aws": "AWS spot: 2-minute notice",
        "gcp": "GCP Spot: ~30 s from SIGTERM",
        "azure": "Azure Spot: Preempt at least 30 s ahead",
        "gke": "GKE Spot pods: ~15 s",
        "k8s": "Kubernetes terminationGracePeriodSeconds default",
        "slurm": "SLURM --signal lead (default 60 s; pass --window for yours)",
        "local": "default",
    }[platform]
    return WINDOWS[platform], note


@dataclass(frozen=True)
class Bandwidth:
    bytes_per_s: float
    fixed_s: float  # directory creation, fsyncs and the commit marker, measured
    probe_bytes: int
    where: str


def probe(
    root: str | os.PathLike[str],
    *,
    nbytes: int = DEFAULT_PROBE_BYTES,
    storage: Storage | None = None,
    threads: int | None = None,
) -> Bandwidth:
    """Measure fsync'd write bandwidth on ``root`` itself with the checkpoint writer's own path, then clean up.

    Writes ``nbytes`` of incompressible data into a temporary directory under the root (the same file system,
    the same direct-I/O path and the same number of parallel writer threads as a save), times it, and times
    the fixed costs of a commit (directory fsyncs and an atomic marker). The directory is removed afterwards,
    even on failure.
    """
    from preemptible.store.threads import DEFAULT_THREADS, parallel_map

    threads = DEFAULT_THREADS if threads is None else threads
    storage = storage or storage_for(root)
    if storage.kind == "local" and not os.path.isdir(storage.root):
        # A root that does not exist yet is not created by a plan: measure the file system it will be made on.
        storage = storage_for(_nearest_existing(storage.root))
    tmp = storage.join(storage.root, f".preemptible-probe-{os.getpid()}-{time.monotonic_ns()}")
    block = os.urandom(1 << 20)
    data = memoryview(bytearray(block * 16))  # 16 MiB pieces, as the writer sends them
    try:
        t0 = time.perf_counter()
        storage.makedirs(tmp)
        storage.sync_dir(storage.root)
        t1 = time.perf_counter()

        def write(i: int) -> None:  # as a save does: one file per writer thread, in parallel
            stream = storage.open_write(storage.join(tmp, f"probe-{i}.bin"))
            left = nbytes // threads
            while left > 0:
                piece = data[: min(len(data), left)]
                stream.write(piece)
                left -= len(piece)
            stream.close()

        parallel_map(write, list(range(threads)), threads=threads, name="preemptible-probe")
        t2 = time.perf_counter()
        storage.sync_dir(tmp)
        storage.publish(storage.join(tmp, layout.COMMIT), b"{}")
        t3 = time.perf_counter()
    except BaseException:
        with contextlib.suppress(Exception):  # the failure that brought us here is the one to tell
            storage.remove_tree(tmp)
        raise
    storage.remove_tree(tmp)
    return Bandwidth(nbytes / (t2 - t1), (t1 - t0) + (t3 - t2), nbytes, storage.root)


def _nearest_existing(path: str) -> str:
    """``path`` or its nearest ancestor that exists (a directory), for a probe that must not create ``path``."""
    here = os.path.abspath(path)
    while not os.path.isdir(here):
        parent = os.path.dirname(here)
        if parent == here or (os.path.exists(here) and not os.path.isdir(here)):
            raise NotADirectoryError(f"expected a directory or a path one can create, found {path!r}")
        here = parent
    return here


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    name: str
    description: str
    predicted_save_s: float
    fits: bool


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The verdict for one state, storage and window. ``to_json()`` has the stable keys of ``plan --json``.

    Attributes:
        fits: the emergency save is predicted to commit inside the window, with margin.
        predicted_save_s: the predicted seconds of the emergency save.
        window_s: the notice window it was checked against; ``window_source`` says where it came from.
        margin_s: window less prediction (negative: it does not fit).
        state_bytes: bytes the save writes; ``bandwidth_bytes_per_s``: the storage's, measured or given.
        recommendations: what to change when it does not fit (bf16 moments, pre-staging, more ranks, ...).
        periodic_interval_s: the Young/Daly interval for periodic saves at ``mtbf_hours``.

    Examples:
        >>> from preemptible import plan
        >>> p = plan(params=1e9, window=120, bandwidth=2e9)  # 1 B parameters, fp32 AdamW, 2 GB/s storage
        >>> p.fits, round(p.state_bytes / 1e9)  # weights and two moments: 12 bytes a parameter
        (True, 12)
    """

    state_bytes: int
    bandwidth_bytes_per_s: float
    predicted_save_s: float
    window_s: float
    margin_s: float
    fits: bool
    recommendations: list[Recommendation]
    periodic_interval_s: float | None
    """The Young/Daly interval for periodic saves (with `DEFAULT_MTBF_HOURS` when no MTBF was given)."""
    breakdown: dict[str, float] = field(default_factory=dict)
    window_source: str = ""
    lost_work_s: dict[str, float | None] = field(default_factory=dict)
    size: StateSize | None = None
    mtbf_hours: float | None = None
    """The mean time between losses without a usable notice behind ``periodic_interval_s``."""
    mtbf_assumed: bool = False
    """True when ``mtbf_hours`` is `DEFAULT_MTBF_HOURS` (not given): the advice is a starting point."""
    tiers: list[dict[str, Any]] | None = None
    """With ``plan(memory_tier=True)``: each tier's predicted emergency save against the window and its periodic
    interval (Young/Daly), durable first (`memory_tier_plan`)."""
    compression: dict[str, Any] | None = None
    """Whether saves would compress here (`preemptible.store.compress.choose`) and its predicted effect; the write
    phase above assumes that choice."""

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["recommendations"] = [asdict(r) for r in self.recommendations]
        doc["size"] = asdict(self.size) if self.size else None
        return doc

    def __repr__(self) -> str:
        verdict = "fits" if self.fits else "does not fit"
        return (
            f"<Plan: {verdict}: {self.state_bytes / 1e9:.2f} GB predicted {self.predicted_save_s:.1f} s in a "
            f"{self.window_s:.0f} s window ({self.margin_s:+.1f} s) at {self.bandwidth_bytes_per_s / 1e9:.2f} GB/s; "
            f"{len(self.recommendations)} recommendation(s); print() it for the table>"
        )

    def __str__(self) -> str:
        return render_plan(self)

    @property
    def summary(self) -> str:
        verdict = "fits" if self.fits else "does NOT fit"
        return (
            f"emergency save of {self.state_bytes / 1e9:.2f} GB predicted {self.predicted_save_s:.1f} s "
            f"in a {self.window_s:.0f} s window: {verdict} ({self.margin_s:+.1f} s)"
        )


def _compression(p: Plan) -> list[str]:
    z = p.compression
    if not z:
        return []
    if z["on"] and z.get("plain_s") is not None and z.get("compressed_s") is not None:
        why = f"ratio {z['ratio']:.2f}: write {z['compressed_s']:.1f} s instead of {z['plain_s']:.1f} s plain"
    else:
        why = z["why"]
    return [f"compression       {'on' if z['on'] else 'off':>10}     ({why})"]


def render_plan(p: Plan, *, color: bool = False) -> str:
    """The plan as ``preemptible plan`` prints it (and ``print(plan)``); ``color``: ANSI colors for a terminal."""

    def c(text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if color else text

    ok = c("FITS", "1;32") if p.fits else c("DOES NOT FIT", "1;31")
    b = p.breakdown
    lines = [
        f"state             {p.state_bytes / 1e9:10.2f} GB"
        + (f"  ({p.size.world_size} ranks)" if p.size and p.size.world_size > 1 else ""),
        f"bandwidth         {p.bandwidth_bytes_per_s / 1e9:10.2f} GB/s  (measured fsync'd write)",
        f"window            {p.window_s:10.0f} s     ({p.window_source})",
        "",
        f"  wait for boundary {b['boundary_s']:8.1f} s",
        f"  write             {b['write_s']:8.1f} s",
        f"  commit            {b['commit_s']:8.1f} s",
        f"  exit              {b['exit_s']:8.1f} s",
        f"predicted save    {p.predicted_save_s:10.1f} s",
        *_compression(p),
        f"margin            {p.margin_s:+10.1f} s",
        f"verdict           {ok}",
    ]
    if p.recommendations:
        lines += ["", "what would change it:"]
        for r in p.recommendations:
            mark = c("fits", "32") if r.fits else c("short", "33")
            lines.append(f"  {r.name:<22} {r.predicted_save_s:8.1f} s  {mark:<5}  {r.description}")
    if p.tiers:
        lines += ["", "tiers (emergency save of one node's share, each against the window):"]
        for t in p.tiers:
            mark = c("fits", "32") if t["fits"] else c("short", "33")
            lines.append(
                f"  {t['tier']:<8} {t['predicted_save_s']:8.1f} s  {mark:<5}  periodic every {t['interval_s']:.0f} s"
                f"  ({t['how']})"
            )
    if p.periodic_interval_s is not None:
        mtbf = f"MTBF {p.mtbf_hours:g} h" + (" assumed: --mtbf HOURS to set it" if p.mtbf_assumed else "")
        lines += ["", f"periodic saves     every {p.periodic_interval_s:.0f} s (Young/Daly, {mtbf})"]
        lost = p.lost_work_s
        lines.append(
            f"expected lost work {lost['with_notice_s'] or 0:.0f} s with a notice, "
            f"{lost['without_notice_s'] or 0:.0f} s without"
        )
    return "\n".join(lines)


ASSUMED_LINK_BYTES_PER_S = 1.25e9
"""A node's link to its peers when not given (10 Gb/s, a common cloud NIC): the memory tier's replica crosses it."""
MEMORY_FIXED_S = 0.05
"""The memory tier's fixed cost per save (agreement, manifests), beside its copies."""


def memory_copy_bandwidth(nbytes: int = 64 << 20) -> float:
    """Bytes per second of one copy in memory on this machine (the memory tier's write into tmpfs is one copy)."""
    src, dst = bytearray(b"\x01" * nbytes), bytearray(nbytes)  # both touched: no page faults in the timing
    view = memoryview(dst)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        view[:] = src
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def memory_tier_plan(
    p: Plan,
    *,
    copy_bytes_per_s: float,
    link_bytes_per_s: float | None,
    replicas: int,
    step_time: float,
    ranks_per_node: int = 1,
) -> list[dict[str, Any]]:
    """The durable root and the memory tier side by side: each one's emergency save of one node's share against
    ``p``'s window, and each one's Young/Daly interval for periodic saves. ``p.size.world_size`` ranks (or 1) run
    ``ranks_per_node`` to a node; a node's ranks copy at once, and its replicas share its link."""
    world = p.size.world_size if p.size else 1
    per_rank = p.state_bytes // world
    nodes = max(1, world // max(1, ranks_per_node))
    copies = min(replicas, nodes - 1)
    nbytes = per_rank * min(ranks_per_node, world)
    link = link_bytes_per_s or ASSUMED_LINK_BYTES_PER_S
    write_s = nbytes / copy_bytes_per_s
    replicate_s = copies * nbytes / min(link, copy_bytes_per_s)
    total = step_time + write_s + replicate_s + MEMORY_FIXED_S + EXIT_S
    mtbf_s = (p.mtbf_hours or DEFAULT_MTBF_HOURS) * 3600
    how = (
        f"{nbytes / 1e9:.2f} GB a node ({nodes} node(s) of {min(ranks_per_node, world)} rank(s)): copy {write_s:.1f} s"
    )
    how += f" at {copy_bytes_per_s / 1e9:.1f} GB/s measured"
    if copies:
        how += f", {copies} replica(s) {replicate_s:.1f} s over a {link / 1e9:.2f} GB/s link"
        how += "" if link_bytes_per_s else " (assumed: --link-bandwidth)"
    else:
        how += ", no replica: one node has no peer"
    return [
        {
            "tier": "durable",
            "predicted_save_s": p.predicted_save_s,
            "fits": p.fits,
            "interval_s": p.periodic_interval_s or 0.0,
            "how": f"{p.bandwidth_bytes_per_s / 1e9:.2f} GB/s",
        },
        {
            "tier": "memory",
            "predicted_save_s": round(total, 3),
            "fits": total <= HEADROOM * p.window_s,
            "interval_s": round(young_daly(write_s + replicate_s + MEMORY_FIXED_S, mtbf_s), 1),
            "how": how,
            "replicas": copies,
            "nodes": nodes,
        },
    ]


def with_memory_tier(
    p: Plan, *, link_bytes_per_s: float | None, replicas: int = 1, step_time: float = 0.0, ranks_per_node: int = 1
) -> Plan:
    """``p`` with its tiers (`memory_tier_plan`) and, when only the memory tier fits, the recommendation to use it."""
    tiers = memory_tier_plan(
        p,
        copy_bytes_per_s=memory_copy_bandwidth(),
        link_bytes_per_s=link_bytes_per_s,
        replicas=replicas,
        step_time=step_time,
        ranks_per_node=ranks_per_node,
    )
    p = dataclasses.replace(p, tiers=tiers, recommendations=list(p.recommendations))
    memory = tiers[1]
    if memory["fits"] and not p.fits:
        every = memory["interval_s"]
        _recommend(
            p.recommendations,
            p.window_s,
            "memory tier",
            f"Run(memory_tier=MemoryTier(...)): on a notice the step lands in this node's memory and "
            f"{memory['replicas']} peer(s) in {memory['predicted_save_s']:.1f} s; the durable save "
            f"({p.predicted_save_s:.1f} s) is then left out (no time), so the durable root lags until its next "
            f"periodic save; memory saves every ~{every:.0f} s, durable ones every ~{p.periodic_interval_s or 0:.0f} s "
            "(Young/Daly)",
            memory["predicted_save_s"],
        )
    return p


def predict(nbytes: int, bw: float, *, step_time: float = 0.0, fixed_s: float = 0.1) -> dict[str, float]:
    """Seconds by phase: waiting for the boundary (one step), writing, committing, exiting."""
    return {"boundary_s": step_time, "write_s": nbytes / bw, "commit_s": fixed_s, "exit_s": EXIT_S}


def young_daly(save_s: float, mtbf_s: float) -> float:
    """Young/Daly optimal interval between periodic checkpoints: sqrt(2 C M), never shorter than a save."""
    return max(math.sqrt(2 * save_s * mtbf_s), save_s)


DEFAULT_MTBF_HOURS = 24.0
"""The mean time between losses without a usable notice (a SIGKILL, an OOM kill, a lost node, a grace period that
ran out) that the Young/Daly advice assumes when none is given (``plan --mtbf``, ``$PREEMPTIBLE_MTBF_HOURS``): one a
day. A notice that is honoured loses nothing; periodic saves bound what the others lose."""

MTBF_ENV = "PREEMPTIBLE_MTBF_HOURS"

ASSUMED_BANDWIDTH = 200e6
"""Bytes per second a run's cadence advice assumes before any save has measured its destination (a network disk
or an object store; a local NVMe disk is faster, so the advice errs towards saving more often)."""


@dataclass(frozen=True)
class CadenceAdvice:
    """What `cadence_advice` finds: the Young/Daly interval for this state, and how the run's cadence compares."""

    advice_s: float
    cadence_s: float | None
    """The run's periodic cadence in seconds (the shortest of its step, time and epoch cadences), None: none."""
    save_s: float
    mtbf_hours: float
    mtbf_assumed: bool
    bandwidth_assumed: bool

    @property
    def off(self) -> bool:
        """No cadence, or one more than 2x away from the advice (either way)."""
        return self.cadence_s is None or not self.advice_s / 2 <= self.cadence_s <= self.advice_s * 2

    def line(self) -> str:
        saved = (
            "no periodic saves: a crash without a notice (SIGKILL, OOM, a lost node) loses every step since the "
            "start or the last checkpoint"
            if self.cadence_s is None
            else f"periodic saves every {self.cadence_s:.0f} s, more than 2x off the advice"
        )
        how = (
            f"Young/Daly for a save of {self.save_s:.1f} s"
            + (" (bandwidth assumed until a save measures it)" if self.bandwidth_assumed else "")
            + f" and an MTBF of {self.mtbf_hours:g} h"
            + (f" (assumed: ${MTBF_ENV} sets it)" if self.mtbf_assumed else "")
        )
        return f"{saved}; advice: save_interval_s={self.advice_s:.0f} ({how})"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "advice_s": round(self.advice_s, 1), "save_s": round(self.save_s, 3)}


def mtbf_from_env() -> tuple[float, bool]:
    """The MTBF for the advice in hours, and whether it is assumed (``$PREEMPTIBLE_MTBF_HOURS`` unset)."""
    raw = os.environ.get(MTBF_ENV, "").strip()
    if not raw:
        return DEFAULT_MTBF_HOURS, True
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ValueError(f"expected ${MTBF_ENV} to be a number of hours > 0, found {raw!r}; unset it or fix it")
    return value, False


def cadence_advice(
    *,
    state_bytes: int,
    bandwidth: float | None,
    fixed_s: float = 0.1,
    cadence_s: float | None,
    mtbf_hours: float | None = None,
) -> CadenceAdvice:
    """The Young/Daly interval for a state of ``state_bytes`` saved at ``bandwidth`` (None: `ASSUMED_BANDWIDTH`),
    against a run's cadence of ``cadence_s`` seconds (None: no periodic saves)."""
    assumed = mtbf_hours is None
    if mtbf_hours is None:
        mtbf_hours, assumed = mtbf_from_env()
    bw = bandwidth if bandwidth and bandwidth > 0 else ASSUMED_BANDWIDTH
    save_s = state_bytes / bw + fixed_s
    return CadenceAdvice(
        advice_s=young_daly(save_s, mtbf_hours * 3600),
        cadence_s=cadence_s,
        save_s=save_s,
        mtbf_hours=mtbf_hours,
        mtbf_assumed=assumed,
        bandwidth_assumed=not bandwidth,
    )


def evaluate(
    *,
    state_bytes: int | None = None,
    size: StateSize | None = None,
    bandwidth: float | Bandwidth,
    window: float | None = None,
    platform: str | None = None,
    step_time: float = 0.0,
    mtbf_hours: float | None = None,
    world_size: int = 1,
    compression: compress.Measured | None = None,
    compress_setting: bool | str = "auto",
    object_store: bool = False,
    threads: int = 2,
    cores: int | None = None,
) -> Plan:
    """Verdict and recommendations for an emergency save (pure: give it measured numbers).

    Args:
        state_bytes: exact bytes (from a live state), per rank; or ``size`` to compute them.
        bandwidth: bytes per second of the destination (a number, or a `Bandwidth` from `probe`).
        window, platform: the notice window, given or from the platform.
        step_time: seconds per training step (the notice can arrive just after a boundary).
        mtbf_hours: mean time between losses without a usable notice, for the Young/Daly interval and the lost
            work; None: ``$PREEMPTIBLE_MTBF_HOURS``, else `DEFAULT_MTBF_HOURS`, marked assumed.
        world_size: ranks that stripe the state (used with ``state_bytes``; ``size`` carries its own).
        compression: the state's measured compression (`measure_compression`): with it, the write phase is
            predicted as a save would choose to write (``compress_setting``, default auto), on ``threads`` writer
            threads and ``cores`` cores.
    """
    bw, fixed = _bandwidth(bandwidth)
    nbytes, world = _per_rank(size, state_bytes, world_size)
    win, source = window_for(platform, window)
    phases = predict(nbytes, bw, step_time=step_time, fixed_s=fixed)
    from preemptible.store import compress  # torch and NumPy: only when a plan is made

    choice = compress.choose(
        nbytes,
        setting=compress_setting,
        measured=compression,
        bandwidth=bw,
        threads=threads,
        cores=cores or os.cpu_count() or 1,
        background=False,
        object_store=object_store,
    )
    if choice.on and choice.compressed_s is not None:
        phases["write_s"] = choice.compressed_s
    total = sum(phases.values())
    fits = total <= HEADROOM * win
    recs = _recommendations(size, nbytes, world, bw, fixed, step_time=step_time, win=win, total=total)
    if fits and total <= HEADROOM * win / 2:
        recs.clear()  # fits with a wide margin: nothing to change (striping, bf16 moments would be noise)
    mtbf_assumed = False
    if mtbf_hours is None:
        mtbf_hours, mtbf_assumed = mtbf_from_env()
    periodic = young_daly(nbytes / bw + fixed, mtbf_hours * 3600)
    lost: dict[str, float | None] = {"with_notice_s": 0.0 if fits else periodic / 2, "without_notice_s": periodic / 2}
    if not fits:
        _recommend(
            recs,
            win,
            "save more often",
            f"periodic saves every {periodic:.0f} s (Young/Daly for an MTBF of {mtbf_hours:g} h"
            f"{', assumed' if mtbf_assumed else ''}) bound what a failed emergency save loses to "
            f"{periodic / 2:.0f} s on average",
            total,
        )
    return Plan(
        state_bytes=nbytes * world,
        bandwidth_bytes_per_s=bw,
        predicted_save_s=round(total, 3),
        window_s=win,
        margin_s=round(win - total, 3),
        fits=fits,
        recommendations=recs,
        periodic_interval_s=round(periodic, 1),
        mtbf_hours=mtbf_hours,
        mtbf_assumed=mtbf_assumed,
        breakdown={k: round(v, 3) for k, v in phases.items()},
        window_source=source,
        lost_work_s=lost,
        size=size,
        compression=choice.to_json(),
    )


def _bandwidth(bandwidth: float | Bandwidth) -> tuple[float, float]:
    """Bytes per second and the fixed seconds of a commit, from a number or a `Bandwidth`."""
    if isinstance(bandwidth, Bandwidth):
        bw, fixed = bandwidth.bytes_per_s, bandwidth.fixed_s
    else:
        bw, fixed = float(bandwidth), 0.1
    if bw <= 0:
        raise ValueError(f"expected a bandwidth > 0 bytes/s, found {bw}")
    return bw, fixed


def _per_rank(size: StateSize | None, state_bytes: int | None, world_size: int) -> tuple[int, int]:
    """Bytes each rank writes, and the ranks."""
    if size is not None:
        return size.bytes_per_rank, size.world_size
    if state_bytes is not None:
        return math.ceil(state_bytes / world_size), world_size
    raise ValueError("expected state_bytes or size")


def _recommend(recs: list[Recommendation], win: float, name: str, description: str, new_total: float) -> None:
    recs.append(
        Recommendation(
            name=name,
            description=description,
            predicted_save_s=round(new_total, 2),
            fits=new_total <= HEADROOM * win,
        )
    )


def _recommendations(
    size: StateSize | None,
    nbytes: int,
    world: int,
    bw: float,
    fixed: float,
    *,
    step_time: float,
    win: float,
    total: float,
) -> list[Recommendation]:
    """What would change the verdict: smaller moments, more ranks, a pre-staged buffer, faster storage."""
    recs: list[Recommendation] = []
    base_bytes = nbytes * world
    budget_write = HEADROOM * win - step_time - fixed - EXIT_S
    if size is not None and size.optimizer in ("adam", "adamw") and not size.bf16_moments:
        smaller = StateSize(
            params=size.params,
            optimizer=size.optimizer,
            dtype=size.dtype,
            bf16_moments=True,
            world_size=size.world_size,
        )
        t = sum(predict(smaller.bytes_per_rank, bw, step_time=step_time, fixed_s=fixed).values())
        _recommend(
            recs,
            win,
            "bf16 moments",
            f"Run(bf16_moments=True): optimizer moments in bfloat16, state "
            f"{smaller.bytes / 1e9:.1f} GB instead of {size.bytes / 1e9:.1f} GB (lossy)",
            t,
        )
    if budget_write > 0:
        ranks = max(world * 2, math.ceil(base_bytes / bw / budget_write))
        t = sum(predict(math.ceil(base_bytes / ranks), bw, step_time=step_time, fixed_s=fixed).values())
        _recommend(
            recs,
            win,
            "stripe across ranks",
            f"save from {ranks} data-parallel ranks, each writing 1/{ranks} of the state "
            "(needs that much aggregate bandwidth: separate disks or a parallel file system)",
            t,
        )
    if step_time > 0:
        t = nbytes / bw + fixed + EXIT_S
        _recommend(
            recs,
            win,
            "pre-staged buffer",
            f"Run(prestage_every=K): flush a state at most K-1 steps old without waiting "
            f"{step_time:.1f} s for the step in progress",
            t,
        )
    if budget_write > 0:
        need = nbytes / budget_write
        if need > bw:
            _recommend(
                recs,
                win,
                "faster storage",
                f"storage writing at {need / 1e9:.2f} GB/s or more (this one: {bw / 1e9:.2f} GB/s), "
                "e.g. a local NVMe or more throughput on the volume",
                HEADROOM * win,
            )
    else:
        _recommend(
            recs,
            win,
            "shorter steps or a longer window",
            f"the step alone ({step_time:.1f} s) and fixed costs use the whole {win:.0f} s window",
            total,
        )
    return recs


def plan(
    root: str | os.PathLike[str] | None = None,
    *,
    state: Any = None,
    params: float | None = None,
    optimizer: str = "adamw",
    dtype: str = "fp32",
    bf16_moments: bool = False,
    world_size: int = 1,
    window: float | None = None,
    platform: str | None = None,
    step_time: float = 0.0,
    mtbf_hours: float | None = None,
    bandwidth: float | None = None,
    probe_bytes: int = DEFAULT_PROBE_BYTES,
    compress: bool | str = "auto",
    compress_setting: bool | str | None = None,
) -> Plan:
    """Will this state's emergency checkpoint fit in this window on this storage?

    Args:
        root: where checkpoints will go; its bandwidth is measured with a short fsync'd probe (cleaned up),
            unless ``bandwidth`` (bytes/s) is given.
        state: a live `Run` or mapping of stateful objects (exact bytes); or describe it with ``params``,
            ``optimizer`` (adamw, adam, sgd, none), ``dtype`` (fp32, bf16, fp16) and ``bf16_moments``.
        world_size: data-parallel ranks striping the save.
        window: the notice window in seconds.
        platform: the platform whose window applies when ``window`` is not given (aws 120, gcp 30, azure 30,
            gke 15, k8s 30, slurm 60).
        step_time: seconds per step (the notice can land just after a boundary).
        mtbf_hours: mean time between preemptions, for the Young/Daly periodic interval.
        bandwidth: the destination's bytes per second, instead of measuring ``root``.
        probe_bytes: bytes the bandwidth probe writes under ``root`` (removed afterwards).
        compress: as `Run`'s ``compress``: the plan measures this state's compression on this CPU and
            predicts the save as it would be written.
        compress_setting: the old name of ``compress`` (deprecated: it warns, and goes in a later release).

    Returns:
        A `Plan`: ``fits``, ``predicted_save_s``, ``margin_s``, ``recommendations``, ``periodic_interval_s``...

    Raises:
        ValueError: neither ``state`` nor ``params`` given, an unknown ``optimizer``, ``dtype`` or ``platform``, or
            a window that is not positive.

    Examples:
        >>> from preemptible import plan
        >>> plan(params=7e9, platform="gcp", bandwidth=1e9).fits  # 7 B parameters in 30 s at 1 GB/s: no
        False
        >>> plan(params=7e9, platform="gcp", bandwidth=1e9, bf16_moments=True, world_size=8).fits
        True
    """
    if compress_setting is not None:
        warnings.warn(
            "plan(compress_setting=...) is deprecated: pass compress=..., as to Run", DeprecationWarning, stacklevel=2
        )
        compress = compress_setting
    from preemptible.store.compress import check_setting  # torch: not at import (`preemptible run` loads budget)

    compress = check_setting(compress)
    if bandwidth is None:
        if root is None:
            raise ValueError("plan() needs root (to measure its bandwidth) or bandwidth= in bytes per second")
        bw: float | Bandwidth = probe(root, nbytes=probe_bytes)
    else:
        bw = bandwidth
    object_store = root is not None and is_url(root)
    if state is not None:
        if bf16_moments:
            raise ValueError("with a live state, bf16_moments is read from the state; pass params= to describe one")
        return evaluate(
            compression=measure_compression(state=state) if compress is not False else None,
            compress_setting=compress,
            object_store=object_store,
            state_bytes=live_bytes(state),
            bandwidth=bw,
            window=window,
            platform=platform,
            step_time=step_time,
            mtbf_hours=mtbf_hours,
            world_size=world_size,
        )
    if params is None:
        raise ValueError("plan() needs state= (a Run or stateful objects) or params= (a parameter count)")
    size = StateSize(params=params, optimizer=optimizer, dtype=dtype, bf16_moments=bf16_moments, world_size=world_size)
    return evaluate(
        compression=measure_compression(size=size) if compress is not False else None,
        compress_setting=compress,
        object_store=object_store,
        size=size,
        bandwidth=bw,
        window=window,
        platform=platform,
        step_time=step_time,
        mtbf_hours=mtbf_hours,
    )


def advise(
    step: int, *, state_bytes: int, bandwidth: float, platform: Any, step_time: float, journal: Any, rank: int = 0
) -> Plan | None:
    """After a run's first save: will its emergency save fit this platform's window? Journals the verdict and
    logs one line (a warning with the best fix when it would not fit)."""
    import logging

    log = logging.getLogger("preemptible")
    if not 0 < platform.window_s < math.inf:  # grace 0: no time is promised, so there is nothing to fit into
        log.info(
            "[rank=%d] plan: no notice window is promised here (%s s); saves are best effort", rank, platform.window_s
        )
        return None
    verdict = evaluate(state_bytes=state_bytes, bandwidth=bandwidth, window=platform.window_s, step_time=step_time)
    journal.event(Event.PLAN, step, platform=platform.name, **verdict.to_json())
    where = f"{platform.name} window {verdict.window_s:.0f} s"
    if verdict.fits:
        if rank == 0:
            log.info("[rank=%d] plan: %s (%s)", rank, verdict.summary, where)
        return verdict
    fixes = [r for r in verdict.recommendations if r.fits] or verdict.recommendations
    fix = f"; to make it fit: {fixes[0].description} ({fixes[0].predicted_save_s:.1f} s)" if fixes else ""
    log.warning("[rank=%d] plan: %s (%s)%s", rank, verdict.summary, where, fix)
    return verdict
