"""A real Lightning fine-tune for the tests of recallk.training.lightning (imported by them, and run as a script for
DDP: Lightning's ``ddp`` strategy starts the other ranks by running this file again).

A linear embedding of the 8×8 digits trained with a normalized-softmax (proxy) loss, a per-sample mean, without
batch norm, on an unshuffled sampler: a step's gradient is the same on one process with batch 2b as on two with b
each, so one and two processes train alike and must score alike. The validation set, 101 digits, is odd: the
DistributedSampler pads it with a repeat that the callback must drop.

    python tests/training/lightning_run.py OUT_DIR --devices 2 [--short-rank 1] [--nan]

writes the evaluator's log to OUT_DIR (DVCLive's files); on an InputError it prints ``error: ...`` and exits 2.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from recallk.digits import digit_images
from recallk.errors import InputError
from recallk.training import Evaluator
from recallk.training.lightning import RetrievalCallback, with_index

TRAIN, VAL, BATCH = 256, 101, 32


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    pixels, labels = digit_images()
    return torch.as_tensor(pixels, dtype=torch.float32).reshape(len(pixels), -1) / 255.0, torch.as_tensor(labels)


class Embedder(pl.LightningModule):
    def __init__(self, lr: float = 0.5, short_rank: int | None = None, nan: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(64, 16)
        self.proxies = torch.nn.Parameter(torch.randn(10, 16))
        self.lr, self.short_rank, self.nan = lr, short_rank, nan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net(x), dim=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x) @ F.normalize(self.proxies, dim=1).T / 0.1
        return F.cross_entropy(logits, y)

    def validation_step(self, batch, batch_idx):
        index, (x, _) = batch
        emb = self(x)
        if self.short_rank == self.global_rank:  # the bad input of the DDP test: this rank drops a sample
            emb, index = emb[1:], index[1:]
        if self.nan and batch_idx == 0:  # the bad input rank 0's evaluator finds: diverged embeddings
            emb = emb * float("nan")
        return {"embeddings": emb, "index": index}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        """BATCH / world size per rank, unshuffled (Lightning's own DistributedSampler would shuffle)."""
        x, y = digits()
        train, world = torch.utils.data.TensorDataset(x[:TRAIN], y[:TRAIN]), self.trainer.world_size
        sampler = None if world == 1 else \
            torch.utils.data.DistributedSampler(train, world, self.global_rank, shuffle=False)
        return torch.utils.data.DataLoader(train, batch_size=BATCH // world, sampler=sampler)

    def val_dataloader(self):
        """The validation set with each sample's row (Lightning adds its DistributedSampler under DDP)."""
        x, y = digits()
        val = torch.utils.data.TensorDataset(x[TRAIN:TRAIN + VAL], y[TRAIN:TRAIN + VAL])
        return torch.utils.data.DataLoader(with_index(val), batch_size=BATCH)


def val_labels() -> list[int]:
    return digits()[1][TRAIN:TRAIN + VAL].tolist()


def fit(out: str | None, devices: int = 1, epochs: int = 3, short_rank: int | None = None, lr: float = 0.5,
        nan: bool = False, **trainer_args) -> tuple[Embedder, RetrievalCallback]:
    """Train for ``epochs`` on ``devices`` CPU processes (DDP with gloo above 1)."""
    evaluator = Evaluator(val_labels(), ks=(1, 5), metrics=["recall", "map@r"], log=out)
    callback = RetrievalCallback(evaluator)
    model = Embedder(lr=lr, short_rank=short_rank, nan=nan)
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=devices,
                         strategy="ddp" if devices > 1 else "auto", callbacks=[callback], enable_progress_bar=False,
                         enable_model_summary=False, **{"logger": False, "enable_checkpointing": False,
                                                        "num_sanity_val_steps": 0, **trainer_args})
    trainer.fit(model)
    return model, callback


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--short-rank", type=int, default=None)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--nan", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")  # Lightning's advice on workers and sync_dist: noise here
    try:
        fit(args.out, args.devices, short_rank=args.short_rank, lr=args.lr, nan=args.nan)
    except InputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
