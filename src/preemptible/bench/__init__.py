"""Checkpoint benchmarks: preemptible beside torch.save, torch.distributed.checkpoint and safetensors, and beside
the machine's own limits (fsync'd write and read of the same bytes, memcpy into reused buffers).

Every contender runs once per round, rounds are interleaved (the machine's drift hits all alike), medians are
reported with ratios. Nothing here is a pass/fail gate: it measures. ``preemptible bench`` and the scripts in
``benchmarks/`` run these scenarios.

The parts, each a private module: `_workloads` (the states, the training job), `_measure` (memory, I/O, CPU),
`_contenders` (what is timed), `_beside` (training beside a background save), `_scenario` (rounds, reports,
`main`) and `_paced` (storage and a TCP link paced to a rate, for a slow destination on a fast machine).
"""

from preemptible.bench._beside import beside_report, training_beside
from preemptible.bench._contenders import WARM_READS, WARM_SAVES, Contender, Result, Sample, contenders, median_of
from preemptible.bench._measure import (
    CPU_FIELDS,
    PeakRSS,
    checksum_share,
    cpu_times,
    drop_cache,
    fsync_path,
    raw_read,
    raw_read_tree,
    raw_write,
)
from preemptible.bench._paced import BURST_S, PacedProxy, PacedStorage, Pacer
from preemptible.bench._scenario import main, report, run_scenario
from preemptible.bench._workloads import flat_tensors, large_state, plain, small_state, train_steps

__all__ = [
    "BURST_S",
    "CPU_FIELDS",
    "WARM_READS",
    "WARM_SAVES",
    "Contender",
    "PacedProxy",
    "PacedStorage",
    "Pacer",
    "PeakRSS",
    "Result",
    "Sample",
    "beside_report",
    "checksum_share",
    "contenders",
    "cpu_times",
    "drop_cache",
    "flat_tensors",
    "fsync_path",
    "large_state",
    "main",
    "median_of",
    "plain",
    "raw_read",
    "raw_read_tree",
    "raw_write",
    "report",
    "run_scenario",
    "small_state",
    "train_steps",
    "training_beside",
]
