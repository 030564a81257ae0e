"""What saves measure and what later saves decide by it: the bandwidth of a save and of the destination, the fixed
cost of a commit, this state's compression ratio and speed, and from those each save's compression choice."""

from __future__ import annotations

import os
from typing import Any

from preemptible.checkpoint.commit import Job
from preemptible.checkpoint.handle import SaveResult
from preemptible.store import compress as compress_mod
from preemptible.writer import SavePlan


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class Measurements:
    """The figures recent saves measured (see `Checkpointer`'s attributes), and the choices made from them.

    ``compress``: the setting (True, False or ``"auto"``, checked by the `Checkpointer`).
    """

    def __init__(self, *, compress: bool | str) -> None:
        self.compress = compress
        self.bandwidth: float | None = None
        self.storage_bandwidth: float | None = None
        self.fixed_s = 0.05  # directory creation, fsyncs and the commit marker: refined by every save
        self.compression: compress_mod.Measured | None = None
        self.last_choice: compress_mod.Choice | None = None

    def predict(self, nbytes: int) -> float | None:
        """Seconds a save of ``nbytes`` should take from here, by the bandwidth recent saves measured."""
        if not self.bandwidth:
            return None
        return round(nbytes / self.bandwidth + self.fixed_s, 3)

    def codec(
        self, plan: SavePlan, *, background: bool, threads: int, object_store: bool
    ) -> tuple[compress_mod.Choice, compress_mod.Codec | None]:
        """Whether this save compresses (see `compress_mod.choose`), and the codec that does it; ``threads``: the
        save's writer threads."""
        if (
            self.compress == "auto"
            and self.compression is None
            and plan.nbytes >= compress_mod.MIN_AUTO_BYTES
            and compress_mod.weighed_bandwidth(self.storage_bandwidth, object_store=object_store) is not None
        ):
            self.compression = compress_mod.measure(
                (t, spec.stored.get(n, t.dtype)) for spec in plan.specs for n, t in spec.items
            )
        choice = compress_mod.choose(
            plan.nbytes,
            setting=self.compress,
            measured=self.compression,
            bandwidth=self.storage_bandwidth,
            threads=threads,
            cores=cores(),
            background=background,
            object_store=object_store,
        )
        self.last_choice = choice
        if not choice.on:
            return choice, None
        return choice, compress_mod.Codec(threads=1 if background else max(1, min(threads, cores())))

    def learn_compression(self, codec: compress_mod.Codec) -> dict[str, Any]:
        """What a compressed save measured of this state: its ratio and its compression speed (for the journal)."""
        stats = codec.stats
        if not stats.decoded:
            return {}
        if stats.encode_s > 0:
            ratio, rate = stats.stored / stats.decoded, stats.decoded / stats.encode_s
            old = self.compression
            if old is not None:
                ratio, rate = 0.5 * (old.ratio + ratio), 0.5 * (old.rate + rate)
            self.compression = compress_mod.Measured(ratio, rate, stats.decoded)
        return {
            "decoded_bytes": stats.decoded,
            "stored_bytes": stats.stored,
            "ratio": round(stats.stored / stats.decoded, 4),
            "encode_cpu_s": round(stats.encode_s, 4),
            "io_s": round(stats.io_s, 4),
        }

    def learn(self, job: Job, result: SaveResult) -> dict[str, Any] | None:
        """Refine the figures by a committed save; returns its compression figures for the journal (None when it
        did not compress). Closes the job's codec."""
        compression: dict[str, Any] | None = None
        if job.codec is not None:
            job.codec.close()
            compression = self.learn_compression(job.codec)
        write_s = result.timings.get("write", 0.0)
        if result.timings.get("io") and job.stored_here:  # the destination's bandwidth: stored bytes over the
            bw = job.stored_here / result.timings["io"]  # seconds it took to take them in
            old = self.storage_bandwidth
            self.storage_bandwidth = bw if old is None else 0.5 * old + 0.5 * bw
        state_bytes = job.progress.total or result.bytes  # the state's bytes, compressed or not
        if state_bytes and write_s > 0:
            bw = state_bytes / write_s
            self.bandwidth = bw if self.bandwidth is None else 0.5 * self.bandwidth + 0.5 * bw
            self.fixed_s = 0.5 * self.fixed_s + 0.5 * result.timings.get("commit", self.fixed_s)
        return compression
