"""Training beside a background save to object storage: the extra wall time of a 2-thread training loop while an
asynchronous save of the large state uploads to moto S3 behind a paced link, as `preemptible bench` measures it
beside a save to this disk and to a paced local directory (`preemptible.bench.training_beside`, median of rounds).

    python benchmarks/beside_s3.py                           # 1.2 GB at 100 MB/s, 5 rounds (about 8 minutes)
    python benchmarks/beside_s3.py --params 25e6 --rounds 3  # a quick look

moto and the pacing proxy (`preemptible.bench.PacedProxy`) run in a process of their own: on a 2-core machine
they share the cores with the loop, so their CPU seconds over the saves are reported beside the figure (what a real
object store would not take from the machine). The machine-wide CPU breakdown includes them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

SERVER = """
import logging, sys
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto.server import ThreadedMotoServer
from preemptible.bench import PacedProxy

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
proxy = PacedProxy(server.get_host_and_port(), float(sys.argv[1]))
print(proxy.port, flush=True)
sys.stdin.read()  # until the benchmark closes it
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=100e6, help="parameters of the large state (fp32 + AdamW)")
    ap.add_argument("--rate", type=float, default=100, help="the link to the store, MB/s")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import s3fs

    from preemptible import bench

    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(args.rate * 1e6)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        endpoint = f"http://127.0.0.1:{int(server.stdout.readline())}"
        opts = {"client_kwargs": {"endpoint_url": endpoint}}
        s3fs.S3FileSystem(**opts).mkdir("beside")
        state = bench.large_state(args.params)
        cpu0 = cpu_seconds(server.pid)
        out = bench.training_beside(state, rounds=args.rounds, dcp=False, url="s3://beside/ck", storage_options=opts)
        out["store_cpu_s_per_save"] = round((cpu_seconds(server.pid) - cpu0) / (args.rounds + 1), 3)
        out["link_mb_s"] = args.rate
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(30)
    print(bench.beside_report(out))
    print(
        f"  moto and the proxy (their own process, on the same 2 cores): {out['store_cpu_s_per_save']:.2f} s of CPU "
        f"per save, over a link paced to {args.rate:.0f} MB/s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    recorded(main, "beside-s3")
