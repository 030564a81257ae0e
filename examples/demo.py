"""The demo: train, get preempted for real, resume, and prove nothing was lost.

1. Runs examples/train.py to the end, uninterrupted: the reference.
2. Runs it again and sends it a real SIGTERM midway (what Kubernetes, GCP, docker stop or scancel send).
   The script saves at the next step boundary and exits 0.
3. Runs the same command again: it resumes from that checkpoint and finishes.
4. Compares the final model and optimizer state of 1 and 3, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from preemptible.events import Event, SaveReason

HERE = Path(__file__).resolve().parent


def train(root: Path, args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PREEMPTIBLE_SOURCES": "signal"}
    return subprocess.Popen(
        [sys.executable, str(HERE / "train.py"), "--root", str(root), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def final_line(out: str) -> dict[str, str]:
    for line in out.splitlines():
        if line.startswith("final "):
            return dict(kv.split("=", 1) for kv in line.split()[1:])
    raise SystemExit(f"demo: the training script printed no final line:\n{out[-2000:]}")


def events(root: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted((root / "journal").glob("*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def show(stderr: str) -> None:
    for line in stderr.splitlines():
        if line.startswith("preemptible"):
            print(f"    | {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--preempt-at", type=int, default=150, help="send SIGTERM once this step has run")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint directories")
    opts = parser.parse_args()
    args = ["--steps", str(opts.steps), "--save-every", "100"]
    work = Path(tempfile.mkdtemp(prefix="preemptible-demo-"))

    print(f"1. reference: {opts.steps} steps, never interrupted")
    ref = train(work / "reference", args)
    out, err = ref.communicate()
    if ref.returncode != 0:
        print(err)
        return 1
    reference = final_line(out)["digest"]
    print(f"   final state digest {reference}\n")

    root = work / "preempted"
    print(f"2. the same run, sent a real SIGTERM after step {opts.preempt_at} (pid shown below)")
    proc = train(root, [*args, "--step-time", "0.01"])
    assert proc.stdout is not None
    print(f"   pid {proc.pid}")
    for line in proc.stdout:
        if line.startswith(f"step {opts.preempt_at} "):
            break
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate()
    exit_s = time.monotonic() - sent
    show(err)
    journal = events(root)
    notice = next(e for e in journal if e["event"] == Event.NOTICE)
    committed = next(e for e in journal if e["event"] == Event.SAVE_COMMITTED and e["reason"] == SaveReason.EMERGENCY)
    to_commit = (iso(committed["t"]) - iso(notice["received_at"])).total_seconds()
    print(
        f"   exit code {proc.returncode}; SIGTERM -> exit {exit_s:.2f} s "
        f"(notice -> checkpoint committed {to_commit:.3f} s; the deadline was 30 s)\n"
    )

    print("3. the same command again: it resumes")
    again = train(root, args)
    out, err = again.communicate()
    show(err)
    final = final_line(out)
    print(f"   resumed from step {final['resumed_from']}, final state digest {final['digest']}\n")

    ok = proc.returncode == 0 and final["resumed_from"] == str(notice["step"]) and final["digest"] == reference
    print("4. result")
    print(f"   {'check':<44} {'value':>20}")
    print(f"   {'exit code after SIGTERM':<44} {proc.returncode:>20}")
    print(f"   {'checkpoint step (first step not yet run)':<44} {notice['step']:>20}")
    print(f"   {'SIGTERM -> process exit (s)':<44} {exit_s:>20.2f}")
    print(f"   {'resumed from step':<44} {final['resumed_from']:>20}")
    print(f"   {'bit-identical to the uninterrupted run':<44} {final['digest'] == reference!s:>20}")
    where = f"checkpoints and journals kept in {work}" if opts.keep else "its checkpoints removed; --keep keeps them"
    print(
        f"\n{'PASS' if ok else 'FAIL'}: preempted at step {notice['step']}, resumed, "
        f"{'ended bit-identical' if final['digest'] == reference else 'ended DIFFERENT'} ({where})"
    )
    if not opts.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
