"""Checkpoint benchmarks: preemptible beside torch.save, torch.distributed.checkpoint and safetensors, and beside
the machine's own limits (fsync'd write and read of the same bytes, memcpy into reused buffers).

Every contender runs once per round, rounds are interleaved (the machine's drift hits all alike), medians are
reported with ratios. Nothing here is a pass/fail gate: it measures. ``preemptible bench`` and the scripts in
``benchmarks/`` run these scenarios.
"""

from __future__ import annotations

import gc
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from preemptible.checkpoint.checkpointer import Checkpointer
from preemptible.events import SaveReason
from preemptible.state import apply, capture, flatten
from preemptible.store.io import LocalStorage


# state ----------------------------------------------------------------------------------------------------------
def large_state(params: float = 100e6, side: int = 4096) -> dict[str, Any]:
    """A model of about ``params`` parameters with AdamW state (fp32: ~12 bytes per parameter)."""
    layers = max(1, round(params / (side * side)))
    model = torch.nn.Sequential(*[torch.nn.Linear(side, side, bias=False) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3  # random moments: no compressible pages flattering any writer
    opt.step()
    opt.zero_grad(set_to_none=True)
    return {"model": model, "optimizer": opt}


def small_state(count: int = 10_000, total_bytes: float = 120e6) -> dict[str, Any]:
    """About ``count`` tensors: ``count / 4`` small parameters, each with AdamW's step, exp_avg and exp_avg_sq."""
    n = max(1, count // 4)
    per = max(1, int(total_bytes / 12 / n))
    params = [torch.nn.Parameter(torch.randn(per)) for _ in range(n)]
    model = torch.nn.ParameterList(params)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    opt.zero_grad(set_to_none=True)
    return {"model": model, "optimizer": opt}


def plain(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.state_dict() for k, v in state.items()}


def flat_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in flatten(capture(state)).tensors.items()}


def _dcp() -> Any:
    """torch.distributed.checkpoint, typed loosely (its package does not re-export its names for mypy)."""
    import torch.distributed.checkpoint as dcp

    return dcp


# measuring ------------------------------------------------------------------------------------------------------
class PeakRSS:
    """Samples resident memory in a thread; ``peak`` is the highest value above the start, in bytes."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self.base = self.peak = 0
        self._thread = threading.Thread(target=self._run, name="preemptible-bench-rss", daemon=True)

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.rss() - self.base)

    def __enter__(self) -> PeakRSS:
        self.base = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss() - self.base)


def fsync_path(path: str) -> None:
    for root, _, files in os.walk(path) if os.path.isdir(path) else [(os.path.dirname(path), [], [path])]:
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def drop_cache(path: str) -> None:
    """Evict a file's (or a tree's) clean pages from the page cache, for cold reads."""
    walk = os.walk(path) if os.path.isdir(path) else [(os.path.dirname(path), [], [os.path.basename(path)])]
    for root, _, files in walk:
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def raw_write(path: str, views: list[memoryview], block: int = 64 << 20) -> None:
    """The fsync'd write ceiling: the very same bytes, one file, large sequential writes, one thread."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for view in views:
            for start in range(0, len(view), block):
                piece = view[start : start + block]
                while piece:
                    piece = piece[os.write(fd, piece) :]
        os.fsync(fd)
    finally:
        os.close(fd)


_READ_BUFFERS: dict[int, memoryview] = {}


def raw_read(path: str, block: int = 8 << 20) -> None:
    """Read a file through one reused buffer (a fresh buffer per call would time page faults, not reads)."""
    buf = _READ_BUFFERS.get(block)
    if buf is None:
        buf = _READ_BUFFERS[block] = memoryview(bytearray(block))
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def train_steps(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    *,
    seconds: float = 0.0,
    until: Callable[[], bool] | None = None,
) -> list[float]:
    """Training steps' wall times: steps for ``seconds``, or until ``until()`` is true after one (at least one)."""
    clock = time.perf_counter
    end = clock() + seconds
    times: list[float] = []
    while True:
        t = clock()
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        now = clock()
        times.append(now - t)
        if until() if until is not None else now >= end:
            return times


@dataclass
class Sample:
    seconds: float
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class Result:
    name: str
    nbytes: int
    samples: list[Sample] = field(default_factory=list)

    def median(self, key: str = "seconds") -> float:
        values = [
            s.seconds if key == "seconds" else s.extra[key] for s in self.samples if key == "seconds" or key in s.extra
        ]
        return statistics.median(values) if values else float("nan")


Contender = Callable[[str], Sample]


WARM_SAVES = 3
"""Emergency saves after a periodic one timed per sample (`contenders`): their median is the sample."""

WARM_READS = 3
"""Warm restores, and the warm reads and ``load_state_dict`` calls they are held against, timed per sample
(`contenders`): their median is the sample. One takes about 0.1 s here and varies by a third from one to the next
(ten pairs of the large state's warm restore and read into memory, back to back: ratios 0.57 to 0.84)."""


def median_of(fn: Contender, times: int) -> Contender:
    """A contender whose sample is the median (by seconds) of ``times`` samples of ``fn`` in a row."""

    def run(work: str) -> Sample:
        samples = sorted((fn(work) for _ in range(times)), key=lambda s: s.seconds)
        return samples[len(samples) // 2]

    return run


def contenders(
    state: dict[str, Any], nbytes: int, *, quick: bool = False, same_bytes: dict[str, Any] | None = None
) -> dict[str, Contender]:
    """The same bytes written, read and copied by every contender; ``name -> fn(workdir) -> Sample``.

    ``same_bytes``: a state of the same bytes in a few large tensors (for a state of many small ones): its emergency
    saves, cold and after a periodic save, are the reference for the small tensors' throughput."""
    sd = plain(state)
    tensors = flat_tensors(state)
    mirror = {k: torch.empty_like(v) for k, v in tensors.items()}  # reused memcpy destinations
    for k, v in tensors.items():
        mirror[k].copy_(v)
    ours_async: dict[str, Any] = {"ck": None, "step": 1}

    def ours_emergency(work: str) -> Sample:
        d = os.path.join(work, "ours")
        with PeakRSS() as mem:
            t = time.perf_counter()
            result = Checkpointer(d).save(state, 1, reason=SaveReason.EMERGENCY).wait()
            s = time.perf_counter() - t
        assert not result.skipped
        shutil.rmtree(d)
        return Sample(s, {"peak_mb": mem.peak / 1e6})

    def emergency_of(what: dict[str, Any], *, warm: bool, prepared: bool = False) -> Contender:
        """An emergency save of ``what``; ``warm``: after a periodic save of it by the same `Checkpointer`, as in a
        training run, whose plan it refills (`preemptible.checkpoint.steady`); ``prepared``: the first save of a
        `Checkpointer` that only prepared it, as a `Run` with background saves does after its first step
        (`Checkpointer.prepare`, its arena laid out). A warm or prepared sample is the median of `WARM_SAVES` such
        saves: one save of 0.1 s on this disk varies by half from one to the next, and these samples are compared
        in pairs (many small tensors vs the same bytes in a few)."""

        def fn(work: str) -> Sample:
            d = os.path.join(work, "ours-warm")
            ck = Checkpointer(d, keep=2)
            if warm:
                ck.save(what, 1, blocking=False).wait()
            times = []
            with PeakRSS() as mem:
                for step in range(2, 2 + (WARM_SAVES if warm or prepared else 1)):
                    if prepared:
                        ck = Checkpointer(os.path.join(d, str(step)))
                        ck.prepare(what, arena=True)
                    t = time.perf_counter()
                    result = ck.save(what, step, reason=SaveReason.EMERGENCY).wait()  # no rotation, as in a Run
                    times.append(time.perf_counter() - t)
                    assert not result.skipped
            shutil.rmtree(d)
            return Sample(statistics.median(times), {"peak_mb": mem.peak / 1e6})

        return fn

    flat_src = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors.values()])
    flat_dst = torch.empty_like(flat_src)

    def ceiling_memcpy_one(work: str) -> Sample:
        t = time.perf_counter()
        flat_dst.copy_(flat_src)
        return Sample(time.perf_counter() - t)

    def ours_async_save(work: str) -> Sample:
        d = os.path.join(work, "ours-async")
        ck = ours_async["ck"]
        if ck is None or ck.root != os.path.abspath(d):
            ck = Checkpointer(d, keep=2)
            ours_async["ck"] = ck
            ours_async["step"] = 1
            ck.save(state, 1, blocking=False).wait()  # warm the staging arena once, as a training run does
        step = ours_async["step"] = ours_async["step"] + 1
        with PeakRSS() as mem:
            t = time.perf_counter()
            handle = ck.save(state, step, blocking=False)
            stall = time.perf_counter() - t
            handle.wait()
            total = time.perf_counter() - t
        return Sample(total, {"stall": stall, "peak_mb": mem.peak / 1e6})

    def ours_restore(work: str, cold: bool) -> Sample:
        d = os.path.join(work, "ours-restore")
        if not os.path.exists(d):
            Checkpointer(d).save(state, 1)
        if cold:
            drop_cache(d)
        else:
            raw_read_tree(d)
        t = time.perf_counter()
        Checkpointer(d).restore(state)
        return Sample(time.perf_counter() - t)

    def torch_restore(work: str) -> Sample:
        p = os.path.join(work, "torch-restore.pt")
        if not os.path.exists(p):
            torch.save(sd, p)
        raw_read(p)
        t = time.perf_counter()
        loaded = torch.load(p, weights_only=True)
        for k, obj in state.items():
            obj.load_state_dict(loaded[k])
        return Sample(time.perf_counter() - t)

    def load_state_dict_alone(work: str) -> Sample:
        """torch's own part of any restore that goes through ``load_state_dict``: the state's own state dicts
        loaded back (the optimizer's walks every value in Python)."""
        own = plain(state)
        t = time.perf_counter()
        for k, obj in state.items():
            obj.load_state_dict(own[k])
        return Sample(time.perf_counter() - t)

    def load_state_dict_as_restored(work: str) -> Sample:
        """The same, as a restore calls it (`preemptible.state.apply`: the optimizer is handed parameter ids it
        finds in constant time, and a module whose tensors were read in place is not loaded again): the part of a
        restore that is torch's own code."""
        own = plain(state)
        t = time.perf_counter()
        apply(state, own, live=own)
        return Sample(time.perf_counter() - t)

    def torch_save(work: str) -> Sample:
        p = os.path.join(work, "torch.pt")
        with PeakRSS() as mem:
            t = time.perf_counter()
            torch.save(sd, p)
            fsync_path(p)
            s = time.perf_counter() - t
        os.remove(p)
        return Sample(s, {"peak_mb": mem.peak / 1e6})

    def dcp_save(threads: int) -> Contender:
        def run(work: str) -> Sample:
            dcp = _dcp()
            d = os.path.join(work, f"dcp{threads}")
            with warnings.catch_warnings(), PeakRSS() as mem:
                warnings.simplefilter("ignore")
                t = time.perf_counter()
                dcp.save(sd, storage_writer=dcp.FileSystemWriter(d, thread_count=threads, sync_files=True))
                s = time.perf_counter() - t
            shutil.rmtree(d)
            return Sample(s, {"peak_mb": mem.peak / 1e6})

        return run

    def dcp_async(work: str) -> Sample:
        dcp = _dcp()
        d = os.path.join(work, "dcp-async")
        with warnings.catch_warnings(), PeakRSS() as mem:
            warnings.simplefilter("ignore")
            t = time.perf_counter()
            fut = dcp.async_save(sd, storage_writer=dcp.FileSystemWriter(d, thread_count=1, sync_files=True))
            stall = time.perf_counter() - t
            fut.result()
            total = time.perf_counter() - t
        shutil.rmtree(d)
        return Sample(total, {"stall": stall, "peak_mb": mem.peak / 1e6})

    def safetensors_save(work: str) -> Sample:
        from safetensors.torch import save_file

        p = os.path.join(work, "st.safetensors")
        with PeakRSS() as mem:
            t = time.perf_counter()
            save_file(tensors, p)
            fsync_path(p)
            s = time.perf_counter() - t
        os.remove(p)
        return Sample(s, {"peak_mb": mem.peak / 1e6})

    from preemptible.store import checksum
    from preemptible.store import format as tensor_format

    views = [tensor_format.byte_view(v) for v in tensors.values()]

    def ceiling_write(work: str) -> Sample:
        p = os.path.join(work, "raw.bin")
        t = time.perf_counter()
        raw_write(p, views)
        return Sample(time.perf_counter() - t)

    def ceiling_direct(work: str) -> Sample:
        from preemptible.store import direct

        p = os.path.join(work, "raw-direct.bin")
        fd = direct.open_direct(p)
        if fd is None:
            return Sample(float("nan"))
        t = time.perf_counter()
        writer = direct.DirectWriter(p, fd)
        for view in views:
            writer.write(view)
        writer.close()
        s = time.perf_counter() - t
        os.remove(p)
        return Sample(s)

    def ceiling_read(work: str, cold: bool) -> Sample:
        p = os.path.join(work, "raw.bin")
        if not os.path.exists(p):
            raw_write(p, views)
        if cold:
            drop_cache(p)
        else:
            raw_read(p)
        t = time.perf_counter()
        raw_read(p)
        return Sample(time.perf_counter() - t)

    # Reused, and touched once here: a restore reads into the state's memory, whose pages exist already.
    read_into = torch.zeros(max(1, nbytes), dtype=torch.uint8)

    def ceiling_read_into(work: str, hashed: bool = False) -> Sample:
        """The least a warm restore must do: read the bytes into memory the size of the state, on as many threads
        as a restore reads with (2), split evenly between them, in reads of a restore's size (an 8 MiB buffer
        reused for the whole file stays in the CPU's cache, which no restore can). ``hashed``: and hash each read
        with the checkpoint checksum while it is in the cache, the least a restore that verifies what it reads
        must do."""
        p = os.path.join(work, "raw.bin")
        if not os.path.exists(p):
            raw_write(p, views)
        raw_read(p)
        size = os.path.getsize(p)
        half = size // 2 - (size // 2) % 4096
        dest = memoryview(read_into.numpy())  # type: ignore[arg-type]
        piece = tensor_format.READ_CHUNK_BYTES

        def part(lo: int, hi: int) -> None:
            hasher = checksum.new() if hashed else None
            with open(p, "rb", buffering=0) as f:
                f.seek(lo)
                pos = lo
                while pos < hi:
                    view = dest[pos : min(pos + piece, hi)]
                    k = f.readinto(view)
                    if not k:
                        break
                    if hasher is not None:
                        hasher.update(view[:k])
                    pos += k

        t = time.perf_counter()
        threads = [threading.Thread(target=part, args=span) for span in ((0, half), (half, size))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return Sample(time.perf_counter() - t)

    def ceiling_memcpy(work: str) -> Sample:
        t = time.perf_counter()
        for k, v in tensors.items():
            mirror[k].copy_(v)
        return Sample(time.perf_counter() - t)

    # IMPORTANT: each ratio's two sides run back to back in a round (the report takes the median of each round's
    # ratio): this machine's speed drifts by more than the gaps measured over the minute a round takes.
    out: dict[str, Contender] = {"preemptible emergency save": ours_emergency}
    if same_bytes is not None:
        out["emergency save, the same bytes in a few tensors"] = emergency_of(same_bytes, warm=False)
    out["ceiling: fsync'd write"] = ceiling_write
    out["ceiling: O_DIRECT write"] = ceiling_direct
    out["preemptible emergency save (after a periodic save)"] = emergency_of(state, warm=True)
    if same_bytes is not None:
        out["... after a periodic save"] = emergency_of(same_bytes, warm=True)
        out["preemptible emergency save (prepared, as a run's first)"] = emergency_of(state, warm=False, prepared=True)
        out["... prepared, as a run's first"] = emergency_of(same_bytes, warm=False, prepared=True)
    out |= {
        "preemptible async save": ours_async_save,
        "ceiling: memcpy into reused buffers": ceiling_memcpy,
        "ceiling: memcpy into one buffer": ceiling_memcpy_one,
        "preemptible restore (warm)": median_of(lambda w: ours_restore(w, cold=False), WARM_READS),
        "ceiling: read into the state's memory (warm)": median_of(ceiling_read_into, WARM_READS),
        "ceiling: read and hash into the state's memory (warm)": median_of(
            lambda w: ceiling_read_into(w, hashed=True), WARM_READS
        ),
        "ceiling: read (warm)": median_of(lambda w: ceiling_read(w, cold=False), WARM_READS),
        "load_state_dict as a restore calls it": median_of(load_state_dict_as_restored, WARM_READS),
        "preemptible restore (cold)": lambda w: ours_restore(w, cold=True),
        "ceiling: read (cold)": lambda w: ceiling_read(w, cold=True),
        "torch.load + load_state_dict (warm)": torch_restore,
        "load_state_dict alone": median_of(load_state_dict_alone, WARM_READS),
        "torch.save": torch_save,
        "dcp.save thread_count=1": dcp_save(1),
        "dcp.save thread_count=2": dcp_save(2),
        "dcp.async_save": dcp_async,
        "safetensors save_file": safetensors_save,
    }
    if quick:
        for name in ("dcp.save thread_count=2", "ceiling: read (cold)", "preemptible restore (cold)"):
            out.pop(name)
    return out


def raw_read_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            raw_read(os.path.join(root, name))


def checksum_share(state: dict[str, Any], save_seconds: float) -> float:
    """Seconds to hash every tensor byte with the checkpoint checksum, in the pieces the writer hashes (small
    tensors gathered), as a fraction of the save."""
    from preemptible.store import checksum
    from preemptible.store import format as tensor_format

    items = list(flatten(capture(state)).tensors.items())
    entries = tensor_format.layout(items)
    pieces = [bytes(p) for p in tensor_format._tensor_pieces(entries, dict(items), tensor_format.CHUNK_BYTES)]
    h = checksum.new()
    t = time.perf_counter()
    for piece in pieces:  # the pieces the writer hashes, small tensors gathered
        h.update(piece)
    return (time.perf_counter() - t) / save_seconds


CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times() -> dict[str, float]:
    """Machine-wide CPU seconds by kind (/proc/stat). The background writer runs at nice 10, so its user time shows
    as ``nice``: training's is ``user``, the kernel's work for the save ``system``/``softirq``. ``process``: this
    process's own (training and the save's threads, without a store or proxy running in a process of its own)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:9]
    except OSError:  # pragma: no cover - not Linux
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return {name: int(v) / tick for name, v in zip(CPU_FIELDS, fields, strict=False)} | {
        "process": own.user + own.system
    }


def training_beside(
    state: dict[str, Any],
    *,
    seconds: float = 3.0,
    threads: int = 2,
    rounds: int = 7,
    rate: float | None = None,
    dcp: bool = True,
    dcp_rounds: int = 3,
    verify: bool = False,
    url: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Extra wall time of a real training loop while a background save runs: ours vs dcp.async_save.

    A separate small training job (its own model, ``threads`` torch threads) trains for ``seconds`` alone, then for
    as long as a background save of ``state`` runs, then ``seconds`` alone again. The save's cost is the steps'
    time beside it less as many steps at the mean step time of the windows alone just before and after it: a
    baseline taken around each save, since this machine's speed drifts by more than the effect between windows
    seconds apart. Single rounds here spread from -0.1 s to 1.8 s around a median of 0.2-0.5 s, so the median takes
    ``rounds`` of them (7: a full run's three took any side of 0.3 s). The first ``dcp_rounds`` alternate ours and
    dcp (whose cost is measured for comparison, not held to a line). Medians are reported, with ``noise_s``, what
    the same sum gives when the window before stands for the one after (how far the baseline itself moved).
    ``rate`` (bytes/s) paces our destination (`PacedStorage`). ``verify``: each save is read back and checked
    before it commits, as a `Run` (``keep=2``) does for every save that frees older checkpoints (there, after the
    commit). The breakdown is machine-wide CPU seconds by kind beside our save, less the same time's share of the CPU
    spent alone just before it: ``nice`` is the writer thread (it runs at nice 10), ``system`` and ``softirq`` the
    kernel's work for it. ``url``: save to this object store root instead (``s3://...``, with ``storage_options``;
    no dcp there), each checkpoint removed after its round.
    """
    from preemptible.store.paced import PacedStorage

    dcp_mod = _dcp() if dcp else None
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(256, 1024)
        train_steps(model, opt, x, seconds=0.5)  # warm
        work = tempfile.mkdtemp(prefix="bench-beside-", dir=os.environ.get("PREEMPTIBLE_BENCH_DIR"))
        try:
            if url is not None:
                ck = Checkpointer(url, storage_options=storage_options, keep=100, verify_after_save=verify)
            else:
                root = os.path.join(work, "ours")
                local = LocalStorage(root)
                storage: Any = PacedStorage(local, rate) if rate else local
                ck = Checkpointer(root, storage=storage, keep=100, verify_after_save=verify)
            ck.save(state, 1, blocking=False).wait()  # warm staging
            sd = plain(state)
            figures: dict[str, list[tuple[float, float, float, int, float]]] = {"ours": [], "dcp": []}
            extra_cpu: list[dict[str, float]] = []

            def beside(name: str, start: Callable[[], Any], finish: Callable[[Any], object]) -> None:
                """Train alone, beside the job ``start()`` returns (anything with ``done()``), alone again."""
                c0 = cpu_times()
                before = train_steps(model, opt, x, seconds=seconds)
                c1 = cpu_times()
                job = start()
                t = time.perf_counter()
                during = train_steps(model, opt, x, until=job.done)
                window = time.perf_counter() - t
                c2 = cpu_times()
                finish(job)
                after = train_steps(model, opt, x, seconds=seconds)
                alone = statistics.fmean(before + after)
                moved = statistics.fmean(before) - statistics.fmean(after)
                figures[name].append(
                    (sum(during) - len(during) * alone, abs(moved) * len(during), window, len(during), alone)
                )
                if name == "ours":
                    share = window / max(sum(before), 1e-9)
                    extra_cpu.append({k: (c2[k] - c1[k]) - (c1[k] - c0[k]) * share for k in c0})

            def dcp_async(d: str) -> Any:
                assert dcp_mod is not None
                return dcp_mod.async_save(sd, storage_writer=dcp_mod.FileSystemWriter(d))

            def ours_done(handle: Any) -> None:
                handle.wait()
                ck.storage.remove_tree(ck.path_of(handle.step))

            def dcp_done(d: str, future: Any) -> None:
                future.result()
                shutil.rmtree(d, ignore_errors=True)

            for r in range(rounds):
                beside("ours", partial(ck.save, state, 2 + r, blocking=False), ours_done)
                if dcp_mod is not None and url is None and r < dcp_rounds:
                    d = os.path.join(work, f"dcp{r}")
                    with warnings.catch_warnings():  # its warnings about running without a process group
                        warnings.simplefilter("ignore")
                        beside("dcp", partial(dcp_async, d), partial(dcp_done, d))

            if url is not None:  # the warm-up save, the journal: nothing left in the store
                ck.storage.remove_tree(ck.root)

            def median(name: str, i: int) -> float:
                return statistics.median(f[i] for f in figures[name]) if figures[name] else float("nan")

            return {
                "extra_ours_s": median("ours", 0),
                "extra_dcp_async_s": median("dcp", 0),
                "noise_s": median("ours", 1),
                "save_window_s": median("ours", 2),
                "steps_beside": median("ours", 3),
                "step_alone_ms": median("ours", 4) * 1e3,
                "extra_each_s": [round(f[0], 3) for f in figures["ours"]],
                "cpu_beside_ours_s": {
                    k: round(statistics.median(d[k] for d in extra_cpu), 3) for k in (*CPU_FIELDS, "process")
                },
                "rate_mb_s": rate / 1e6 if rate else None,
                "verify": verify,
                "url": url,
            }
        finally:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        torch.set_num_threads(old)


def _bar(total: int, what: str) -> Any:
    """A tqdm bar on stderr when it is a terminal, else None."""
    from preemptible.progress import on_terminal

    if not on_terminal():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=what, unit="run", leave=False, file=sys.stderr)


def run_scenario(
    name: str,
    state: dict[str, Any],
    *,
    rounds: int = 3,
    quick: bool = False,
    work_dir: str | None = None,
    log: Callable[[str], None] = print,
    same_bytes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    nbytes = flatten(capture(state)).tensor_bytes
    ntensors = len(flatten(capture(state)).tensors)
    work = tempfile.mkdtemp(prefix=f"bench-{name}-", dir=work_dir)
    log(f"scenario {name}: {nbytes / 1e9:.3f} GB in {ntensors} tensors, {rounds} rounds, under {work}")
    try:
        LocalStorage(work).sync_dir(work)
        fns = contenders(state, nbytes, quick=quick, same_bytes=same_bytes)
        results = {k: Result(k, nbytes) for k in fns}
        bar = _bar(rounds * len(fns), f"bench {name}")
        for r in range(rounds):
            for k, fn in fns.items():
                gc.collect()
                os.sync()
                if bar is not None:
                    bar.set_postfix_str(k)
                results[k].samples.append(fn(work))
                if bar is not None:
                    bar.update(1)
            log(f"  round {r + 1}/{rounds} done")
        if bar is not None:
            bar.close()
        share = checksum_share(state, results["preemptible emergency save"].median())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"name": name, "bytes": nbytes, "tensors": ntensors, "results": results, "checksum_share": share}


def report(scenario: dict[str, Any]) -> str:
    res: dict[str, Result] = scenario["results"]
    nbytes = scenario["bytes"]
    lines = [
        f"\n{scenario['name']}: {nbytes / 1e9:.3f} GB in {scenario['tensors']} tensors (median seconds)",
        f"  {'contender':<52}{'s':>8}{'GB/s':>8}{'peak MB':>9}{'stall s':>9}",
    ]
    for k, r in res.items():
        s = r.median()
        stall = r.median("stall")
        peak = r.median("peak_mb")
        peak_s = "" if math.isnan(peak) else f"{peak:.0f}"
        stall_s = "" if math.isnan(stall) else f"{stall:.3f}"
        lines.append(f"  {k:<52}{s:>8.3f}{nbytes / s / 1e9:>8.2f}{peak_s:>9}{stall_s:>9}")
    ours = res["preemptible emergency save"].median()
    n = max(1, scenario["tensors"])

    def paired(f: Callable[..., float], *names: str, key: str = "seconds") -> float:
        """``f`` of contenders that run back to back (the first's ``key``, the others' seconds), the median over
        rounds: a ratio to a ceiling measured seconds apart, not a minute."""
        if not all(k in res for k in names):
            return math.nan
        first, *rest = (res[k] for k in names)
        rounds = [[s.seconds if key == "seconds" else s.extra.get(key, math.nan) for s in first.samples]]
        rounds += [[s.seconds for s in r.samples] for r in rest]
        if not rounds[0] or len({len(x) for x in rounds}) != 1:  # not measured in the same rounds
            return float(f(first.median(key), *(r.median() for r in rest)))
        return statistics.median(f(*xs) for xs in zip(*rounds, strict=True))

    warm, into = "preemptible restore (warm)", "ceiling: read into the state's memory (warm)"
    ratios = {
        "emergency save / fsync'd write ceiling (throughput)": paired(
            lambda a, b: b / a, "preemptible emergency save", "ceiling: fsync'd write"
        ),
        "emergency save / O_DIRECT write ceiling (throughput)": paired(
            lambda a, b: b / a, "preemptible emergency save", "ceiling: O_DIRECT write"
        ),
        "emergency save speed vs torch.save": res["torch.save"].median() / ours,
        "emergency save speed vs dcp.save (1 thread)": res["dcp.save thread_count=1"].median() / ours,
        "emergency save speed vs safetensors": res["safetensors save_file"].median() / ours,
        "async stall / memcpy of the same bytes": paired(
            lambda a, b: a / b, "preemptible async save", "ceiling: memcpy into reused buffers", key="stall"
        ),
        "dcp.async_save stall / memcpy": res["dcp.async_save"].median("stall")
        / res["ceiling: memcpy into reused buffers"].median(),
        "restore (warm) / read ceiling (throughput)": paired(lambda a, b: b / a, warm, "ceiling: read (warm)"),
        "restore (warm) / read-into-memory ceiling (throughput)": paired(lambda a, b: b / a, warm, into),
        "restore (warm) / read-and-hash ceiling (throughput)": paired(
            lambda a, b: b / a, warm, "ceiling: read and hash into the state's memory (warm)"
        ),
        "restore (warm) overhead per tensor beyond the read, us": paired(lambda a, b: (a - b) / n * 1e6, warm, into),
        "... beyond the read and torch's load_state_dict, us": paired(
            lambda a, b, c: (a - b - c) / n * 1e6, warm, into, "load_state_dict as a restore calls it"
        ),
        "restore (warm) time / torch's load_state_dict alone": res[warm].median()
        / res["load_state_dict alone"].median(),
        "restore (warm) speed vs torch.load + load_state_dict": res["torch.load + load_state_dict (warm)"].median()
        / res[warm].median(),
        "checksum time / emergency save time": scenario["checksum_share"],
        "checksum time / restore (warm) time": scenario["checksum_share"] * ours / res[warm].median(),
    }
    ratios["async stall / memcpy of the same bytes into one buffer"] = paired(
        lambda a, b: a / b, "preemptible async save", "ceiling: memcpy into one buffer", key="stall"
    )
    if "emergency save, the same bytes in a few tensors" in res:
        ratios["emergency save / the same bytes in a few tensors (throughput)"] = paired(
            lambda a, b: b / a, "preemptible emergency save", "emergency save, the same bytes in a few tensors"
        )
        ratios["... both after a periodic save"] = paired(
            lambda a, b: b / a, "preemptible emergency save (after a periodic save)", "... after a periodic save"
        )
        ratios["... both prepared, as a run's first"] = paired(
            lambda a, b: b / a,
            "preemptible emergency save (prepared, as a run's first)",
            "... prepared, as a run's first",
        )
    if "dcp.save thread_count=2" in res:
        ratios["emergency save speed vs dcp.save (2 threads)"] = res["dcp.save thread_count=2"].median() / ours
    if "preemptible restore (cold)" in res:
        ratios["restore (cold) / read ceiling (throughput)"] = paired(
            lambda a, b: b / a, "preemptible restore (cold)", "ceiling: read (cold)"
        )
    lines.append(
        "  ratios: (one to a ceiling, or between two saves of the same bytes: the median of each round's ratio)"
    )
    lines += [f"    {k:<62}{v:>8.2f}" for k, v in ratios.items()]
    scenario["ratios"] = ratios
    return "\n".join(lines)


def beside_report(b: dict[str, Any]) -> str:
    where = f"a destination paced to {b['rate_mb_s']:.0f} MB/s" if b.get("rate_mb_s") else "this disk"
    if b.get("url"):
        where = f"object storage ({b['url']})"
    if b.get("verify"):
        where += ", each save read back and checked"
    cpu = b.get("cpu_beside_ours_s") or {}
    lines = [
        f"\ntraining beside a background save of the large state to {where} (a {b['step_alone_ms']:.1f} ms step alone; "
        f"the save ran {b['save_window_s']:.2f} s beside {b['steps_beside']:.0f} steps):",
        f"  extra time with preemptible async save: {b['extra_ours_s']:.2f} s (median of {len(b['extra_each_s'])}: "
        + ", ".join(f"{v:.2f}" for v in b["extra_each_s"])
        + f"; the baseline itself moved {b['noise_s']:.2f} s)",
    ]
    if not math.isnan(b["extra_dcp_async_s"]):
        lines.append(f"  extra time with dcp.async_save:          {b['extra_dcp_async_s']:.2f} s")
    if cpu:
        lines.append(
            "  machine CPU beside the save, less alone: "
            + ", ".join(f"{k} {cpu[k]:+.2f} s" for k in ("nice", "system", "softirq", "iowait", "steal", "user"))
            + " (nice: the writer thread; system/softirq: the kernel's I/O work)"
        )
    if "process" in cpu:
        lines.append(
            f"  this process's CPU beside the save, less alone: {cpu['process']:+.2f} s (training and the save's; "
            "below zero: training got less of the CPU than alone)"
        )
    return "\n".join(lines)


def main(
    *,
    params: float = 100e6,
    small_tensors: int = 10_000,
    small_bytes: float = 120e6,
    rounds: int = 3,
    quick: bool = False,
    beside: bool = True,
    beside_rounds: int = 7,
    throttle: float | None = None,
    work_dir: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run both scenarios and the training-beside measurement; print and return the figures."""
    out: dict[str, Any] = {}
    large = large_state(params)
    out["large"] = run_scenario("large", large, rounds=rounds, quick=quick, work_dir=work_dir, log=log)
    log(report(out["large"]))
    if beside:
        out["beside"] = training_beside(large, rounds=beside_rounds)
        log(beside_report(out["beside"]))
        out["beside_verified"] = training_beside(large, rounds=beside_rounds, dcp=False, verify=True)
        log(beside_report(out["beside_verified"]))
        if throttle:
            out["beside_throttled"] = training_beside(large, rounds=beside_rounds, rate=throttle, dcp=False)
            log(beside_report(out["beside_throttled"]))
    del large
    gc.collect()
    small = small_state(small_tensors, small_bytes)
    same = small_state(4, small_bytes)  # one parameter and its AdamW state: the same bytes in 4 tensors
    out["small"] = run_scenario("small", small, rounds=rounds, quick=quick, work_dir=work_dir, log=log, same_bytes=same)
    log(report(out["small"]))
    for what, key in (("", "small_vs_large"), (" (after a periodic save)", "small_vs_large_warm")):
        name = f"preemptible emergency save{what}"
        big_tp = out["large"]["bytes"] / out["large"]["results"][name].median()
        small_tp = out["small"]["bytes"] / out["small"]["results"][name].median()
        log(f"small-tensor emergency throughput / large-state throughput{what}: {small_tp / big_tp:.2f}")
        out[key] = small_tp / big_tp
    return out
