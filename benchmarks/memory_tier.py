"""The memory tier against the durable root on S3, on the multi-node harness: 4 simulated nodes, one rank each.

    python benchmarks/memory_tier.py                # 0.5 GB a node (2 GB in all), 2 interleaved rounds
    python benchmarks/memory_tier.py --shard-mb 64  # a quick look

Each node is a network namespace with its own tmpfs (`preemptible.testing.nodes`); the S3 server (moto) listens on
the cluster's services address, so every upload crosses the node's own link, and the durable saves go through
`PacedStorage` at 200 MB/s per node (a network disk or a bucket's per-machine rate). Interleaved, per round:
the emergency save to the memory tier and one replica ("protected": every part on its node and on its peer) and the
same save to S3; then node 4 loses its tier and both restore the job (memory: node 4's part from its peer's replica).
In the same run: one copy of a shard in memory and the shard sent to the next node over the process group (the
machine's ceilings for the tier's work), and training beside memory-tier saves every 10 steps against none.

The result goes to benchmarks/results/memory-tier-<date>.json with the machine, the date and the command. Needs
root (namespaces), like the multi-node tests."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_suite import machine  # noqa: E402
from nodes_bench import base_env  # noqa: E402
from preemptible.testing.nodes import SERVICES, Cluster, node_env, torchrun_argv  # noqa: E402

WORKER = REPO / "benchmarks" / "memory_tier_worker.py"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
MAKE_BUCKET = """
import sys, time, s3fs
fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": sys.argv[1]})
for _ in range(300):
    try:
        fs.mkdir("memtier")
        break
    except Exception:
        time.sleep(0.1)
else:
    raise SystemExit("the S3 server never answered")
"""


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    env = {**base_env(), **CREDENTIALS}
    with Cluster(args.nodes, work) as c:
        port = c.free_services_port()
        endpoint = f"http://{SERVICES}:{port}"
        c.serve(
            [sys.executable, "-m", "moto.server", "-H", SERVICES, "-p", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        made = c.run_outside([sys.executable, "-c", MAKE_BUCKET, endpoint], env=env)
        if made.returncode != 0:
            raise RuntimeError(made.stderr)
        rdzv = f"{c.node(1).addr}:{c.node(1).free_port()}"
        agents = []
        for node in c:
            argv = torchrun_argv(
                node,
                endpoint=rdzv,
                rdzv_id="memtier",
                nnodes=f"{args.nodes}:{args.nodes}",
                hosts_store=node.index == 1,
                script=[
                    str(WORKER),
                    "--endpoint",
                    endpoint,
                    "--shard-mb",
                    str(args.shard_mb),
                    "--rate-mb-s",
                    str(args.rate_mb_s),
                    "--reps",
                    str(args.rounds),
                ],
            )
            out = (work / f"node{node.index}.out").open("w")
            err = (work / f"node{node.index}.err").open("w")
            agents.append(node.popen(argv, env=node_env(node, env, MASTER_ADDR=c.node(1).addr), stdout=out, stderr=err))
        codes = [a.wait(timeout=3600) for a in agents]
        if codes != [0] * len(codes):
            raise RuntimeError(f"exit codes {codes}: {(work / 'node1.err').read_text()[-3000:]}")
        line = next(x for x in (work / "node1.out").read_text().splitlines() if x.startswith("RESULT "))
        return json.loads(line.removeprefix("RESULT "))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--shard-mb", type=int, default=512)
    ap.add_argument("--rate-mb-s", type=float, default=200.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    now = datetime.datetime.now(datetime.timezone.utc)
    out_path = Path(args.out) if args.out else REPO / "benchmarks" / "results" / f"memory-tier-{now:%Y-%m-%d}.json"
    work = Path(tempfile.mkdtemp(prefix="memtier-bench-"))
    t0 = time.monotonic()
    try:
        result = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {
        "date": now.isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv],
        "machine": machine(),
        "loadavg_at_start": os.getloadavg(),
        "settings": {
            "nodes": args.nodes,
            "ranks_per_node": 1,
            "shard_mb_per_node": args.shard_mb,
            "replicas": 1,
            "durable": f"S3 (moto on the services address) through PacedStorage at {args.rate_mb_s} MB/s per node",
            "rounds": args.rounds,
        },
        "result": result,
        "seconds": round(time.monotonic() - t0, 1),
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=2) + "\n")
    r = result
    print(
        f"save: memory {r['emergency_save_memory_s']} s vs S3 {r['emergency_save_s3_s']} s "
        f"(x{r['save_speedup']:.1f}; S3 reached {r['s3_achieved_mb_s_per_node']:.0f} MB/s a node)\n"
        f"restore after a node's loss: memory {r['restore_memory_s']} s vs S3 {r['restore_s3_s']} s "
        f"(x{r['restore_speedup']:.1f})\nceilings: {r['ceilings']}\ntraining: {r['training']}\nresult in {out_path}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
