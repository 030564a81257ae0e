"""Coordination at scale, simulated: the project's real coordination code for N ranks against one real TCPStore.

The store server runs in its own process, as torchrun's agent hosts it. The N simulated ranks run as threads in a
few worker processes, each rank with its own store client (client-side contention included), with no training.
Each rank runs the real code: `preemptible.dist.StoreAgreement` (the stop-step agreement), the commit barrier
(`preemptible.dist.commit_barrier`), the restore agreement (`preemptible.dist.agree`) and the shared-root check
(`preemptible.dist.check_shared_root`). A client-side wrapper counts requests and keys read, and can add a fixed
delay per request to model a cross-node round trip (``--rtt-ms``). It does not serialise requests.

Measured per N:
- steady-state store requests per rank per second with no notice;
- notice latency: from one rank's notice to every rank knowing the stop step;
- commit-barrier, restore-agreement and shared-root latencies;
- keys read per rank during the agreement;
- the store server's CPU seconds and open connections, and the simulated clients' CPU seconds;
- each phase's latency on a cluster (``*_projected_s``): the server's CPU, one rank's share of the clients' CPU,
  and a round trip per request of a rank (see `projected`).

    .venv/bin/python benchmarks/coord_sim.py --ranks 64 256 1024 4096 --rtt-ms 0.2
    .venv/bin/python benchmarks/coord_sim.py --ranks 64 --json out.json

This machine has 2 cores: every wall time includes the N threads and the server competing for them, and follows
their total CPU over the cores. A real job spreads ranks over nodes, so the wall times here are an upper bound for
the same protocol; request counts and CPU seconds are exact either way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

SERVER = """
import sys, time, datetime
import torch.distributed as d

s = d.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=600))
print(s.port, flush=True)
sys.stdin.read()
"""

ROUND_TRIPS = {
    "set": 0, "multi_set": 0, "append": 0,  # one-way: the client sends and goes on (measured: 5 us against 60)
    "get": 2, "multi_get": 2,  # a wait, then the get
    "add": 1, "check": 1, "wait": 1, "compare_set": 1, "delete_key": 1, "num_keys": 1,
}  # fmt: skip
"""Per call of the store's API: how many replies the client waits for (torch 2.x TCPStore). Each call is at
least one request to the server; a get is two."""


class Counting:
    """A store client that counts requests and keys read, and sleeps ``delay_s`` per round trip of each call."""

    def __init__(self, inner: Any, delay_s: float, tally: dict[str, int], lock: threading.Lock) -> None:
        self._inner = inner
        self._delay = delay_s
        self._tally = tally
        self._lock = lock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in ROUND_TRIPS:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            keys = len(args[0]) if name == "multi_get" else 1 if name in ("get", "compare_set") else 0
            with self._lock:
                self._tally["requests"] += max(1, ROUND_TRIPS[name])
                self._tally["keys_read"] += keys
            if self._delay and ROUND_TRIPS[name]:
                time.sleep(self._delay * ROUND_TRIPS[name])
            return attr(*args, **kwargs)

        return call


def server_stats(pid: int) -> tuple[float, int]:
    """CPU seconds used and open file descriptors of the store server."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    return cpu, len(os.listdir(f"/proc/{pid}/fd"))


@contextmanager
def store_server() -> Iterator[tuple[int, int]]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    try:
        yield port, proc.pid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


# one worker process: many ranks as threads ---------------------------------------------------------------------
def _worker(ranks: list[int], world: int, where: tuple[int, float, str], conn: Any) -> None:
    """``where``: the store's port, the injected round trip in seconds, the shared root."""
    port, rtt_s, root = where
    from preemptible import dist
    from preemptible.notice import Flag, Notice, NoticeKind
    from preemptible.store.io import LocalStorage

    threading.stack_size(512 << 10)
    # Up to 1,024 ranks share this interpreter's lock; at the default 5 ms switch interval, every thread waiting for
    # it wakes each 5 ms to ask for it, and that churn tripled the clients' CPU at 4,096 ranks. A real rank is
    # its own process with a couple of threads, so a longer interval only takes out an artefact of the simulation.
    sys.setswitchinterval(float(os.environ.get("COORD_SIM_SWITCH_S", "0.05")))
    if os.environ.get("COORD_SIM_DEBUG"):  # seconds: dump every thread's stack then, and exit
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["COORD_SIM_DEBUG"]), exit=True)
    locks = {r: threading.Lock() for r in ranks}  # one per rank: the tally is not a point of contention
    tallies = {r: {"requests": 0, "keys_read": 0} for r in ranks}
    coords = {}
    for r in ranks:
        c = dist.Coordinator(rank_=r, world=world, address=("127.0.0.1", port), timeout_s=600)
        c.wrap = lambda inner, t=tallies[r], k=locks[r]: Counting(inner, rtt_s, t, k)
        coords[r] = c
    notice = Notice(source="sim", kind=NoticeKind.TERMINATE, received_at=datetime.now(timezone.utc), deadline=None)
    local = {r: Flag() for r in ranks}  # each rank's guard board event
    agreements: dict[int, Any] = {}
    failed = threading.Event()  # a rank's error: the others stop looping

    legacy = not hasattr(dist, "commit_barrier")  # an older revision: its protocols, as its own code ran them

    def make(r: int) -> None:
        if not legacy:
            with coords[r].borrow():  # connect first, as a long-running job has (pooled clients are reused)
                pass
        kwargs: dict[str, Any] = {} if legacy else {"local_event": local[r]}
        agreements[r] = dist.StoreAgreement(
            coords[r], record=lambda n: None, local_notice=lambda r=r: notice if local[r].is_set() else None, **kwargs
        )

    def session(r: int) -> Any:
        """A store client as the revision's own code got one: pooled, or (older) a new one per round."""
        return contextlib.nullcontext(coords[r].client()) if legacy else coords[r].borrow()

    def commit(r: int) -> None:
        with session(r) as store:
            commit_on(r, store)

    def commit_on(r: int, store: Any) -> None:
        records = json.dumps({"files": {"x": [1, "0"]}})
        if legacy:  # what Committer.write did: every rank read every report, then the others the outcome
            coords[r].exchange(store, "save/1/report", records)
        else:
            dist.commit_barrier(coords[r], store, "save/1/report", records)
        if r == 0:
            store.set("save/1/outcome", "committed")
        else:
            coords[r].collect_one(store, "save/1/outcome")

    def restore(r: int) -> None:
        with session(r) as store:
            restore_on(r, store)

    def restore_on(r: int, store: Any) -> None:
        doc = json.dumps({"ok": True, "kind": "ok", "why": ""})
        if legacy:
            coords[r].exchange(store, "restore/1", doc)
        else:
            dist.agree(coords[r], store, "restore/1", doc)

    def run_all(fn: Any) -> dict[int, float]:
        """Run ``fn(rank)`` on every rank at once; returns when each finished (monotonic)."""
        done: dict[int, float] = {}
        errors: list[BaseException] = []
        failed.clear()

        def body(r: int) -> None:
            try:
                fn(r)
                done[r] = time.monotonic()
            except BaseException as e:
                errors.append(e)
                failed.set()

        threads = [threading.Thread(target=body, args=(r,)) for r in ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return done

    def snapshot() -> dict[str, float]:
        counts: dict[str, float] = {}
        for r, t in tallies.items():
            with locks[r]:
                for k in ("requests", "keys_read"):
                    counts[k] = counts.get(k, 0) + t[k]
        cpu = os.times()
        return {**counts, "cpu": cpu.user + cpu.system}  # this process's CPU seconds (its ranks' client work)

    while True:
        cmd, arg = conn.recv()
        if cmd == "stop":
            for a in agreements.values():
                a.close()
            conn.send(("ok", None))
            return
        if cmd == "start":
            run_all(make)
            conn.send(("ok", snapshot()))
        elif cmd == "count":
            conn.send(("ok", snapshot()))
        elif cmd == "notice":  # rank ``arg`` records a notice; every rank waits until it knows the stop step
            for r in ranks:
                agreements[r]._completed = 100 + r % 3  # steps completed so far (the loop's should_stop sets it)
            t0 = time.monotonic()
            if arg in ranks:
                local[arg].set()

            for r in ranks:  # in turn, in this thread: once the last returns, every rank knew (no extra threads)
                if not agreements[r]._known.wait(600):
                    raise RuntimeError(f"rank {r} never learned the stop step")
                if agreements[r]._error is not None:
                    raise agreements[r]._error
            done = time.monotonic()
            stops = {agreements[r].stop_step for r in ranks}
            conn.send(("ok", {"t0": t0, "done": done, "stops": sorted(stops), **snapshot()}))
        elif cmd == "commit":
            done = run_all(commit)
            conn.send(("ok", {"done": max(done.values()), **snapshot()}))
        elif cmd == "restore":
            done = run_all(restore)
            conn.send(("ok", {"done": max(done.values()), **snapshot()}))
        elif cmd == "shared":
            storage = LocalStorage(root)
            done = run_all(lambda r, storage=storage: dist.check_shared_root(storage, coords[r]))
            conn.send(("ok", {"done": max(done.values()), **snapshot()}))


def legacy_revision() -> bool:
    """An older revision (its own protocols), measured for the "before" column."""
    from preemptible import dist

    return not hasattr(dist, "commit_barrier")


def projected(row: dict[str, Any], phase: str, world: int, rtt_ms: float) -> float:
    """The phase's latency on a cluster, where each rank has its own cores and only the store server is shared:
    the server's CPU for the phase (one thread, serial: all on the critical path), plus one rank's share of the
    clients' CPU, plus one round trip per request of a rank. Here all of it shares 2 cores, so the measured wall
    time is about (server + clients) / 2 instead; the counts behind both are exact."""
    share = row[f"{phase}_client_cpu_s"] / world
    trips = row[f"{phase}_requests_per_rank"] * rtt_ms / 1e3
    return round(row[f"{phase}_server_cpu_s"] + share + trips, 3)


def simulate(world: int, *, rtt_ms: float = 0.0, steady_s: float = 3.0, procs: int = 4) -> dict[str, Any]:
    """One row of the table: N = ``world`` simulated ranks."""
    procs = max(1, min(procs, world))
    ctx = mp.get_context("spawn")
    out: dict[str, Any] = {"ranks": world, "rtt_ms": rtt_ms}
    with store_server() as (port, pid), tempfile.TemporaryDirectory(prefix="coord-sim-") as root:
        os.environ["TORCHELASTIC_RUN_ID"] = f"sim-{world}-{time.monotonic_ns()}"
        pipes, workers = [], []
        for p in range(procs):
            ours, theirs = ctx.Pipe()
            ranks = list(range(p, world, procs))
            w = ctx.Process(target=_worker, args=(ranks, world, (port, rtt_ms / 1e3, root), theirs), daemon=True)
            w.start()
            pipes.append(ours)
            workers.append(w)

        def ask(cmd: str, arg: Any = None) -> list[Any]:
            for c in pipes:
                c.send((cmd, arg))
            replies = [c.recv() for c in pipes]
            return [r[1] for r in replies]

        def total(replies: list[Any], key: str) -> float:
            return float(sum(r[key] for r in replies))

        try:
            ask("start")
            settle = time.monotonic() + 600  # until every rank's agreement thread sits in its blocking wait
            last = -1
            while time.monotonic() < settle:
                now = total(ask("count"), "requests")
                if now == last and now >= (0 if legacy_revision() else world):
                    break
                last = now
                time.sleep(1.0)
            out["start_requests_per_rank"] = round(last / world, 2)
            before = ask("count")
            cpu0, _ = server_stats(pid)
            time.sleep(steady_s)
            after = ask("count")
            cpu1, fds = server_stats(pid)
            steady = total(after, "requests") - total(before, "requests")
            out["steady_req_per_rank_s"] = round(steady / world / steady_s, 3)
            out["server_cpu_steady"] = round((cpu1 - cpu0) / steady_s, 3)
            out["server_fds"] = fds
            base = ask("count")
            cpu_a, _ = server_stats(pid)
            replies = ask("notice", 0)
            out["agreement_server_cpu_s"] = round(server_stats(pid)[0] - cpu_a, 3)
            stops = {s for r in replies for s in r["stops"]}
            assert len(stops) == 1, f"ranks disagree on the stop step: {stops}"
            out["agreement_s"] = round(max(r["done"] for r in replies) - min(r["t0"] for r in replies), 3)
            out["agreement_keys_read_per_rank"] = round(
                (total(replies, "keys_read") - total(base, "keys_read")) / world, 2
            )
            out["agreement_requests_per_rank"] = round(
                (total(replies, "requests") - total(base, "requests")) / world, 2
            )
            out["agreement_client_cpu_s"] = round(total(replies, "cpu") - total(base, "cpu"), 3)
            out["agreement_projected_s"] = projected(out, "agreement", world, rtt_ms)
            for phase in ("commit", "restore", "shared"):
                base = ask("count")
                cpu_a, _ = server_stats(pid)
                t0 = time.monotonic()
                replies = ask(phase)
                out[f"{phase}_s"] = round(max(r["done"] for r in replies) - t0, 3)
                out[f"{phase}_server_cpu_s"] = round(server_stats(pid)[0] - cpu_a, 3)
                out[f"{phase}_client_cpu_s"] = round(total(replies, "cpu") - total(base, "cpu"), 3)
                out[f"{phase}_requests_per_rank"] = round(
                    (total(replies, "requests") - total(base, "requests")) / world, 2
                )
                out[f"{phase}_projected_s"] = projected(out, phase, world, rtt_ms)
                out[f"{phase}_keys_read_per_rank"] = round(
                    (total(replies, "keys_read") - total(base, "keys_read")) / world, 2
                )
            cpu2, _ = server_stats(pid)
            out["server_cpu_total_s"] = round(cpu2, 2)
            ask("stop")
        finally:
            for w in workers:
                w.join(30)
                if w.is_alive():
                    w.kill()
    return out


def main() -> None:
    # c10d looks up the name of every connecting socket; where DNS is unreachable (this machine) each lookup waits
    # for the resolver's timeout (5 s) and a burst of connects queues behind it. Shorten it; a cluster with working
    # DNS does not pay this at all. (Inherited by the store server and the workers.)
    os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024, 4096])
    p.add_argument("--rtt-ms", type=float, nargs="+", default=[0.2])
    p.add_argument("--steady-s", type=float, default=3.0)
    p.add_argument("--procs", type=int, default=4, help="worker processes holding the simulated ranks")
    p.add_argument("--json", default=None, metavar="FILE")
    args = p.parse_args()
    rows = []
    for rtt in args.rtt_ms:
        for n in args.ranks:
            row = simulate(n, rtt_ms=rtt, steady_s=args.steady_s, procs=args.procs)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    recorded(main, "coord-sim")
