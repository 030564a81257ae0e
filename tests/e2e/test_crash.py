"""kill -9 at random instants during back-to-back saves; every restore afterwards must be exact. CI runs a
short sweep; `python benchmarks/crash_sweep.py --kills 200` runs the full one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from preemptible.testing import sweep


@pytest.mark.slow
def test_kill_9_during_saves_never_yields_a_bad_restore(tmp_path: Path) -> None:
    kills = int(os.environ.get("PREEMPTIBLE_CRASH_KILLS", "12"))
    result = sweep(tmp_path / "ckpt", kills, seed=7)
    assert result.kills == kills
    assert result.bad == [], "\n".join(result.bad)
    assert result.restores_ok >= kills - 2  # the first kills may land before anything committed
    assert len(set(result.committed_steps)) > 1  # it really made progress between kills
