"""Training beside a background save: the extra wall time a real training loop pays while a save runs."""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from preemptible.bench._measure import CPU_FIELDS, cpu_times
from preemptible.bench._paced import PacedStorage
from preemptible.bench._workloads import _dcp, plain, train_steps
from preemptible.checkpoint import Checkpointer
from preemptible.store.io import LocalStorage


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
            ck = _checkpointer(work, url, storage_options, rate, verify)
            ck.save(state, 1, blocking=False).wait()  # warm staging
            sd = plain(state)
            job = _Beside(model, opt, x, seconds)

            def dcp_async(d: str) -> Any:
                assert dcp_mod is not None
                return dcp_mod.async_save(sd, storage_writer=dcp_mod.FileSystemWriter(d))

            def ours_done(handle: Any) -> None:
                handle.wait()
                ck.storage.remove_tree(ck.path_of(handle.step))

            for r in range(rounds):
                job.measure("ours", partial(ck.save, state, 2 + r, blocking=False), ours_done)
                if dcp_mod is not None and url is None and r < dcp_rounds:
                    d = os.path.join(work, f"dcp{r}")
                    with warnings.catch_warnings():  # its warnings about running without a process group
                        warnings.simplefilter("ignore")
                        job.measure("dcp", partial(dcp_async, d), partial(_dcp_done, d))

            if url is not None:  # the warm-up save, the journal: nothing left in the store
                ck.storage.remove_tree(ck.root)
            return job.summary() | {"rate_mb_s": rate / 1e6 if rate else None, "verify": verify, "url": url}
        finally:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        torch.set_num_threads(old)


def _checkpointer(
    work: str, url: str | None, storage_options: dict[str, Any] | None, rate: float | None, verify: bool
) -> Checkpointer:
    """Where the background saves go: ``url``, else a directory under ``work`` (paced to ``rate``)."""
    if url is not None:
        return Checkpointer(url, storage_options=storage_options, keep=100, verify_after_save=verify)
    root = os.path.join(work, "ours")
    local = LocalStorage(root)
    storage: Any = PacedStorage(local, rate) if rate else local
    return Checkpointer(root, storage=storage, keep=100, verify_after_save=verify)


def _dcp_done(d: str, future: Any) -> None:
    future.result()
    shutil.rmtree(d, ignore_errors=True)


class _Beside:
    """The small training job and what it measured beside each save: by name (``ours``, ``dcp``), per round, the
    extra time, the baseline's own move, the save's window, the steps beside it and the step time alone."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, seconds: float) -> None:
        self.model, self.opt, self.x, self.seconds = model, opt, x, seconds
        self.figures: dict[str, list[tuple[float, float, float, int, float]]] = {"ours": [], "dcp": []}
        self.extra_cpu: list[dict[str, float]] = []

    def measure(self, name: str, start: Callable[[], Any], finish: Callable[[Any], object]) -> None:
        """Train alone, beside the job ``start()`` returns (anything with ``done()``), alone again."""
        model, opt, x = self.model, self.opt, self.x
        c0 = cpu_times()
        before = train_steps(model, opt, x, seconds=self.seconds)
        c1 = cpu_times()
        job = start()
        t = time.perf_counter()
        during = train_steps(model, opt, x, until=job.done)
        window = time.perf_counter() - t
        c2 = cpu_times()
        finish(job)
        after = train_steps(model, opt, x, seconds=self.seconds)
        alone = statistics.fmean(before + after)
        moved = statistics.fmean(before) - statistics.fmean(after)
        self.figures[name].append(
            (sum(during) - len(during) * alone, abs(moved) * len(during), window, len(during), alone)
        )
        if name == "ours":
            share = window / max(sum(before), 1e-9)
            self.extra_cpu.append({k: (c2[k] - c1[k]) - (c1[k] - c0[k]) * share for k in c0})

    def _median(self, name: str, i: int) -> float:
        figures = self.figures[name]
        return statistics.median(f[i] for f in figures) if figures else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "extra_ours_s": self._median("ours", 0),
            "extra_dcp_async_s": self._median("dcp", 0),
            "noise_s": self._median("ours", 1),
            "save_window_s": self._median("ours", 2),
            "steps_beside": self._median("ours", 3),
            "step_alone_ms": self._median("ours", 4) * 1e3,
            "extra_each_s": [round(f[0], 3) for f in self.figures["ours"]],
            "cpu_beside_ours_s": {
                k: round(statistics.median(d[k] for d in self.extra_cpu), 3) for k in (*CPU_FIELDS, "process")
            },
        }


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
