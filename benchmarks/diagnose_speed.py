"""How fast ``preemptible diagnose`` reads a long log, and in how much memory.

Writes a log of ``--mib`` MiB (training-progress lines; ``--busy``: one line in seven is one a rule acts on, the
worst realistic case; default: one in a thousand), ends it with a SLURM preemption line, and times
``preemptible diagnose`` on it in a fresh process, reporting MiB/s and the process's peak RSS beside the time to
read the same file with ``cat`` (the disk's and page cache's own speed), interleaved.

    python benchmarks/diagnose_speed.py [--mib 1024] [--busy] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_log(path: Path, mib: int, busy: bool) -> None:
    every = 7 if busy else 1000
    block = "".join(
        "worker 3: Killed\nRuntimeError: step failed, retrying\n"
        if i % every == every - 1
        else f"[2026-11-30 19:05:{i % 60:02d},123] [INFO] [trainer.py:123:train] step {i} loss=0.1234 lr=3e-4\n"
        for i in range(7000)
    )
    with path.open("w") as f:
        while f.tell() < mib << 20:
            f.write(block)
        f.write("slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2026-11-30T19:06:00 DUE TO PREEMPTION ***\n")


def timed(cmd: list[str]) -> tuple[float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
    took = time.perf_counter() - start
    return took, max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--busy", action="store_true")
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        write_log(log, args.mib, args.busy)
        size = log.stat().st_size / 2**20
        for _ in range(args.repeat):
            cat, _ = timed(["cat", str(log)])
            took, rss = timed([sys.executable, "-m", "preemptible", "diagnose", str(log)])
            print(
                f"{size:.0f} MiB ({'busy' if args.busy else 'quiet'}): "
                f"diagnose {took:.1f} s ({size / took:.0f} MiB/s), "
                f"cat {cat:.2f} s; ratio {took / cat:.0f}x cat; peak RSS of the children so far {rss / 1024:.0f} MiB"
            )
    return 0


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(recorded(main, "diagnose-speed"))
