"""Notice-to-exit time of the example training script, for each notice source, against the loopback emulators.

For each source and round: start examples/train.py, let it train, deliver the notice (a real SIGTERM, or the
cloud's notice in its emulator), and measure notice -> checkpoint committed (from the journal) and notice ->
process exit. Reports medians.

    python benchmarks/notice_to_exit.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from preemptible.emulate import EMULATORS
from preemptible.events import Event

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train.py"
ENV = {"aws": "PREEMPTIBLE_AWS_ENDPOINT", "gcp": "PREEMPTIBLE_GCP_ENDPOINT", "azure": "PREEMPTIBLE_AZURE_ENDPOINT"}


def one(source: str, work: Path) -> tuple[float, float]:
    root = work / f"{source}-{time.monotonic_ns()}"
    env = {**os.environ, "PREEMPTIBLE_SOURCES": "signal" if source == "signal" else source}
    emu = EMULATORS[source]().start() if source in EMULATORS else None
    if emu is not None:
        env[ENV[source]] = emu.url
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(EXAMPLE),
                "--root",
                str(root),
                "--steps",
                "1000000",
                "--save-every",
                "1000000",
                "--step-time",
                "0.01",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("step 30 "):
                break
        t0 = time.time()
        if emu is None:
            proc.send_signal(signal.SIGTERM)
        else:
            emu.notice()
        proc.communicate()
        exited = time.time() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{source}: exit code {proc.returncode}")
    finally:
        if emu is not None:
            emu.close()
    events = [json.loads(x) for f in sorted((root / "journal").glob("*.jsonl")) for x in f.read_text().splitlines()]
    commit = next(e for e in events if e["event"] == Event.SAVE_COMMITTED)
    committed = datetime.fromisoformat(commit["t"].replace("Z", "+00:00")).timestamp() - t0
    return committed, exited


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sources", default="signal,aws,gcp,azure")
    args = ap.parse_args()
    sources = args.sources.split(",")
    results: dict[str, list[tuple[float, float]]] = {s: [] for s in sources}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(args.rounds):
            for s in sources:  # interleaved
                results[s].append(one(s, Path(d)))
    print(f"{'source':<8}{'notice->commit s':>18}{'notice->exit s':>16}  (median of {args.rounds})")
    for s, rows in results.items():
        print(f"{s:<8}{statistics.median(r[0] for r in rows):>18.3f}{statistics.median(r[1] for r in rows):>16.3f}")


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    recorded(main, "notice-to-exit")
