"""Crash-consistency sweep: kill -9 a process that saves checkpoints back to back, at random instants, and
check that a restore afterwards yields a committed checkpoint holding exactly the values of its step.

Processes come from a zygote: one pristine Python that imports torch and preemptible once, then forks a fresh
saver per kill (a fork takes milliseconds; a new interpreter with torch takes seconds). The zygote never runs
torch ops or starts threads before forking, so its children start clean. A child says when it is ready to
save (its modules imported) and the random instant is counted from then: on a loaded
machine its start alone can take longer than the longest delay, and kills would land before any save. Used by
the test suite (a short sweep) and by ``benchmarks/crash_sweep.py`` (the full one).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


def values(step: int, size: int) -> dict[str, Any]:
    """The state a saver holds at ``step``: every value derived from the step, so a restore can be checked."""
    return {
        "weights": {
            "big": torch.arange(size, dtype=torch.int64) + step * 1_000_000_000,
            "f": torch.full((size // 4 + 1,), float(step), dtype=torch.float32),
            "small": {f"t{i}": torch.full((i + 1,), step * 10 + i, dtype=torch.int32) for i in range(40)},
        },
        "meta": {"step": step, "size": size},
    }


def template(size: int) -> dict[str, Any]:
    return {"weights": {}, "meta": {}}


def check(state: dict[str, Any], step: int) -> str | None:
    """None if ``state`` holds exactly the values of ``step``, else what differs."""
    size = state["meta"].get("size")
    if state["meta"].get("step") != step or size is None:
        return f"meta says {state['meta']}, expected step {step}"
    want = values(step, size)["weights"]
    got = state["weights"]
    for key in ("big", "f"):
        if not torch.equal(got[key], want[key]):
            return f"weights/{key} differ from step {step}'s"
    for k, v in want["small"].items():
        if not torch.equal(got["small"][k], v):
            return f"weights/small/{k} differs from step {step}'s"
    return None


def _saver(root: str, seed: int, ready: Callable[[], None]) -> None:  # pragma: no cover - a forked child, killed
    from preemptible import Checkpointer

    torch.set_num_threads(1)
    rng = random.Random(seed)
    size = rng.choice([1_000, 200_000, 2_000_000])  # 8 KB to 24 MB of tensors: kills land in every phase
    ready()  # the sweep's delay starts now
    ck = Checkpointer(root, keep=2)
    found = ck.latest()
    step = (found or 0) + 1
    while True:
        state = values(step, size)
        ck.save(state, step, blocking=rng.random() < 0.6).wait()
        step += 1


def _child(root: str, seed: int) -> None:  # pragma: no cover - a forked child, killed mid-flight
    """Run a saver; it says ``ready PID`` once imported. A failure before that is said instead (the sweep waits for
    that line); one after it goes to stderr (the sweep reads only ``dead`` from then on)."""
    said: list[str] = []

    def ready() -> None:
        said.append(f"ready {os.getpid()}")
        print(said[-1], flush=True)

    try:
        _saver(root, seed, ready)
    except BaseException as e:
        if said:
            traceback.print_exc()
        else:
            print(f"failed {type(e).__name__}: {e}".replace("\n", " "), flush=True)
    finally:
        os._exit(1)


def zygote_main() -> None:  # pragma: no cover - the zygote process
    import preemptible  # noqa: F401  (import once, before any fork)

    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "run":
            if os.fork() == 0:
                _child(cmd[1], int(cmd[2]))
        elif cmd[0] == "wait":
            os.waitpid(int(cmd[1]), 0)
            print("dead", flush=True)
        elif cmd[0] == "quit":
            return


@dataclass
class Sweep:
    kills: int = 0
    restores_ok: int = 0
    bad: list[str] = field(default_factory=list)
    phases: dict[str, int] = field(default_factory=dict)
    committed_steps: list[int] = field(default_factory=list)


def classify(root: Path) -> str:
    """Where the kill landed, judged from what it left behind."""
    leftovers = [d for d in root.glob("step-*") if d.is_dir() and not (d / "COMMIT.json").exists()]
    if any(p.name.startswith("COMMIT.json.tmp-") for d in root.glob("step-*") for p in d.iterdir()):
        return "during commit"
    if leftovers:
        newest = max(leftovers)
        names = [p.name for p in newest.iterdir()]
        if "state.json" in names:
            return "after data, before commit"
        return "writing data" if names else "creating the directory"
    return "between saves (capture, staging, rotation)"


def sweep(root: Path, kills: int, *, seed: int = 0, max_delay: float = 0.35) -> Sweep:
    """Kill a saver ``kills`` times at random instants; after each, restore and check."""
    rng = random.Random(seed)
    result = Sweep()
    zygote = subprocess.Popen(
        [sys.executable, "-c", "from preemptible.testing import zygote_main; zygote_main()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert zygote.stdin is not None
    assert zygote.stdout is not None
    try:
        for i in range(kills):
            _kill_a_saver(zygote, root, rng, max_delay)
            result.kills += 1
            phase = classify(root)
            result.phases[phase] = result.phases.get(phase, 0) + 1
            _restore_and_check(root, f"kill {i} ({phase})", result)
    finally:
        if zygote.stdin:
            zygote.stdin.write("quit\n")
            zygote.stdin.close()
        zygote.wait(10)
    return result


def _kill_a_saver(zygote: subprocess.Popen[str], root: Path, rng: random.Random, max_delay: float) -> None:
    """Has the zygote fork a saver into ``root``, kills it at a random instant once it is ready, and reaps it."""
    assert zygote.stdin is not None
    assert zygote.stdout is not None
    zygote.stdin.write(f"run {root} {rng.randrange(1 << 30)}\n")
    zygote.stdin.flush()
    said = zygote.stdout.readline().split(maxsplit=1)
    if not said or said[0] != "ready":
        raise RuntimeError(f"expected a saver to say 'ready PID'; it said {' '.join(said)!r}")
    pid = int(said[1])
    time.sleep(rng.uniform(0.005, max_delay))
    os.kill(pid, signal.SIGKILL)
    zygote.stdin.write(f"wait {pid}\n")
    zygote.stdin.flush()
    assert zygote.stdout.readline().strip() == "dead"


def _restore_and_check(root: Path, kill: str, result: Sweep) -> None:
    """Restores what the kill left and checks it holds exactly its step's values; counts the outcome."""
    from preemptible import Checkpointer
    from preemptible.errors import PreemptibleError

    ck = Checkpointer(str(root), keep=2)
    state = template(0)
    try:
        step = ck.restore(state)
    except PreemptibleError as e:
        result.bad.append(f"{kill}: restore failed: {e}")
        return
    if step is None:
        if ck.checkpoints():
            result.bad.append(f"{kill}: committed checkpoints exist but restore found none")
        return
    problem = check(state, step)
    if problem is None:
        try:
            ck.verify(step)
        except PreemptibleError as e:
            problem = f"verify failed: {e}"
    if problem:
        result.bad.append(f"{kill}: step {step}: {problem}")
    else:
        result.restores_ok += 1
        result.committed_steps.append(step)
