"""One "machine" saving one step to a shared root, for the two-machines race (issue 14 item 1).

With ``--pause-at data`` or ``--pause-at commit`` it prints ``paused`` and waits for the file ``--go`` before it
writes its first data file, or before it commits: the moment a reclaimed machine is still saving while its
replacement commits the same step. The storage is the real one; only the wait is added.
Exit 0: committed; 3: AlreadyCommittedError (the message on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch

from preemptible import Checkpointer
from preemptible.errors import AlreadyCommittedError
from preemptible.store.io import storage_for

p = argparse.ArgumentParser()
p.add_argument("--root", required=True)
p.add_argument("--step", type=int, required=True)
p.add_argument("--value", type=float, required=True)
p.add_argument("--numel", type=int, default=1 << 20)
p.add_argument("--pause-at", choices=["none", "data", "commit"], default="none")
p.add_argument("--go", default="")
args = p.parse_args()


def wait_for_go() -> None:
    print("paused", flush=True)
    while not os.path.exists(args.go):
        time.sleep(0.01)


base = storage_for(args.root)
paused = {"done": args.pause_at == "none"}


class Pausing(type(base)):  # type: ignore[misc]
    def open_write(self, path: str) -> Any:
        if args.pause_at == "data" and not paused["done"]:
            paused["done"] = True
            wait_for_go()
        return super().open_write(path)

    def commit_dir(self, src: str, dst: str) -> None:
        if args.pause_at == "commit":
            wait_for_go()
        super().commit_dir(src, dst)

    def publish_new(self, path: str, data: bytes) -> None:
        if args.pause_at == "commit":
            wait_for_go()
        super().publish_new(path, data)


storage = Pausing.__new__(Pausing)
storage.__dict__.update(base.__dict__)
state = {"model": {"w": torch.full((args.numel,), args.value)}, "meta": {"value": args.value}}
try:
    Checkpointer(args.root, storage=storage).save(state, args.step)
except AlreadyCommittedError as e:
    print(f"AlreadyCommittedError: {e}", file=sys.stderr, flush=True)
    sys.exit(3)
print("committed", flush=True)
