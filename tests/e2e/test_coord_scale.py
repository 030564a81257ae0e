"""Issue 15, the small form of the coordination simulator (benchmarks/coord_sim.py): the real agreement, commit
barrier, restore agreement and shared-root check for many simulated ranks against one real TCPStore server
process. It asserts counts, never times: no store traffic without a notice, and O(1) keys read per rank in every
protocol, the same at 16 ranks as at 64 (an O(N) read per rank would be O(N^2) for the store)."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import coord_sim


@pytest.fixture(scope="module")
def rows() -> dict[int, dict[str, Any]]:
    os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")  # see coord_sim.main: no DNS on CI hosts either
    return {n: coord_sim.simulate(n, rtt_ms=0.0, steady_s=1.5, procs=2) for n in (16, 64)}


@pytest.mark.timeout(600)
def test_no_store_requests_without_a_notice(rows: dict[int, dict[str, Any]]) -> None:
    for n, row in rows.items():
        assert row["start_requests_per_rank"] == 1.0, row  # one blocking wait per rank, then silence
        assert row["steady_req_per_rank_s"] == 0.0, (n, row)


@pytest.mark.timeout(600)
def test_every_protocol_reads_a_constant_number_of_keys_per_rank(rows: dict[int, dict[str, Any]]) -> None:
    for phase in ("agreement", "commit", "restore", "shared"):
        per_rank = {n: row[f"{phase}_keys_read_per_rank"] for n, row in rows.items()}
        for n, keys in per_rank.items():  # at most 3 per rank, plus the announcer's one compare_set
            assert round(keys * n) <= 3 * n + 1, (phase, per_rank)
        assert round(per_rank[16]) == round(per_rank[64]), (phase, per_rank)  # does not grow with N
    requests = {n: row["agreement_requests_per_rank"] for n, row in rows.items()}
    assert max(requests.values()) <= 6, requests
