from __future__ import annotations

import subprocess
import sys

import pytest

import preemptible
from preemptible.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"preemptible {preemptible.__version__}"


def test_help_without_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "usage: preemptible" in capsys.readouterr().out


def test_console_script_is_installed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "preemptible", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert preemptible.__version__ in out


def test_import_starts_nothing() -> None:
    code = (
        "import signal, threading; before = signal.getsignal(signal.SIGTERM); import preemptible; "
        "assert signal.getsignal(signal.SIGTERM) == before; assert threading.active_count() == 1; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "ok", out.stderr
