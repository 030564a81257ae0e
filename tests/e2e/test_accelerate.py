"""The Accelerate recipe (examples/accelerate_loop.py: `Accelerator.prepare`, then `run.epochs`/`run.batches`):
a real SIGTERM at a chosen step in the second epoch (to one worker only under torchrun), the emergency commit, a
resume, and a final state bit-identical to the run never stopped: in one process with the default sampler and
with the seedable one, and as 2 ranks (where Accelerate gives the sampler a generator of its own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, clean_env
from preemptible.checkpoint import Checkpointer
from preemptible.state import flatten
from torchrunkit import free_port, journals, last

ACC = REPO / "examples" / "accelerate_loop.py"
pytestmark = pytest.mark.timeout(300)


def launch(root: Path, ranks: int, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(ACC)]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), str(ACC)]  # fmt: skip
    return subprocess.run(
        [*cmd, "--root", str(root), *args], capture_output=True, text=True, env=clean_env(), timeout=240, check=False
    )


def final(root: Path) -> dict[str, torch.Tensor]:
    ck = Checkpointer(root)
    step = ck.latest()
    assert step is not None
    return flatten({k: v for k, v in ck.load(step).items() if not k.startswith("_")}).tensors


@pytest.mark.parametrize(
    ("ranks", "stop", "extra"),
    [
        (1, 27, ()),
        (1, 27, ("--seedable",)),
        (2, 13, ("--sigterm-rank", "1")),
        # Steps of 50 ms: the ranks' agreement on the stop (through the store, a few ms) lands while the accumulation
        # still runs, as in training, not two 1 ms steps later (on a loaded machine) at its optimizer step.
        (1, 25, ("--accumulate", "4", "--step-time", "0.05")),
        (2, 11, ("--sigterm-rank", "1", "--accumulate", "4", "--step-time", "0.05")),
    ],
    ids=[
        "one-process",
        "one-process-seedable",
        "two-ranks-sigterm-to-rank-1",
        "one-process-accumulating",
        "two-ranks-accumulating",
    ],
)
def test_a_sigterm_in_the_second_epoch_resumes_bit_identical(
    ranks: int, stop: int, extra: tuple[str, ...], tmp_path: Path
) -> None:
    reference = launch(tmp_path / "ref", ranks, *extra)
    assert reference.returncode == 0, reference.stderr[-3000:]
    first = launch(tmp_path / "ckpt", ranks, "--sigterm-at", str(stop), *extra)
    assert first.returncode == 0, first.stderr[-3000:]
    exits = {r: last(ev, "exit") for r, ev in journals(tmp_path / "ckpt").items()}
    (agreed,) = {e["step"] for e in exits.values()}  # one stop step on every rank: this one, or the next when
    assert all(e["saved"] for e in exits.values()), exits
    if "--accumulate" not in extra:
        assert stop <= agreed <= stop + 1, exits  # another rank had already completed it (the store agreement)
    else:  # it trains on to the optimizer step that ends the accumulation: 28 (20 batches an epoch), or 14 (10)
        assert agreed == {1: 28, 2: 14}[ranks], exits
        notices = [last(ev, "notice") for ev in journals(tmp_path / "ckpt").values()]
        assert all(n["step"] == agreed and n.get("waited_for_optimizer_steps", 0) >= 1 for n in notices), notices
    second = launch(tmp_path / "ckpt", ranks, *extra)
    assert second.returncode == 0, second.stderr[-3000:]
    assert all(last(ev, "resume")["step"] == agreed for ev in journals(tmp_path / "ckpt").values())
    ours, theirs = final(tmp_path / "ckpt"), final(tmp_path / "ref")
    assert ours.keys() == theirs.keys()
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []
