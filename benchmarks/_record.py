"""What every benchmark leaves behind: its result in ``benchmarks/results/<name>-<date>.json``, with the machine, the
date and the command that produced it, for the documentation site's performance page (``docs/_hooks/results.py``
renders the committed files at build time; a file no page shows fails the docs build, so a new result is committed
with its place on a page).

A benchmark's ``__main__`` calls ``recorded(main, "name")``: what ``main`` prints is shown as it runs and kept as
the result's ``output`` (the lines a reader would have copied by hand). ``PREEMPTIBLE_BENCH_RECORD=0`` writes
nothing. Benchmarks that write their own structured result (memory_tier.py, nodes_bench.py, gpu_suite.py) record
the machine (the same `gpu_suite.machine`), the date and the command themselves.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """The machine a result was measured on: `gpu_suite.machine`, the one description the benchmarks record (CPUs,
    memory, platform, Python), and the torch build with its accelerator."""
    from gpu_suite import machine as described

    info = described()
    with contextlib.suppress(ImportError):
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    return info


class _Tee(io.TextIOBase):
    def __init__(self, out: Any) -> None:
        self.out = out
        self.kept = io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return int(self.out.write(text))

    def flush(self) -> None:
        self.out.flush()


def recorded(main: Callable[[], Any], name: str) -> Any:
    """Run ``main`` and write its result file; returns what ``main`` returned (an exit code, or None)."""
    if os.environ.get("PREEMPTIBLE_BENCH_RECORD") == "0":
        return main()
    tee = _Tee(sys.stdout)
    started = time.time()
    with contextlib.redirect_stdout(tee):
        code = main()
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
        "command": [os.path.relpath(sys.argv[0]), *sys.argv[1:]],
        "machine": machine(),
        "seconds": round(time.time() - started, 1),
        "output": tee.kept.getvalue().splitlines(),
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y-%m-%d', time.gmtime(started))}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"recorded {os.path.relpath(path)}", file=sys.stderr)
    return code
