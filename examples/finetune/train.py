"""A tiny metric-learning fine-tune that recallk scores every epoch (CPU, well under a minute).

A small CNN embeds scikit-learn's 8×8 digits; a normalized-softmax loss (one learned proxy per training label) trains
it on the digits of ``train.train_labels``; the other labels, never seen in training, are the validation set, scored
leave-one-out after every epoch by :class:`recallk.training.lightning.RetrievalCallback`: recall@K, MAP@R and their
bootstrap intervals logged at step = epoch to ``dvclive/`` (``dvc exp show``, ``dvc plots diff``), each epoch's
per-query table kept (``recallk track dvclive``), the best epoch (a significant gain of MAP@R) saved and its table
copied to ``metrics/per_query.csv`` (``recallk compare <experiment A> <experiment B>``), and the training stopped
after ``train.patience`` epochs without one.

    python train.py            # what `dvc repro` / `dvc exp run` runs; the settings: params.yaml's `train`
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
import yaml

from recallk.digits import digit_images
from recallk.errors import InputError
from recallk.training import Evaluator
from recallk.training.layout import EVALUATED, TABLES, table_name
from recallk.training.lightning import RetrievalCallback, with_index

LOG = Path("dvclive")


class Embedder(pl.LightningModule):
    def __init__(self, lr: float, dim: int, n_labels: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(),
            torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, dim))
        self.proxies = torch.nn.Parameter(torch.randn(n_labels, dim))
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net(x), dim=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x) @ F.normalize(self.proxies, dim=1).T / 0.1, y)

    def validation_step(self, batch, batch_idx):
        index, (x, _) = batch  # with_index: each sample's row in the validation set
        return {"embeddings": self(x), "index": index}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class SaveBest(pl.Callback):
    """Save the weights whenever the retrieval callback (before this one) declares a new best epoch."""

    def __init__(self, scores: RetrievalCallback) -> None:
        self.scores = scores

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking and trainer.is_global_zero and self.scores.result.is_best:
            torch.save(pl_module.state_dict(), "model.pt")


def datasets(train_labels: list[int]):
    pixels, labels = digit_images()
    x = torch.as_tensor(pixels, dtype=torch.float32).unsqueeze(1) / 255.0
    y = torch.as_tensor(labels)
    seen = torch.isin(y, torch.as_tensor(train_labels))
    # the training labels renumbered 0..n-1 (one proxy each); the validation set keeps its digits as labels
    remap = {label: i for i, label in enumerate(sorted(train_labels))}
    train = torch.utils.data.TensorDataset(x[seen], torch.as_tensor([remap[int(v)] for v in y[seen]]))
    val = torch.utils.data.TensorDataset(x[~seen], y[~seen])
    return train, val, y[~seen].tolist()


def main() -> int:
    params = yaml.safe_load(Path("params.yaml").read_text())["train"]
    pl.seed_everything(params["seed"], verbose=False)
    train, val, val_labels = datasets(params["train_labels"])
    try:
        evaluator = Evaluator(val_labels, ks=(1, 5, 10), metrics=["recall", "map@r"], monitor="map@r",
                              patience=params["patience"], log=str(LOG))
        scores = RetrievalCallback(evaluator)
        trainer = pl.Trainer(max_epochs=params["epochs"], accelerator="cpu", devices=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, callbacks=[scores, SaveBest(scores)], deterministic=True)
        model = Embedder(params["lr"], params["embedding_dim"], len(params["train_labels"]))
        trainer.fit(model, torch.utils.data.DataLoader(train, batch_size=params["batch_size"], shuffle=True),
                    torch.utils.data.DataLoader(with_index(val), batch_size=256))
    except InputError as exc:  # a bad setting or input: one line, no traceback
        sys.stderr.write(f"error: {exc}\n")
        return 2
    best = evaluator.best_epoch
    Path("metrics").mkdir(exist_ok=True)
    shutil.copyfile(LOG / TABLES / table_name(best), "metrics/per_query.csv")
    shutil.copyfile(LOG / TABLES / EVALUATED, "metrics/evaluated.json")
    result = next(r for r in scores.results if r.epoch == best)
    print(f"best epoch {best}: " + ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
