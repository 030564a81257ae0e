"""The worker threads of saves and restores (`preemptible.store.threads.Pool`), and saves made while the interpreter
shuts down, from an ``atexit`` handler (where `concurrent.futures` refuses new work)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from conftest import REPO, clean_env
from preemptible.store.threads import Pool


def _pool_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name)]


def test_a_pool_runs_its_work_on_at_most_its_threads_and_hands_back_results_and_errors() -> None:
    barrier = threading.Barrier(3, timeout=30)  # both workers and this thread: the two jobs run at once
    with Pool(2, "test-pool") as pool:
        first = pool.submit(lambda: (barrier.wait(), threading.current_thread().name)[1])
        second = pool.submit(lambda: (barrier.wait(), threading.current_thread().name)[1])
        barrier.wait()
        names = {first.result(timeout=30), second.result(timeout=30)}
        assert names == {"test-pool-0", "test-pool-1"}
        failed = pool.submit(int, "x")
        with pytest.raises(ValueError, match="invalid literal"):
            failed.result(timeout=30)
        assert [pool.submit(pow, 2, k).result(timeout=30) for k in range(5)] == [1, 2, 4, 8, 16]
        assert len(_pool_threads("test-pool")) == 2
    assert not _pool_threads("test-pool"), "shutdown left a worker running"
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(int, "1")


SAVE_AT_EXIT = textwrap.dedent(
    """
    import atexit, hashlib, sys
    import torch
    from preemptible import Checkpointer
    from preemptible.bench import small_state

    root = sys.argv[1]
    small = small_state(2000, 40e6)  # mostly small tensors: an emergency save fills the staging arena as it writes
    big = {"w": torch.nn.Linear(512, 512)}
    plain, packed = Checkpointer(root + "/small"), Checkpointer(root + "/packed", compress=True)
    plain.save(small, 1, blocking=False).wait()  # its arena laid out, as a run's background save does

    def digest(state):
        h = hashlib.sha256()
        for k, v in sorted(state["model"].state_dict().items()):
            h.update(v.numpy().tobytes())
        return h.hexdigest()

    def last():  # a training script's last resort: save on the way out
        before = (digest(small), digest({"model": big["w"]}))
        plain.save(small, 2, reason="emergency").wait()
        packed.save(big, 2).wait()
        with torch.no_grad():
            for p in small["model"].parameters():
                p.zero_()
            big["w"].weight.zero_()
        assert Checkpointer(root + "/small").restore(small) == 2
        assert Checkpointer(root + "/packed").restore(big) == 2
        assert (digest(small), digest({"model": big["w"]})) == before
        print("saved and restored at exit", flush=True)

    atexit.register(last)
    """
)


def test_a_save_from_an_atexit_handler_is_written_and_restores(tmp_path: Path) -> None:
    """By then `concurrent.futures` refuses new work; a compressed save and restore, and an emergency save of small
    tensors that fills its arena ahead of its writes, use threads of their own and go through."""
    script = tmp_path / "save_at_exit.py"
    script.write_text(SAVE_AT_EXIT)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt")],
        check=False,
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0 and "saved and restored at exit" in proc.stdout, proc.stderr
    assert "Error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    files = {p.name for p in (tmp_path / "ckpt" / "packed" / "step-000000000002").iterdir()}
    assert any(name.endswith(".safetensors.zst") for name in files), files
