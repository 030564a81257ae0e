"""Issue 14 item 14: a finished, preempted or failed 2-rank job must never die at exit. One fresh-clone CI run in
three saw rank 0 of the FSDP2 reference job abort (``terminate called without an active exception``, SIGABRT)
after its final checkpoint committed: a C++ thread or store client destroyed while still joinable at interpreter
exit. Every path runs here, several times; any abnormal exit fails.

Rounds: ``PREEMPTIBLE_STRESS_ROUNDS`` (default 2 in CI). The documented long run:
``PREEMPTIBLE_STRESS_ROUNDS=25 .venv/bin/python -m pytest tests/e2e/test_torchrun_stress.py``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from conftest import REPO
from torchrunkit import EXAMPLE, FSDP, Torchrun, journals, last

ROUNDS = int(os.environ.get("PREEMPTIBLE_STRESS_ROUNDS", "1"))
FAIL = REPO / "tests" / "scripts" / "ddp_fail.py"
ABNORMAL = ("terminate called", "Aborted", "core dumped", "SIGABRT", "Signal 6", "exitcode: -6", "Fatal Python")


def clean(err: str) -> None:
    found = [marker for marker in ABNORMAL if marker in err]
    assert not found, f"abnormal exit ({found}):\n{err[-4000:]}"


@pytest.mark.slow
@pytest.mark.timeout(300 * ROUNDS)
@pytest.mark.parametrize("path", ["finished-ddp", "finished-fsdp2", "preempted-ddp", "preempted-fsdp2", "failed-ddp"])
def test_item_14_no_rank_dies_at_exit(tmp_path: Path, path: str) -> None:
    for i in range(ROUNDS):
        root = tmp_path / f"round{i}"
        if path == "finished-ddp":
            code, _, err = Torchrun(root, 2, "--steps", "40", "--save-every", "15").finish()
            assert code == 0, err
        elif path == "finished-fsdp2":
            code, _, err = Torchrun(root, 2, "--steps", "30", script=FSDP).finish()
            assert code == 0, err
        elif path.startswith("preempted"):
            script = FSDP if path.endswith("fsdp2") else EXAMPLE
            t = Torchrun(root, 2, "--steps", "100000", "--save-every", "1000", "--step-time", "0.01", script=script)
            t.wait_for_step(5)
            t.proc.send_signal(signal.SIGTERM)
            code, _, err = t.finish()
            assert code == 1, err  # torchrun's own answer to a SIGTERM to its agent
            exits = {r: last(ev, "exit") for r, ev in journals(root).items()}
            assert sorted(exits) == [0, 1] and all(e["code"] == 0 and e["saved"] for e in exits.values()), exits
        else:
            code, _, err = Torchrun(root, 2, script=FAIL).finish()
            assert code == 1, err
            assert "the training script's own failure at step 7" in err
            assert "exitcode: 1" in err, err[-3000:]  # the traceback's exit, not a signal at teardown
        clean(err)
