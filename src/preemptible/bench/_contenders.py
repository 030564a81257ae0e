"""The contenders of a scenario: preemptible's saves and restores beside torch.save, torch.distributed.checkpoint
and safetensors, and beside the machine's own limits, each timed on the very same bytes."""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from preemptible.bench._measure import PeakRSS, drop_cache, fsync_path, raw_read, raw_read_tree, raw_write
from preemptible.bench._workloads import _dcp, flat_tensors, plain
from preemptible.checkpoint import Checkpointer
from preemptible.events import SaveReason
from preemptible.state import apply


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


class _Contenders:
    """The contenders of one state: the same bytes written, read and copied by each (``fn(workdir) -> Sample``),
    and the buffers they share, made once."""

    def __init__(self, state: dict[str, Any], nbytes: int) -> None:
        from preemptible.store import format as tensor_format

        self.state = state
        self.sd = plain(state)
        self.tensors = flat_tensors(state)
        self.mirror = {k: torch.empty_like(v) for k, v in self.tensors.items()}  # reused memcpy destinations
        for k, v in self.tensors.items():
            self.mirror[k].copy_(v)
        self.async_ck: Checkpointer | None = None
        self.async_step = 1
        self.flat_src = torch.cat([t.reshape(-1).view(torch.uint8) for t in self.tensors.values()])
        self.flat_dst = torch.empty_like(self.flat_src)
        self.views = [tensor_format.byte_view(v) for v in self.tensors.values()]
        # Reused, and touched once here: a restore reads into the state's memory, whose pages exist already.
        self.read_into = torch.zeros(max(1, nbytes), dtype=torch.uint8)

    # preemptible ------------------------------------------------------------------------------------------------
    def ours_emergency(self, work: str) -> Sample:
        d = os.path.join(work, "ours")
        with PeakRSS() as mem:
            t = time.perf_counter()
            result = Checkpointer(d).save(self.state, 1, reason=SaveReason.EMERGENCY).wait()
            s = time.perf_counter() - t
        assert not result.skipped
        shutil.rmtree(d)
        return Sample(s, {"peak_mb": mem.peak / 1e6})

    @staticmethod
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

    def ours_async_save(self, work: str) -> Sample:
        d = os.path.join(work, "ours-async")
        ck = self.async_ck
        if ck is None or ck.root != os.path.abspath(d):
            ck = Checkpointer(d, keep=2)
            self.async_ck = ck
            self.async_step = 1
            ck.save(self.state, 1, blocking=False).wait()  # warm the staging arena once, as a training run does
        step = self.async_step = self.async_step + 1
        with PeakRSS() as mem:
            t = time.perf_counter()
            handle = ck.save(self.state, step, blocking=False)
            stall = time.perf_counter() - t
            handle.wait()
            total = time.perf_counter() - t
        return Sample(total, {"stall": stall, "peak_mb": mem.peak / 1e6})

    def ours_restore(self, work: str, cold: bool) -> Sample:
        d = os.path.join(work, "ours-restore")
        if not os.path.exists(d):
            Checkpointer(d).save(self.state, 1)
        if cold:
            drop_cache(d)
        else:
            raw_read_tree(d)
        t = time.perf_counter()
        Checkpointer(d).restore(self.state)
        return Sample(time.perf_counter() - t)

    # torch and the others -----------------------------------------------------------------------------------------
    def torch_restore(self, work: str) -> Sample:
        p = os.path.join(work, "torch-restore.pt")
        if not os.path.exists(p):
            torch.save(self.sd, p)
        raw_read(p)
        t = time.perf_counter()
        loaded = torch.load(p, weights_only=True)
        for k, obj in self.state.items():
            obj.load_state_dict(loaded[k])
        return Sample(time.perf_counter() - t)

    def load_state_dict_alone(self, work: str) -> Sample:
        """torch's own part of any restore that goes through ``load_state_dict``: the state's own state dicts
        loaded back (the optimizer's walks every value in Python)."""
        own = plain(self.state)
        t = time.perf_counter()
        for k, obj in self.state.items():
            obj.load_state_dict(own[k])
        return Sample(time.perf_counter() - t)

    def load_state_dict_as_restored(self, work: str) -> Sample:
        """The same, as a restore calls it (`preemptible.state.apply`: the optimizer is handed parameter ids it
        finds in constant time, and a module whose tensors were read in place is not loaded again): the part of a
        restore that is torch's own code."""
        own = plain(self.state)
        t = time.perf_counter()
        apply(self.state, own, live=own)
        return Sample(time.perf_counter() - t)

    def torch_save(self, work: str) -> Sample:
        p = os.path.join(work, "torch.pt")
        with PeakRSS() as mem:
            t = time.perf_counter()
            torch.save(self.sd, p)
            fsync_path(p)
            s = time.perf_counter() - t
        os.remove(p)
        return Sample(s, {"peak_mb": mem.peak / 1e6})

    def dcp_save(self, work: str, threads: int) -> Sample:
        dcp = _dcp()
        d = os.path.join(work, f"dcp{threads}")
        with warnings.catch_warnings(), PeakRSS() as mem:
            warnings.simplefilter("ignore")
            t = time.perf_counter()
            dcp.save(self.sd, storage_writer=dcp.FileSystemWriter(d, thread_count=threads, sync_files=True))
            s = time.perf_counter() - t
        shutil.rmtree(d)
        return Sample(s, {"peak_mb": mem.peak / 1e6})

    def dcp_async(self, work: str) -> Sample:
        dcp = _dcp()
        d = os.path.join(work, "dcp-async")
        with warnings.catch_warnings(), PeakRSS() as mem:
            warnings.simplefilter("ignore")
            t = time.perf_counter()
            fut = dcp.async_save(self.sd, storage_writer=dcp.FileSystemWriter(d, thread_count=1, sync_files=True))
            stall = time.perf_counter() - t
            fut.result()
            total = time.perf_counter() - t
        shutil.rmtree(d)
        return Sample(total, {"stall": stall, "peak_mb": mem.peak / 1e6})

    def safetensors_save(self, work: str) -> Sample:
        from safetensors.torch import save_file

        p = os.path.join(work, "st.safetensors")
        with PeakRSS() as mem:
            t = time.perf_counter()
            save_file(self.tensors, p)
            fsync_path(p)
            s = time.perf_counter() - t
        os.remove(p)
        return Sample(s, {"peak_mb": mem.peak / 1e6})

    # the machine's ceilings -----------------------------------------------------------------------------------------
    def ceiling_write(self, work: str) -> Sample:
        p = os.path.join(work, "raw.bin")
        t = time.perf_counter()
        raw_write(p, self.views)
        return Sample(time.perf_counter() - t)

    def ceiling_direct(self, work: str) -> Sample:
        from preemptible.store import direct

        p = os.path.join(work, "raw-direct.bin")
        fd = direct.open_direct(p)
        if fd is None:
            return Sample(float("nan"))
        t = time.perf_counter()
        writer = direct.DirectWriter(p, fd)
        for view in self.views:
            writer.write(view)
        writer.close()
        s = time.perf_counter() - t
        os.remove(p)
        return Sample(s)

    def ceiling_read(self, work: str, cold: bool) -> Sample:
        p = os.path.join(work, "raw.bin")
        if not os.path.exists(p):
            raw_write(p, self.views)
        if cold:
            drop_cache(p)
        else:
            raw_read(p)
        t = time.perf_counter()
        raw_read(p)
        return Sample(time.perf_counter() - t)

    def ceiling_read_into(self, work: str, hashed: bool = False) -> Sample:
        """The least a warm restore must do: read the bytes into memory the size of the state, on as many threads
        as a restore reads with (2), split evenly between them, in reads of a restore's size (an 8 MiB buffer
        reused for the whole file stays in the CPU's cache, which no restore can). ``hashed``: and hash each read
        with the checkpoint checksum while it is in the cache, the least a restore that verifies what it reads
        must do."""
        from preemptible.store import checksum
        from preemptible.store import format as tensor_format

        p = os.path.join(work, "raw.bin")
        if not os.path.exists(p):
            raw_write(p, self.views)
        raw_read(p)
        size = os.path.getsize(p)
        half = size // 2 - (size // 2) % 4096
        dest = memoryview(self.read_into.numpy())  # type: ignore[arg-type]
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

    def ceiling_memcpy(self, work: str) -> Sample:
        t = time.perf_counter()
        for k, v in self.tensors.items():
            self.mirror[k].copy_(v)
        return Sample(time.perf_counter() - t)

    def ceiling_memcpy_one(self, work: str) -> Sample:
        t = time.perf_counter()
        self.flat_dst.copy_(self.flat_src)
        return Sample(time.perf_counter() - t)


def contenders(
    state: dict[str, Any], nbytes: int, *, quick: bool = False, same_bytes: dict[str, Any] | None = None
) -> dict[str, Contender]:
    """The same bytes written, read and copied by every contender; ``name -> fn(workdir) -> Sample``.

    ``same_bytes``: a state of the same bytes in a few large tensors (for a state of many small ones): its emergency
    saves, cold and after a periodic save, are the reference for the small tensors' throughput."""
    c = _Contenders(state, nbytes)
    # IMPORTANT: each ratio's two sides run back to back in a round (the report takes the median of each round's
    # ratio): this machine's speed drifts by more than the gaps measured over the minute a round takes.
    out: dict[str, Contender] = {"preemptible emergency save": c.ours_emergency}
    if same_bytes is not None:
        out["emergency save, the same bytes in a few tensors"] = c.emergency_of(same_bytes, warm=False)
    out["ceiling: fsync'd write"] = c.ceiling_write
    out["ceiling: O_DIRECT write"] = c.ceiling_direct
    out["preemptible emergency save (after a periodic save)"] = c.emergency_of(state, warm=True)
    if same_bytes is not None:
        out["... after a periodic save"] = c.emergency_of(same_bytes, warm=True)
        out["preemptible emergency save (prepared, as a run's first)"] = c.emergency_of(
            state, warm=False, prepared=True
        )
        out["... prepared, as a run's first"] = c.emergency_of(same_bytes, warm=False, prepared=True)
    out |= {
        "preemptible async save": c.ours_async_save,
        "ceiling: memcpy into reused buffers": c.ceiling_memcpy,
        "ceiling: memcpy into one buffer": c.ceiling_memcpy_one,
        "preemptible restore (warm)": median_of(partial(c.ours_restore, cold=False), WARM_READS),
        "ceiling: read into the state's memory (warm)": median_of(c.ceiling_read_into, WARM_READS),
        "ceiling: read and hash into the state's memory (warm)": median_of(
            partial(c.ceiling_read_into, hashed=True), WARM_READS
        ),
        "ceiling: read (warm)": median_of(partial(c.ceiling_read, cold=False), WARM_READS),
        "load_state_dict as a restore calls it": median_of(c.load_state_dict_as_restored, WARM_READS),
        "preemptible restore (cold)": partial(c.ours_restore, cold=True),
        "ceiling: read (cold)": partial(c.ceiling_read, cold=True),
        "torch.load + load_state_dict (warm)": c.torch_restore,
        "load_state_dict alone": median_of(c.load_state_dict_alone, WARM_READS),
        "torch.save": c.torch_save,
        "dcp.save thread_count=1": partial(c.dcp_save, threads=1),
        "dcp.save thread_count=2": partial(c.dcp_save, threads=2),
        "dcp.async_save": c.dcp_async,
        "safetensors save_file": c.safetensors_save,
    }
    if quick:
        for name in ("dcp.save thread_count=2", "ceiling: read (cold)", "preemptible restore (cold)"):
            out.pop(name)
    return out
