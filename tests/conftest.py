"""Shared fixtures: a scrubbed environment (no test depends on where it runs), small models, subprocess helpers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train.py"

NO_DMI = "/nonexistent/preemptible-test-dmi"
_PLATFORM_PREFIXES = (
    *("SLURM_", "KUBERNETES_", "PREEMPTIBLE_", "TORCHELASTIC_", "WANDB_"),  # schedulers, launchers, ours, trackers
    *("AWS_", "GCE_", "AZURE_", "GOOGLE_", "FSSPEC_", "GCSFS_", "STORAGE_EMULATOR_HOST"),  # clouds and their clients
)


def _platform_var(key: str) -> bool:
    return key.startswith(_PLATFORM_PREFIXES) or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without scheduler/cloud/launcher variables, notice sources pinned to signals."""
    env = {k: v for k, v in os.environ.items() if not _platform_var(k)}
    env["PREEMPTIBLE_SOURCES"] = "signal"
    env["PREEMPTIBLE_DMI_DIR"] = NO_DMI
    env.update(extra)
    return env


@pytest.fixture(autouse=True)
def scrubbed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test sees no scheduler, no cloud, and pins its notice sources to signals only."""
    for key in list(os.environ):
        if _platform_var(key):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PREEMPTIBLE_SOURCES", "signal")
    monkeypatch.setenv("PREEMPTIBLE_DMI_DIR", NO_DMI)  # no test depends on the machine it runs on


def make_model(hidden: int = 16, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(hidden, 2)
    )


def train_some(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, start: int = 0) -> None:
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(4, 8, generator=g)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def assert_same_tensors(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


class Trainer:
    """The example training script (or another ``script`` taking ``--root``) as a real child process, with its stdout
    read line by line."""

    def __init__(self, root: Path | str, *args: str, env: dict[str, str] | None = None, script: Path = EXAMPLE) -> None:
        self.root = root
        cmd = [sys.executable, str(script), "--root", str(root), *args]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(**(env or {})),
        )
        self.lines: list[str] = []

    def wait_for_step(self, step: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith(f"step {step} "):
                return
            if time.monotonic() > deadline:
                break
        raise AssertionError(f"never reached step {step}; stderr: {self.stderr_now()}")

    def stderr_now(self) -> str:
        if self.proc.poll() is None:
            return "<still running>"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, "".join(self.lines) + out, err


def final_digest(stdout: str) -> str:
    for line in stdout.splitlines():
        if line.startswith("final "):
            return dict(kv.split("=", 1) for kv in line.split()[1:])["digest"]
    raise AssertionError(f"no final line in output:\n{stdout[-2000:]}")


def committed_steps(root: Path) -> list[int]:
    """The steps committed under ``root``: ``step-<12 digits>/COMMIT.json``. A save in progress is written in
    ``step-N.part-<token>/`` and renamed when committed, so its directory, COMMIT.json and all, does not count."""
    return sorted(int(p.parent.name[5:]) for p in root.glob("step-*/COMMIT.json") if p.parent.name[5:].isdigit())


def journal(root: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted((root / "journal").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events


def wait_for_event(root: Path, predicate: Any, timeout: float = 60, poll: float = 0.002) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in journal(root):
            if predicate(e):
                return e
        time.sleep(poll)
    raise AssertionError(f"journal event never appeared under {root}")


E2E_ARGS = ("--steps", "160", "--save-every", "40")


@pytest.fixture(scope="session")
def reference_digest(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The digest of an uninterrupted run of the example with E2E_ARGS."""
    t = Trainer(tmp_path_factory.mktemp("reference") / "ckpt", *E2E_ARGS)
    code, out, err = t.finish()
    assert code == 0, err
    return final_digest(out)
