"""preemptible run: a real wrapper process around real children: an emulated AWS notice relayed as SIGTERM to a
plain Python child that never imports preemptible, signals forwarded through a shell, exit codes, orphans reaped,
and the library inside budgeting with the relayed deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import EXAMPLE, clean_env, journal, wait_for_event
from preemptible.emulate import AwsEmulator

# A child that knows nothing of preemptible: on SIGTERM/SIGUSR1 it prints what it got and the relayed notice.
PLAIN_CHILD = r"""
import json, os, signal, sys, time
got = []
signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
print("ready", flush=True)
end = time.monotonic() + 60
while not got and time.monotonic() < end:
    time.sleep(0.01)
path = os.environ.get("PREEMPTIBLE_NOTICE_FILE", "")
notice = json.load(open(path)) if path and os.path.exists(path) else None
name = signal.Signals(got[0]).name if got else None
print(json.dumps({"signal": name, "notice": notice, "at": time.time()}), flush=True)
sys.exit(7)
"""


def wrapper(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "preemptible", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(**(env or {})),
    )


def wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")


def test_an_aws_notice_reaches_a_plain_child_as_sigterm_with_its_deadline() -> None:
    with AwsEmulator() as emu:
        proc = wrapper(
            "--sources", "aws", "--", sys.executable, "-c", PLAIN_CHILD, env={"PREEMPTIBLE_AWS_ENDPOINT": emu.url}
        )
        wait_ready(proc)
        time.sleep(0.3)
        t_notice = time.time()
        emu.notice()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7, err  # the child's own code
    report = json.loads(out.strip().splitlines()[-1])
    assert report["signal"] == "SIGTERM"
    notice = report["notice"]
    assert notice["source"] == "aws" and notice["kind"] == "terminate" and notice["relayed_as"] == "SIGTERM"
    from datetime import datetime

    left = datetime.fromisoformat(notice["deadline"]).timestamp() - t_notice
    assert 100 < left <= 121  # AWS's two minutes, not a signal's default 30 s
    assert report["at"] - t_notice < 5.0  # the poller's interval plus a hop
    assert "aws terminate notice" in err and "sent SIGTERM" in err


def test_signals_reach_the_real_process_through_a_shell() -> None:
    # `sh -c "python ...; exit $?"` keeps sh as the parent: without the group, SIGUSR1 would stop at sh. With it,
    # sh dies of the signal at once while python handles it; the wrapper waits for the whole group.
    script = f"{sys.executable} -c '{PLAIN_CHILD}'; exit $?"
    proc = wrapper("--sources", "signal", "--", "sh", "-c", script)
    wait_ready(proc)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert json.loads(out.strip().splitlines()[-1])["signal"] == "SIGUSR1"  # python got it and finished
    assert proc.returncode == 128 + signal.SIGUSR1  # the command's (sh's) own end
    assert "forwarded SIGUSR1" in err


def test_exit_code_of_a_child_killed_by_a_signal_and_of_a_missing_command() -> None:
    proc = wrapper("--sources", "signal", "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)")
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + 9
    proc = wrapper("--", "/nonexistent/train")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 127 and "cannot start '/nonexistent/train'" in err
    proc = wrapper("--sources", "signal")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "expected a command" in err


def _children(pid: int) -> list[tuple[int, str, str]]:
    """(pid, state, command) of the processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            out.append((int(entry.name), fields[0], name))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers are a Linux feature")
def test_orphans_are_adopted_and_reaped() -> None:
    # the shell's subshell starts `sleep 1` and exits at once: sleep is orphaned, reparented to the wrapper (a
    # subreaper, as PID 1 would be) and must be reaped when it ends, not left a zombie
    proc = wrapper("--sources", "signal", "--", "sh", "-c", "(sleep 1 &); sleep 60")
    deadline = time.monotonic() + 50  # a hang guard only
    live: list[str] = []
    while time.monotonic() < deadline and live != ["sh", "sleep"]:
        time.sleep(0.02)
        live = sorted(name for _, state, name in _children(proc.pid) if state != "Z")
    assert live == ["sh", "sleep"], _children(proc.pid)  # the command, and the orphan it left (sleep 60 is sh's)
    # The orphan ends after 1 s; the wrapper must reap it (a zombie would stay a child of the wrapper forever).
    while time.monotonic() < deadline and [c[2] for c in _children(proc.pid)] != ["sh"]:
        time.sleep(0.02)
    assert [c[2] for c in _children(proc.pid)] == ["sh"], f"an orphan was left a zombie: {_children(proc.pid)}"
    proc.send_signal(signal.SIGTERM)  # forwarded to sh, which dies of it
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM


def test_the_library_inside_budgets_with_the_relayed_deadline(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    with AwsEmulator() as emu:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "preemptible",
                "run",
                "--sources",
                "aws",
                "--",
                sys.executable,
                str(EXAMPLE),
                "--root",
                str(root),
                "--steps",
                "100000",
                "--save-every",
                "1000",
                "--step-time",
                "0.005",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            # the child itself watches signals only: the AWS notice reaches it through the wrapper
            env=clean_env(PREEMPTIBLE_AWS_ENDPOINT=emu.url),
        )
        wait_for_event(root, lambda e: e["event"] in ("fresh", "resume"))
        emu.notice()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    (notice,) = [e for e in journal(root) if e["event"] == "notice"]
    assert notice["source"] == "aws" and "relayed as SIGTERM" in notice["detail"]
    assert notice["remaining_s"] > 100  # budgeted with AWS's 120 s, not the signal's default 30 s
    assert any(e["event"] == "save_committed" and e["reason"] == "emergency" for e in journal(root))
    assert os.environ.get("PREEMPTIBLE_NOTICE_FILE") is None


def test_torchrun_s_signal_exception_after_a_forwarded_stop_gets_a_one_line_explanation(tmp_path: Path) -> None:
    """Real torchrun under the wrapper: the SIGTERM the wrapper passes on makes torchrun's agent raise and print
    SignalException; the wrapper then says in one line that this is the stop it passed on, not a crash."""
    script = tmp_path / "worker.py"
    script.write_text(PLAIN_CHILD)
    proc = wrapper(
        "--sources", "signal", "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(script),
    )  # fmt: skip
    wait_ready(proc)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert "SignalException" in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("preemptible run: torchrun's SignalException")]
    assert "SIGTERM" in line and "not a crash" in line and f"exit code {proc.returncode}" in line
    # and a plain command gets no such line
    plain = wrapper("--sources", "signal", "--", sys.executable, "-c", PLAIN_CHILD)
    wait_ready(plain)
    plain.send_signal(signal.SIGTERM)
    _out, err = plain.communicate(timeout=30)
    assert "SignalException" not in err and "not a crash" not in err
