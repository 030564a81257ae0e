"""A 2-rank gloo job whose rank 1 hangs (``hang``) or crashes (``crash``) at step 3: the source of the generated
multi-log cases in tests/corpus/diagnose/multi/cases.json.

    torchrun --nproc-per-node 2 --tee 3 tests/scripts/collective_fault.py hang > run.out 2>&1
"""

import datetime
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
t = torch.ones(4)
for step in range(1000):
    if rank == 1 and step == 3 and sys.argv[1] == "hang":
        time.sleep(60)
    if rank == 1 and step == 3 and sys.argv[1] == "crash":
        raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
    dist.all_reduce(t)
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(0.05)
