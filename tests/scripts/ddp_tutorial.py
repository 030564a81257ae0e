"""A script in the shape of PyTorch's DDP tutorial (a ``Trainer`` class with ``_run_batch``, ``_run_epoch`` and
``train``; ``DistributedSampler`` with ``set_epoch``; a peek at the first batch for its size at each epoch's start),
written here for the tests, with its snapshot save/load replaced by `preemptible.Run` as docs/porting.md says. Dropout
and a shuffling sampler make the random streams and the data order matter.

    torchrun --nproc-per-node 2 tests/scripts/ddp_tutorial.py --root DIR --epochs 3 [--save-interval 5]
        [--notice-at N | --hang-at N --marker FILE]

Prints ``step N saved M`` at every boundary (M: the newest step this process committed, -1 for none) and, at the
end, ``final digest=<hex>`` of the model and optimizer state on rank 0. ``--save-interval S`` saves every S seconds of
an injected clock that advances one second per step on rank 0 and never on the others: only rank 0's clock decides.
``--notice-at N``: rank 0 sends itself SIGTERM after its optimizer step N (the other ranks wait for it in step N+1's
all-reduce, so the stop step is N+1). ``--hang-at N``: at the first boundary from step N on at which a save of
rank 0 has committed, rank 0 writes ``--marker`` (that step and the saved one) and waits there, for the test to
SIGKILL the job (a crash at a known step, never a sleep that guesses one).
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from _scriptkit import digest
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import preemptible
import preemptible.state


class RandomData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(7)
        self.data = [(torch.rand(20, generator=g), torch.rand(1, generator=g)) for _ in range(size)]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index]


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data: DataLoader[object], optimizer: torch.optim.Optimizer,
                 run: preemptible.Run, args: argparse.Namespace) -> None:  # fmt: skip
        self.args = args
        self.rank = torch_dist.get_rank()
        self.model = DDP(model)
        self.train_data = train_data
        self.optimizer = optimizer
        self.run = run

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        if self.rank == 0 and self.run.step + 1 == self.args.notice_at:
            os.kill(os.getpid(), signal.SIGTERM)

    def _run_epoch(self, epoch: int) -> None:
        b_sz = len(next(iter(self.train_data))[0])  # the tutorial's peek: an iterator of its own draws a seed
        if self.rank == 0:
            print(f"[rank {self.rank}] epoch {epoch} | batch size {b_sz} | steps {len(self.train_data)}", flush=True)
        self.train_data.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for source, targets in self.run.batches(self.train_data):
            self._run_batch(source, targets)
            last = self.run.last_save
            print(f"step {self.run.step} saved {last.step if last else -1}", flush=True)
            if self.rank == 0 and self.args.hang_at is not None and self.run.step >= self.args.hang_at and last:
                with open(self.args.marker + ".part", "w") as f:
                    f.write(f"{self.run.step} {last.step}")
                os.replace(self.args.marker + ".part", self.args.marker)
                time.sleep(600)  # killed here

    def train(self, max_epochs: int) -> None:
        for epoch in self.run.epochs(max_epochs):
            self._run_epoch(epoch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--save-interval", type=float, default=None)
    parser.add_argument("--notice-at", type=int, default=None)
    parser.add_argument("--hang-at", type=int, default=None)
    parser.add_argument("--marker", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch_dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    data = DataLoader(RandomData(96), batch_size=8, shuffle=False, sampler=DistributedSampler(RandomData(96)))
    rank = torch_dist.get_rank()
    runs: list[preemptible.Run] = []

    def clock() -> float:  # one second per completed step on rank 0; the other ranks' clocks stand still
        return float(runs[0].step) if runs and rank == 0 else 0.0

    options = {"save_interval_s": args.save_interval, "monotonic": clock} if args.save_interval else {}
    run = preemptible.Run(args.root, model=model, optimizer=optimizer, **options)  # type: ignore[arg-type]
    runs.append(run)
    trainer = Trainer(model, data, optimizer, run, args)
    with run:
        trainer.train(args.epochs)
    if rank == 0:
        print(f"final digest={digest({'model': model, 'optimizer': optimizer})}", flush=True)
    torch_dist.destroy_process_group()


if __name__ == "__main__":
    main()
