"""Real torchrun launches for the tests: a 1-node job of N ranks on loopback, gloo, CPU."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import REPO, clean_env

EXAMPLE = REPO / "examples" / "train_ddp.py"
FSDP = REPO / "examples" / "train_fsdp.py"
_STEP = re.compile(r"\bstep (\d+) ")
"""A rank's step line ("step 40 run"), wherever it is in a line: beside a CPU-heavy process the ranks' prints can run
into one line, so a step's line need not start one."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Torchrun:
    def __init__(
        self,
        root: Path,
        nproc: int,
        *args: str,
        env: dict[str, str] | None = None,
        script: Path | None = None,
    ) -> None:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            str(script or EXAMPLE),
            "--root",
            str(root),
            *args,
        ]
        self.root = root
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(**(env or {})),
        )
        self.lines: list[str] = []

    def wait_for_step(self, step: int, timeout: float = 90) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:
            self.lines.append(line)
            if any(int(n) >= step for n in _STEP.findall(line)) or time.monotonic() > deadline:
                return
        raise AssertionError(f"never reached step {step}: {self.proc.stderr.read() if self.proc.stderr else ''}")

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, "".join(self.lines) + out, err


def journals(root: Path) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((root / "journal").glob("*.jsonl")):
        rank = int(path.stem.rsplit("-r", 1)[1])
        out.setdefault(rank, []).extend(json.loads(x) for x in path.read_text().splitlines() if x.strip())
    return out


def last(events: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return [e for e in events if e["event"] == name][-1]
