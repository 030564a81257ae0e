"""The full crash-consistency sweep: kill -9 a process saving checkpoints back to back, at random instants
(during data writes, fsyncs, the commit, rotation), many times; after each kill restore and check that the
restored checkpoint verifies and holds exactly the values of its step.

    python benchmarks/crash_sweep.py --kills 200 [--dir /path/on/the/target/disk]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from preemptible.testing import sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        t = time.monotonic()
        result = sweep(Path(d) / "ckpt", args.kills, seed=args.seed)
        took = time.monotonic() - t
    print(f"kills: {result.kills} in {took:.0f} s")
    print(f"restores that verified and held exactly their step's values: {result.restores_ok}")
    print(f"bad restores: {len(result.bad)}")
    for line in result.bad:
        print(f"  {line}")
    print("where the kills landed (judged from what they left behind):")
    for phase, n in sorted(result.phases.items(), key=lambda kv: -kv[1]):
        print(f"  {phase:<45} {n}")
    print(f"distinct steps restored: {len(set(result.committed_steps))}")


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    recorded(main, "crash-sweep")
