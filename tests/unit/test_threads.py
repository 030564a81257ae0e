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


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a Python process of its own, in the repository, with a clean environment."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        check=False,
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=300,
    )


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
    proc = _python(SAVE_AT_EXIT, str(tmp_path / "ckpt"))
    assert proc.returncode == 0 and "saved and restored at exit" in proc.stdout, proc.stderr
    assert "Error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    files = {p.name for p in (tmp_path / "ckpt" / "packed" / "step-000000000002").iterdir()}
    assert any(name.endswith(".safetensors.zst") for name in files), files


# the storage's own time ----------------------------------------------------------------------------------
WAIT_FOR_A_CPU = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from preemptible.store.threads import run_queue_s

    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    hog = subprocess.Popen([sys.executable, "-c", "import os, sys; os.sched_setaffinity(0, {%d}); print(flush=True)\\n"
                            "while True: pass" % cpu], stdout=subprocess.PIPE)
    hog.stdout.readline()  # pinned to this CPU and spinning
    try:
        before, t0 = run_queue_s(), time.thread_time()
        while time.thread_time() - t0 < 0.2:  # 0.2 s of CPU, on a CPU shared with the hog
            pass
        shared = run_queue_s() - before
    finally:
        hog.kill()
    before = run_queue_s()
    time.sleep(0.2)  # asleep, not waiting for a CPU
    asleep = run_queue_s() - before
    print(shared, asleep)
    """
)


@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(), reason="Linux schedstat only")
def test_a_thread_that_shares_its_cpu_has_waited_for_it_and_one_asleep_has_not() -> None:
    proc = _python(WAIT_FOR_A_CPU)
    assert proc.returncode == 0, proc.stderr
    shared, asleep = map(float, proc.stdout.split())
    assert shared > 0.05, proc.stdout  # CFS shares the CPU with the hog: about as long waiting as running
    assert asleep < shared, proc.stdout


class _Clocks:
    """Fake wall and wait clocks: each reading of the wall clock moves it on by ``wall`` s, of the wait by ``wait``."""

    def __init__(self, wall: float, wait: float) -> None:
        self.step = (wall, wait)
        self.now = [0.0, 0.0]

    def read(self, i: int) -> float:
        self.now[i] += self.step[i]
        return self.now[i]


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "compressed"])
def test_the_destinations_time_leaves_out_the_writers_wait_for_a_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compressed: bool
) -> None:
    """A write's wall time less the writer's wait for a CPU meanwhile is what a save learns the destination's
    bandwidth from (`Checkpointer.storage_bandwidth`): a writer starved by training must not make the disk look slow."""
    import torch

    from preemptible.store import threads
    from preemptible.store.compress import Codec
    from preemptible.store.io import LocalStorage
    from preemptible.writer import FileSpec, write_tensor_file

    items = tuple((f"t{i}", torch.full((40_000,), float(i))) for i in range(8))  # small ones coalesced, and not
    items += (("big", torch.arange(600_000, dtype=torch.float32)),)
    codec = Codec(threads=2) if compressed else None

    def io_seconds(clocks: _Clocks) -> float:
        monkeypatch.setattr(threads, "_wall", lambda: clocks.read(0))
        monkeypatch.setattr(threads, "run_queue_s", lambda: clocks.read(1))
        io: list[tuple[int, float]] = []
        target = tmp_path / str(len(list(tmp_path.iterdir())))
        target.mkdir()
        spec = FileSpec("m.safetensors", items, {})
        write_tensor_file(LocalStorage(str(target)), str(target), spec, codec=codec, io=io)
        return sum(s for _, s in io)

    assert io_seconds(_Clocks(wall=1.0, wait=1.0)) == 0.0  # all of every call a wait for a CPU
    calls = io_seconds(_Clocks(wall=1.0, wait=0.0))  # 1 s per storage call: the number of calls timed
    assert calls >= 2  # the writes and the close
    assert io_seconds(_Clocks(wall=1.0, wait=0.75)) == pytest.approx(0.25 * calls)
    assert io_seconds(_Clocks(wall=1.0, wait=2.0)) == 0.0  # never below zero
    if codec is not None:
        codec.close()
