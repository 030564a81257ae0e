"""An Accelerate training loop made preemption-safe: `Accelerator.prepare` as usual, `run.epochs` and
`run.batches` around the prepared loader, and the prepared model/optimizer/scheduler given to `Run`. The lines
marked ``# preemptible`` are the recipe; a resume (mid-epoch, dropout on, shuffled data, gradient accumulation) ends
bit-identical to a run that was never stopped: a notice in the middle of an accumulation stops at its optimizer step.

    python examples/accelerate_loop.py --root /tmp/acc --epochs 3
    accelerate launch --num_processes 2 examples/accelerate_loop.py --root /tmp/acc   # or torchrun
"""

from __future__ import annotations

import argparse
import signal
import threading
import time

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed
from torch.utils.data import DataLoader, TensorDataset

import preemptible  # preemptible


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--seedable", action="store_true", help="DataLoaderConfiguration(use_seedable_sampler=True)")
    parser.add_argument("--accumulate", type=int, default=1, help="batches per optimizer step (gradient accumulation)")
    parser.add_argument("--sigterm-at", type=int, default=None, help="rehearse: SIGTERM this process at that step")
    parser.add_argument("--sigterm-rank", type=int, default=0, help="... on this rank only")
    args = parser.parse_args()

    torch.set_num_threads(1)
    set_seed(0)
    accelerator = Accelerator(
        cpu=True,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=args.seedable),
        gradient_accumulation_steps=args.accumulate,
    )
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(160, 16, generator=g), torch.randn(160, 1, generator=g))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    run = preemptible.Run(args.root, model=model, optimizer=optimizer, scheduler=scheduler)  # preemptible
    with run:  # preemptible
        for epoch in run.epochs(args.epochs):  # preemptible: was range(args.epochs)
            model.train()
            for x, y in run.batches(loader):  # preemptible: was loader
                with accelerator.accumulate(model):  # an optimizer step every --accumulate batches
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                print(f"step {run.step + 1} epoch {epoch} rank {accelerator.process_index} loss {loss.item():.6f}")
                time.sleep(args.step_time)
                if run.step + 1 == args.sigterm_at and accelerator.process_index == args.sigterm_rank:
                    # A real signal, to this (the main) thread: handled before the next step. os.kill(getpid())
                    # may go to another of the process's threads, and under load be handled steps later.
                    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
            scheduler.step()


if __name__ == "__main__":
    main()
