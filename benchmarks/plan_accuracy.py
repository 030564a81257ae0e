"""How close is `preemptible plan`'s prediction to the emergency save it predicts? For states of 100 MB to 2 GB:
probe the destination as `plan` does, predict, then time the real emergency save (from live tensors, with the
commit) right after. Interleaved rounds; reports predicted vs actual and the error.

    python benchmarks/plan_accuracy.py --dir /path/on/the/disk --rounds 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch

from preemptible import Checkpointer, budget
from preemptible.bench import large_state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sizes-gb", default="0.1,0.25,0.5,1,2")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="plan-accuracy-", dir=args.dir)
    rows = []
    try:
        for gb in (float(x) for x in args.sizes_gb.split(",")):
            side = 2048 if gb < 0.5 else 4096
            state = large_state(gb * 1e9 / 12, side=side)
            nbytes = budget.live_bytes(state)
            errs, preds, acts = [], [], []
            for r in range(args.rounds):
                bw = budget.probe(work)
                pred = budget.evaluate(state_bytes=nbytes, bandwidth=bw, window=1e6)
                predicted = pred.breakdown["write_s"] + pred.breakdown["commit_s"]
                d = os.path.join(work, f"s{r}")
                t = time.perf_counter()
                Checkpointer(d).save(state, 1)
                actual = time.perf_counter() - t
                shutil.rmtree(d)
                preds.append(predicted)
                acts.append(actual)
                errs.append((predicted - actual) / actual)
            rows.append((nbytes, statistics.median(preds), statistics.median(acts), errs))
            del state
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'state GB':>9} {'predicted s':>12} {'actual s':>9} {'errors (each round)':>24}")
    for nbytes, p, a, errs in rows:
        print(f"{nbytes / 1e9:>9.2f} {p:>12.2f} {a:>9.2f}   " + " ".join(f"{e:+.0%}" for e in errs))


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    recorded(main, "plan-accuracy")
