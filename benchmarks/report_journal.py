"""Time and peak memory of ``preemptible report`` on a long journal (issue 50 item 12: 2,000,000 lines took 100 s
and 2.3 GB before the reader streamed).

    .venv/bin/python benchmarks/report_journal.py [--lines 2000000] [--dir DIR]

Writes a journal of one attempt (a ``log`` event per step with two figures, a save every 100 steps) under a temporary
root, then runs the report as ``preemptible report ROOT --json`` does, measuring wall time and peak memory twice: the
process's peak RSS growth (``ru_maxrss``, what a machine must have) and Python's own allocations (tracemalloc, run
separately because it slows Python down).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
import tracemalloc


def write(root: str, lines: int) -> int:
    os.makedirs(os.path.join(root, "journal"), exist_ok=True)
    path = os.path.join(root, "journal", "20260101T000000.000000Z-r0.jsonl")
    with open(path, "w") as f:
        f.write('{"t": "2026-01-01T00:00:00.000000Z", "event": "fresh", "step": 0, "rank": 0}\n')
        for i in range(lines):
            s, ms = divmod(i, 100)
            t = f"2026-01-{1 + s // 86400:02d}T{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{ms * 10:03d}000Z"
            if i % 100 == 99:
                f.write(f'{{"t": "{t}", "event": "save_committed", "step": {i + 1}, "rank": 0, "seconds": 0.5}}\n')
            else:
                f.write(f'{{"t": "{t}", "event": "log", "step": {i}, "rank": 0, "loss": {1 / (i + 1)!r}, "lr": 0.1}}\n')
    return os.path.getsize(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--dir", default=None, help="where to write the journal (default: the system temp dir)")
    args = parser.parse_args()
    from preemptible import report
    from preemptible.store.io import LocalStorage

    root = tempfile.mkdtemp(prefix="report-journal-", dir=args.dir)
    try:
        size = write(root, args.lines)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        doc = report.report(LocalStorage(root))
        seconds = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
        text = report.to_json(doc)
        tracemalloc.start()
        t1 = time.perf_counter()
        report.report(LocalStorage(root))
        traced_s = time.perf_counter() - t1
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "lines": args.lines,
                "journal_bytes": size,
                "report_s": round(seconds, 2),
                "lines_per_s": round(args.lines / seconds),
                "peak_rss_growth_mb": round(rss / 1024, 1),
                "peak_python_alloc_mb": round(peak / 2**20, 2),
                "report_s_under_tracemalloc": round(traced_s, 2),
                "json_bytes": len(text),
                "figures_downsampled": doc["figures_downsampled"],
                "skipped": doc["skipped"],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    recorded(main, "report-journal")
