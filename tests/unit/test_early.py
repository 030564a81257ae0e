"""A Slurm ``--signal`` warning (SIGUSR1) that comes while Python is still starting, before preemptible listens.

Real interpreters started with the installed ``preemptible_early.pth``: each child says it is up, then blocks on
stdin; the test sends SIGUSR1 and only then lets it go on, so the signal always arrives before the child starts a
source (or, without the hook, while nothing handles it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env

SLURM = {"SLURM_JOB_ID": "41", "SLURM_PROCID": "0", "PREEMPTIBLE_SLURM_REQUEUE": "0"}

WAIT = "import sys\nprint('up', flush=True)\nsys.stdin.readline()\n"

LISTENS = (
    WAIT
    + """
import json, time
from preemptible.sources.signals import SignalSource
got = []
started = time.time()
source = SignalSource(grace_by_signal={__import__('signal').SIGUSR1: 90.0})
source.start(got.append)
print(json.dumps([{"detail": n.detail, "received": n.received_at.timestamp(), "deadline": n.deadline.timestamp(),
                   "started": started} for n in got]))
source.close()
"""
)

TRAINS = (
    WAIT
    + """
import torch
from preemptible import Run
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with Run(root=sys.argv[1], model=model, optimizer=opt, save_every=1000) as run:
    for step in run.steps(50):
        opt.zero_grad(); model(torch.ones(3, 4)).sum().backward(); opt.step()
print("stopped at", run.step, flush=True)
"""
)


def start(code: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None and child.stdout.readline() == "up\n"
    return child


def usr1_then_go(child: subprocess.Popen[str]) -> tuple[int, str, str]:
    child.send_signal(signal.SIGUSR1)
    out, err = child.communicate("go\n", timeout=120)
    return child.returncode, out, err


def test_a_warning_before_the_source_starts_becomes_a_notice_dated_when_it_came() -> None:
    rc, out, err = usr1_then_go(start(LISTENS, clean_env(**SLURM)))
    assert rc == 0, err
    (notice,) = json.loads(out)
    assert notice["detail"] == "SIGUSR1"
    assert notice["received"] <= notice["started"]  # its arrival, not the moment the source took it over
    assert notice["deadline"] == pytest.approx(notice["received"] + 90.0)


def test_a_run_that_starts_after_the_warning_stops_cleanly_at_its_first_boundary(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    rc, out, err = usr1_then_go(start(TRAINS, clean_env(**SLURM), str(root)))
    assert rc == 0, err
    assert "stopped at" not in out, "the run ends the process at the notice, before any step"
    events = [json.loads(line) for f in sorted(root.glob("**/*.jsonl")) for line in f.read_text().splitlines()]
    (notice,) = (e for e in events if e["event"] == "notice")
    assert notice["detail"] == "SIGUSR1" and notice["step"] == 0
    assert notice["received_at"].replace("+00:00", "") < events[0]["t"].rstrip("Z")  # before the run started
    assert [e["event"] for e in events][-3:] == ["save_skipped", "requeue", "exit"]  # nothing trained yet to save
    assert events[-1]["code"] == 0 and events[-1]["reason"] == "notice"


def test_a_process_that_never_listens_is_not_killed_by_it() -> None:
    """torchrun's agent under ``srun`` gets the step's USR1 too; dying of it would take its workers down."""
    rc, _, err = usr1_then_go(start(WAIT + "print('finished')\n", clean_env(**SLURM)))
    assert rc == 0, err


@pytest.mark.parametrize("env", [{}, {**SLURM, "PREEMPTIBLE_EARLY": "0"}], ids=["outside-slurm", "turned-off"])
def test_outside_slurm_or_turned_off_the_default_action_stands(env: dict[str, str]) -> None:
    rc, _, _ = usr1_then_go(start(WAIT, clean_env(**env)))
    assert rc == -signal.SIGUSR1


CHECK_INSTALL = """
import signal
import _preemptible_early as e
slurm = {"SLURM_JOB_ID": "41"}
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
print(e.install(slurm), signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN)
signal.signal(signal.SIGUSR1, signal.SIG_DFL)
print(e.install(slurm), signal.getsignal(signal.SIGUSR1) == e.hold)
"""


def test_a_handler_already_there_is_left_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK_INSTALL], check=False, capture_output=True, text=True, env=clean_env()
    )
    assert done.stdout.split() == ["False", "True", "True", "True"], done.stderr


def test_after_a_finished_run_a_late_warning_is_ignored_even_while_held() -> None:
    """The hold is a Python-level handler, and Python puts those back to the default as it shuts down: a warning
    in that moment would turn a finished job into a FAILED one (seen in CI). After a finished run it is ignored."""
    code = "import signal\nfrom preemptible.run import _ignore_late_warning\n_ignore_late_warning()\n"
    code += "print(signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN)"
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, env=clean_env(**SLURM)
    )
    assert done.stdout.split() == ["True"], done.stderr
