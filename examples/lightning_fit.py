"""A PyTorch Lightning run made preemption-safe: a small LightningModule with dropout, a shuffling DataLoader,
a StepLR scheduler stepped per epoch, and Lightning's own ModelCheckpoint beside preemptible. The three lines
marked ``# preemptible`` are all it takes.

    python examples/lightning_fit.py --root /tmp/pl --epochs 3
    # kill -TERM <pid> mid-epoch, then the same command again: it resumes at that step, exactly
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from preemptible.integrations.lightning import PreemptibleCallback  # preemptible


class Regressor(L.LightningModule):
    def __init__(self, step_time: float, sigterm_at: int | None) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1)
        )
        self.step_time = step_time
        self.sigterm_at = sigterm_at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        print(f"step {self.global_step} rank {self.global_rank} epoch {self.current_epoch}", flush=True)
        time.sleep(self.step_time)
        if self.global_step == self.sigterm_at and self.global_rank == int(os.environ.get("SIGTERM_RANK", "0")):
            # Rehearse: a real signal, to this (the main) thread, handled before the next step. os.kill(getpid())
            # may go to another of the process's threads, and under load be handled steps later.
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.9)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--sigterm-at", type=int, default=None, help="rehearse: SIGTERM at this global step")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--save-every", type=int, default=None, help="preemptible's periodic saves (steps)")
    parser.add_argument("--no-exit", action="store_true", help="exit_on_notice=False: fit() returns on a notice")
    parser.add_argument("--tensorboard", action="store_true", help="log to TensorBoard (flushed on a notice)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(160, 16, generator=g), torch.randn(160, 1, generator=g))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    cb = PreemptibleCallback(args.root, save_every=args.save_every, exit_on_notice=not args.no_exit)  # preemptible
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        default_root_dir=f"{args.root}-lightning",
        callbacks=[cb, L.pytorch.callbacks.ModelCheckpoint(every_n_train_steps=7, save_top_k=-1)],  # preemptible
        log_every_n_steps=5,  # what the module logs reaches preemptible's journal at this cadence too
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=L.pytorch.loggers.TensorBoardLogger(f"{args.root}-tb", version=0) if args.tensorboard else False,
    )
    trainer.fit(Regressor(args.step_time, args.sigterm_at), loader, ckpt_path=cb.resume_from)  # preemptible
    if cb.preempted:  # only with --no-exit: otherwise the process has ended with the exit policy's code
        print(f"preempted at global step {trainer.global_step}", flush=True)
        return
    print(f"finished at global step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
