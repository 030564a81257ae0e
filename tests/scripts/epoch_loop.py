"""An epoch loop for `preemptible drill`: a shuffling DataLoader, dropout, a peek at a batch outside `run.batches`
each epoch (as the DDP tutorial takes its batch size: a draw from the global streams), and the loss logged at every
step with `run.log`. Its resume is exact.

``--inexact`` makes the resume inexact on purpose, the way a script's own bug would: a plain counter of the batches
this process trained on, which is not in the Run's state, scales the loss. A restart counts from 0 again, so from
the first step after a resume the loss (and so the weights) differ from an uninterrupted run's.

    python tests/scripts/epoch_loop.py --root DIR [--epochs 3] [--batches 8] [--save-every N] [--inexact]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import preemptible


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=8, help="batches per epoch")
    parser.add_argument("--save-every", type=int, default=None)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--inexact", action="store_true", help="a counter outside the Run's state in the loss")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(4 * args.batches, 6, generator=g), torch.randn(4 * args.batches, 1, generator=g))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    run = preemptible.Run(args.root, model=model, optimizer=optimizer, save_every=args.save_every)
    trained = 0  # --inexact: not in the Run's state, so a restart counts from 0 again
    for _epoch in run.epochs(args.epochs):
        next(iter(loader))  # a peek outside run.batches: draws from the global streams
        for x, y in run.batches(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            if args.inexact:
                loss = loss * (1.0 + 0.01 * trained)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            trained += 1
            run.log(loss=float(loss))
            if args.step_time:
                time.sleep(args.step_time)


if __name__ == "__main__":
    main()
