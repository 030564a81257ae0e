"""The shape of pytorch/examples' MNIST script (mnist/main.py): a conv net with dropout, Adadelta, StepLR stepped
once per epoch, train() and test() per epoch over shuffling DataLoaders, made preemption-safe with `Run.epochs`
and `Run.batches`. The lines that differ from that script are marked ``# preemptible`` (11 of them).

Random images stand in for MNIST, so the script needs no download (and no torchvision); the rest is that
script's structure, so a resume is exact in the same way: the shuffle order, the dropout masks and the
scheduler's epoch count all continue as if the run had never stopped.

    python examples/mnist_epochs.py --root /tmp/mnist --epochs 3
    # kill -TERM <pid> mid-epoch, then the same command again: it resumes in the middle of that epoch
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

import preemptible  # preemptible


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(2304, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def train(args: argparse.Namespace, model: Net, train_loader: object, optimizer: optim.Optimizer, epoch: int) -> None:
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):  # type: ignore[call-overload]
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx}]\tLoss: {loss.item():.6f}", flush=True)
        time.sleep(args.step_time)


def test(model: Net, test_loader: DataLoader[tuple[torch.Tensor, ...]]) -> None:
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += int(output.argmax(dim=1).eq(target).sum())
    n = len(test_loader.dataset)  # type: ignore[arg-type]
    print(f"Test set: Average loss: {test_loss / n:.4f}, Accuracy: {correct}/{n}", flush=True)


def fake_mnist(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per batch (a watchable demo)")
    parser.add_argument("--root", required=True, help="checkpoint directory")  # preemptible
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    train_loader = DataLoader(fake_mnist(640, 0), batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(fake_mnist(128, 1), batch_size=64)

    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    run = preemptible.Run(args.root, model=model, optimizer=optimizer, scheduler=scheduler)  # preemptible
    with run:  # preemptible
        for epoch in run.epochs(args.epochs):  # preemptible: was range(1, args.epochs + 1)
            train(args, model, run.batches(train_loader), optimizer, epoch + 1)  # preemptible: run.batches(...)
            test(model, test_loader)
            scheduler.step()


if __name__ == "__main__":
    main()
