"""PyTorch Lightning under PreemptibleCallback, for the crash tests (tests/e2e/test_framework_crash.py): a small
regressor with dropout, a shuffling DataLoader (20 batches an epoch), StepLR per epoch, and Lightning's own
``ModelCheckpoint(every_n_train_steps=N, save_last=True, dirpath=<root>-pl)`` beside it.

``--hang-at K --marker PATH``: at the end of step K (once preemptible's step ``--committed`` is committed, when
given) it writes PATH and waits there to be killed, so a SIGKILL lands at a known step.
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning as L
import torch
from _scriptkit import hang_for_kill
from torch.utils.data import DataLoader, TensorDataset

from preemptible.integrations.lightning import PreemptibleCallback


class Regressor(L.LightningModule):
    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1)
        )
        self.a = a

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_start(self) -> None:
        print(f"began at global step {self.global_step}", flush=True)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_step == self.a.hang_at:
            hang_for_kill(self.a.marker, self.global_step, root=self.a.root, committed=self.a.committed)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.9)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--every", type=int, default=8, help="ModelCheckpoint(every_n_train_steps=...)")
    parser.add_argument("--save-every", type=int, default=None)
    parser.add_argument("--no-fallback", action="store_true")
    parser.add_argument("--hang-at", type=int, default=None)
    parser.add_argument("--committed", type=int, default=None)
    parser.add_argument("--marker", default=None)
    a = parser.parse_args()

    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(160, 16, generator=g), torch.randn(160, 1, generator=g))
    cb = PreemptibleCallback(a.root, save_every=a.save_every, framework_fallback=not a.no_fallback)
    own = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=f"{a.root}-pl", every_n_train_steps=a.every, save_top_k=-1, save_last=True
    )
    trainer = L.Trainer(
        max_epochs=a.epochs,
        accelerator="cpu",
        devices=1,
        default_root_dir=f"{a.root}-pl",
        callbacks=[cb, own],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    print(f"resume from {cb.resume_from}", flush=True)
    trainer.fit(Regressor(a), DataLoader(data, batch_size=8, shuffle=True), ckpt_path=cb.resume_from)
    print(f"finished at global step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
