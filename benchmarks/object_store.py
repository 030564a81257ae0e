"""Save and restore throughput to an S3-compatible server on loopback (moto), beside a plain single-stream
s3fs put and get of the same bytes, interleaved.

    python benchmarks/object_store.py --params 20e6 --rounds 3
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=20e6)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    import s3fs
    from moto.server import ThreadedMotoServer

    from preemptible import Checkpointer
    from preemptible.bench import large_state
    from preemptible.state import capture, flatten

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    opts = {"client_kwargs": {"endpoint_url": f"http://{host}:{port}"}}
    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("bench")
    state = large_state(args.params, side=2048)
    nbytes = flatten(capture(state)).tensor_bytes
    blob = os.urandom(1 << 20) * (nbytes >> 20)
    times: dict[str, list[float]] = {
        "preemptible save": [],
        "s3fs put (one stream)": [],
        "preemptible restore": [],
        "s3fs get (one stream)": [],
    }
    for r in range(args.rounds):
        ck = Checkpointer(f"s3://bench/run{r}", storage_options=opts)
        t = time.perf_counter()
        ck.save(state, 1)
        times["preemptible save"].append(time.perf_counter() - t)
        t = time.perf_counter()
        fs.pipe_file(f"bench/plain{r}.bin", blob)
        times["s3fs put (one stream)"].append(time.perf_counter() - t)
        t = time.perf_counter()
        ck.restore(state)
        times["preemptible restore"].append(time.perf_counter() - t)
        t = time.perf_counter()
        fs.cat_file(f"bench/plain{r}.bin")
        times["s3fs get (one stream)"].append(time.perf_counter() - t)
    server.stop()
    print(f"{nbytes / 1e6:.0f} MB to moto on loopback, median of {args.rounds}")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"  {k:<24} {m:6.2f} s  {nbytes / m / 1e6:7.1f} MB/s")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"  save vs put: {med['s3fs put (one stream)'] / med['preemptible save']:.2f}x, "
        f"restore vs get: {med['s3fs get (one stream)'] / med['preemptible restore']:.2f}x"
    )


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    recorded(main, "object-store")
