"""PID 1 in a container, for real: ``unshare --pid --fork --mount-proc`` makes the command PID 1 of a new PID
namespace, as in a container started without an init. SIGTERM comes from outside the namespace, as ``docker stop``
and the kubelet send it.

The kernel drops a signal sent to a namespace's PID 1 unless PID 1 handles it. So a trainer that is PID 1 itself,
or runs under ``preemptible run``, checkpoints and exits 0; a shell-form entrypoint (``sh -c "python train.py"``)
swallows the SIGTERM, the trainer never hears it, and the SIGKILL that follows loses everything since the last
checkpoint; ``exec`` or ``preemptible run`` fix it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, clean_env

TRAIN = [sys.executable, str(REPO / "examples" / "train.py")]
WRAPPER = [sys.executable, "-m", "preemptible", "run", "--"]


def unshare_ok() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False)
    return None if probe.returncode == 0 else f"unshare --pid is not allowed here: {probe.stderr.decode().strip()}"


pytestmark = pytest.mark.skipif(
    unshare_ok() is not None and os.environ.get("CI") != "true", reason=f"no PID namespaces here: {unshare_ok()}"
)


class Container:
    """``argv`` as PID 1 of a new PID namespace; ``pid`` is that PID 1 as the host sees it."""

    def __init__(self, command: list[str], root: Path) -> None:
        self.root = root
        self.log = root.parent / f"{root.name}.log"
        self.out = open(self.log, "w")  # noqa: SIM115 - closed in wait()
        argv = ["unshare", "--pid", "--fork", "--mount-proc", *command]
        self.proc = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.STDOUT, env=clean_env())
        self.pid = self._init_pid()

    def _init_pid(self) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            except OSError:
                children = []
            if children:
                return int(children[0])
            time.sleep(0.02)
        raise AssertionError("unshare never forked the namespace's PID 1")

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never printed {text!r}:\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.05)

    def namespace_processes(self) -> list[tuple[str, str]]:
        """(command, state letter) of every process in the container's PID namespace (state Z: a zombie)."""
        ns = os.readlink(f"/proc/{self.pid}/ns/pid")
        found = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if os.readlink(p / "ns" / "pid") == ns:
                        name, rest = (p / "stat").read_text().split(" (", 1)[1].rsplit(")", 1)
                        found.append((name, rest.split()[0]))
                except OSError:
                    continue
        return found

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.out.close()


def run_line(root: Path) -> list[str]:
    return [*TRAIN, "--root", str(root), "--steps", "100000", "--save-every", "100000"]


def shell(argv: list[str]) -> str:
    return " ".join(argv)


def committed(root: Path) -> list[str]:
    return sorted(p.parent.name for p in root.glob("step-*/COMMIT.json"))


@pytest.mark.parametrize(
    "entrypoint",
    ["python as PID 1", "preemptible run as PID 1", "sh -c 'exec python'", "preemptible run -- sh -c 'python'"],
)
def test_sigterm_to_pid_1_checkpoints_and_exits_0(tmp_path: Path, entrypoint: str) -> None:
    root = tmp_path / "ckpt"
    line = run_line(root)
    command = {
        "python as PID 1": line,
        "preemptible run as PID 1": [*WRAPPER, *line],
        "sh -c 'exec python'": ["sh", "-c", f"exec {shell(line)}"],
        "preemptible run -- sh -c 'python'": [*WRAPPER, "sh", "-c", f"{shell(line)}; echo trainer exited"],
    }[entrypoint]
    c = Container(command, root)
    c.wait_for("step 30 ")
    os.kill(c.pid, signal.SIGTERM)
    # under `preemptible run -- sh -c ...` the shell dies of the SIGTERM it was sent with the group (143, as the
    # README says: the wrapper exits with its command's code) while the trainer under it saves and exits 0
    expected = 143 if entrypoint.endswith("sh -c 'python'") else 0
    assert c.wait() == expected, c.log.read_text()[-3000:]
    assert committed(root), c.log.read_text()[-3000:]
    assert "emergency checkpoint of step" in c.log.read_text()


def test_a_shell_form_entrypoint_loses_the_sigterm(tmp_path: Path) -> None:
    """``sh -c "python train.py; ..."`` as PID 1: sh has no SIGTERM handler, so the kernel drops the signal; the
    trainer never hears it, and the SIGKILL at the end of the grace period loses the run since its last save."""
    root = tmp_path / "ckpt"
    c = Container(["sh", "-c", f"{shell(run_line(root))}; echo trainer exited"], root)
    c.wait_for("step 30 ")
    os.kill(c.pid, signal.SIGTERM)
    c.wait_for("step 200 ")  # still training well after the SIGTERM: nobody heard it
    assert "notice" not in c.log.read_text() and not committed(root)
    os.kill(c.pid, signal.SIGKILL)  # what docker and the kubelet do once the grace period is over
    assert c.wait() != 0  # unshare reports its PID 1 killed
    assert not committed(root)  # everything since the start is lost


def test_preemptible_run_as_pid_1_reaps_orphans(tmp_path: Path) -> None:
    """An orphan that exits under PID 1 stays a zombie unless PID 1 waits for it; ``preemptible run`` does."""
    root = tmp_path / "ckpt"
    orphans = "for i in 1 2 3; do (sleep 0.2 &) ; done"
    c = Container([*WRAPPER, "sh", "-c", f"{orphans}; exec {shell(run_line(root))}"], root)
    c.wait_for("step 30 ")
    # The orphans end after 0.2 s; reaped, they are gone. Unreaped, they stay zombies (Z) until the guard fails.
    deadline = time.monotonic() + 30
    while any(name == "sleep" for name, _ in c.namespace_processes()):
        assert time.monotonic() < deadline, f"orphans never reaped: {c.namespace_processes()}"
        time.sleep(0.05)
    os.kill(c.pid, signal.SIGTERM)
    assert c.wait() == 0
