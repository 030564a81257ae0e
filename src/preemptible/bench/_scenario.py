"""A scenario: every contender over interleaved rounds, reported as medians and paired ratios; `main` runs the
large-state and small-tensor scenarios and the training-beside measurements."""

from __future__ import annotations

import gc
import math
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from preemptible.bench._beside import beside_report, training_beside
from preemptible.bench._contenders import Result, contenders
from preemptible.bench._measure import checksum_share
from preemptible.bench._workloads import large_state, small_state
from preemptible.state import capture, flatten
from preemptible.store.io import LocalStorage


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
