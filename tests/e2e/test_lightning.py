"""PyTorch Lightning with PreemptibleCallback (examples/lightning_fit.py: dropout, a shuffling DataLoader, StepLR per
epoch, ModelCheckpoint beside it): a real SIGTERM at a known step (mid-epoch, at an epoch's last batch; to one
worker only under torchrun/DDP), the emergency commit instead of Lightning's SIGTERMException, a resume through
``ckpt_path=cb.resume_from``, and a final state bit-identical to the run never stopped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, clean_env, journal
from preemptible.checkpoint import Checkpointer
from preemptible.state import flatten
from torchrunkit import free_port, journals, last

PL = REPO / "examples" / "lightning_fit.py"
pytestmark = pytest.mark.timeout(300)


def fit(root: Path, ranks: int = 1, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(PL)]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), str(PL), "--devices", str(ranks)]  # fmt: skip
    return subprocess.run(
        [*cmd, "--root", str(root), *args], capture_output=True, text=True, env=clean_env(**(env or {})),
        timeout=240, check=False,
    )  # fmt: skip


def final(root: Path) -> dict[str, torch.Tensor]:
    ck = Checkpointer(root)
    step = ck.latest()
    assert step is not None
    return flatten({k: v for k, v in ck.load(step).items() if not k.startswith("_")}).tensors


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    root = tmp_path_factory.mktemp("ref") / "ckpt"
    done = fit(root)
    assert done.returncode == 0 and "finished at global step 60" in done.stdout, done.stderr[-3000:]
    return final(root)


@pytest.mark.parametrize("signal_at", [19, 26], ids=["last-batch-of-an-epoch", "mid-second-epoch"])
def test_a_sigterm_commits_and_the_resume_ends_bit_identical(
    signal_at: int, reference: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    first = fit(root, 1, "--sigterm-at", str(signal_at))
    assert first.returncode == 0, first.stderr[-3000:]
    assert "SIGTERMException" not in first.stderr and "finished" not in first.stdout
    stop = last(journal(root), "exit")["step"]
    assert stop == signal_at + 1 and Checkpointer(root).latest() == stop  # the next boundary, committed
    own = sorted(int(p.stem.split("step=")[1]) for p in (tmp_path / "ckpt-lightning" / "checkpoints").glob("ep*.ckpt"))
    assert own == list(range(7, stop, 7))  # ModelCheckpoint(every_n_train_steps=7) goes on beside it
    second = fit(root)
    assert second.returncode == 0 and "finished at global step 60" in second.stdout, second.stderr[-3000:]
    assert last(journal(root), "resume")["step"] == stop
    logged = [e for e in journal(root) if e["event"] == "log" and "loss" in e]  # what the module logged, forwarded
    assert logged and all(e["step"] % 5 == 4 for e in logged), logged[:3]  # logged at global_step 5k: step 5k - 1
    assert_same(final(root), reference)


def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_and_still_ends_identical(
    reference: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    assert fit(root, 1, "--save-every", "5", "--sigterm-at", "12").returncode == 0
    assert [c.step for c in Checkpointer(root).checkpoints()][-2:] == [10, 13]
    weights = root / "step-000000000013" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # torn after the commit
    second = fit(root)
    assert second.returncode == 0 and "finished at global step 60" in second.stdout, second.stderr[-3000:]
    assert "skipping the checkpoint of step 13" in second.stderr
    assert last(journal(root), "resume")["step"] == 10
    assert_same(final(root), reference)


def test_with_exit_on_notice_false_fit_returns_and_says_preempted(tmp_path: Path) -> None:
    done = fit(tmp_path / "ckpt", 1, "--no-exit", "--sigterm-at", "6")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "preempted at global step 7" in done.stdout and "finished" not in done.stdout
    assert Checkpointer(tmp_path / "ckpt").latest() == 7


def test_a_notice_flushes_lightning_s_tensorboard_logger(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    assert fit(root, 1, "--tensorboard", "--sigterm-at", "6").returncode == 0
    (tracked,) = [e for e in journal(root) if e["event"] == "trackers"]
    assert tracked["flushed"] == 1 and tracked["step"] == 7
    assert list((tmp_path / "ckpt-tb" / "lightning_logs" / "version_0").glob("events.out.tfevents.*"))


def test_fitting_without_ckpt_path_over_existing_checkpoints_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    assert fit(root, 1, "--sigterm-at", "4").returncode == 0
    script = (  # the example as written, but fit() given no ckpt_path: cb.resume_from is never read
        "import sys, runpy\n"
        "from preemptible.integrations.lightning import PreemptibleCallback\n"
        "PreemptibleCallback.resume_from = property(lambda self: None)\n"
        f"sys.argv = ['lightning_fit.py', '--root', {str(root)!r}]\n"
        f"runpy.run_path({str(PL)!r}, run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=clean_env(), timeout=120, check=False
    )
    assert done.returncode != 0
    assert "expected trainer.fit(..., ckpt_path=cb.resume_from)" in done.stderr, done.stderr[-3000:]


def test_two_ranks_under_torchrun_stop_together_on_one_worker_s_sigterm_and_resume_identical(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ref = tmp_path_factory.mktemp("ddp-ref") / "ckpt"
    done = fit(ref, 2)
    assert done.returncode == 0 and done.stdout.count("finished at global step 30") == 2, done.stderr[-3000:]
    root = tmp_path / "ckpt"
    first = fit(root, 2, "--sigterm-at", "13", env={"SIGTERM_RANK": "1"})
    assert first.returncode == 0, first.stderr[-3000:]
    exits = {r: last(ev, "exit") for r, ev in journals(root).items()}
    (agreed,) = {e["step"] for e in exits.values()}
    assert 14 <= agreed <= 15 and all(e["saved"] for e in exits.values()), exits
    second = fit(root, 2)
    assert second.returncode == 0 and second.stdout.count("finished at global step 30") == 2, second.stderr[-3000:]
    assert_same(final(root), final(ref))
