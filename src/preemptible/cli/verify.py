"""``preemptible verify ROOT [--step N]``: check every byte of committed checkpoints; non-zero exit on failure."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from preemptible.cli.args import existing_directory, integer


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="fully verify committed checkpoints (manifest, sizes, headers, checksums); exit 1 on failure",
        description=(
            "Reads every file of each committed checkpoint (or only --step N) and checks it against COMMIT.json. "
            "A checkpoint that passes is marked validated (VALID.json) unless it carries a probe value, which "
            "needs the model and is checked by the next restore (it stays 'committed' until then). One that fails "
            "a content check is marked invalid (INVALID.json; VALID.json removed). An I/O error marks nothing "
            "('could not verify'). --no-mark leaves every file untouched."
        ),
    )
    p.add_argument("root", type=existing_directory)
    p.add_argument("--step", type=integer(low=0, high=10**12 - 1), default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-mark", action="store_true", help="only report: write no VALID.json/INVALID.json")


def run(args: argparse.Namespace) -> int:
    from preemptible.checkpoint import Checkpointer
    from preemptible.errors import CheckpointCorruptError, CheckpointNotFoundError

    ck = Checkpointer(args.root)
    ck.reader.bar = None  # a progress bar when stderr is a terminal
    steps = [args.step] if args.step is not None else [c.step for c in ck.checkpoints()]
    results: list[dict[str, Any]] = []
    for step in steps:
        t = time.perf_counter()
        try:
            info, notes = ck.verify_report(step, mark=not args.no_mark)
            results.append(
                {
                    "step": step,
                    "ok": info.status != "invalid",
                    "status": info.status,
                    "bytes": info.bytes,
                    "seconds": round(time.perf_counter() - t, 3),
                    "notes": notes,
                }
            )
        except (CheckpointCorruptError, CheckpointNotFoundError) as e:
            results.append({"step": step, "ok": False, "error": str(e), "seconds": round(time.perf_counter() - t, 3)})
        except OSError as e:
            why = f"could not verify ({type(e).__name__}: {e}); nothing was marked. Check the storage and try again"
            results.append({"step": step, "ok": False, "error": why, "seconds": round(time.perf_counter() - t, 3)})
    ok = bool(results) and all(r["ok"] for r in results)
    if args.json:
        print(json.dumps({"root": args.root, "resolved": ck.root, "ok": ok, "checkpoints": results}, indent=1))
    else:
        if not results:
            print(f"{args.root}: no committed checkpoints")
        for r in results:
            if "error" not in r:
                rate = r["bytes"] / r["seconds"] / 1e9 if r["seconds"] else 0
                verdict = "PASS" if r["ok"] else "FAIL"
                print(
                    f"{verdict}  step {r['step']}: {r['bytes'] / 1e6:.1f} MB verified in {r['seconds']:.2f} s "
                    f"({rate:.2f} GB/s), {r['status']}"
                )
                for n in r["notes"]:
                    print(f"      note: {n}")
            else:
                print(f"FAIL  step {r['step']}: {r['error']}")
    return 0 if ok else 1
