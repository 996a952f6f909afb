"""recallk.training.hf.RetrievalTrainerCallback with a real transformers Trainer on CPU: a tiny ViT made offline (a
config, random weights) fine-tuned on the 8×8 digits with a normalized-softmax loss; every epoch scored, logged to
DVCLive's files at step = epoch and to the Trainer's own log as ``eval_<key>``; the count of the evaluation set
checked; the evaluator's patience stopping the training."""

from __future__ import annotations

import pandas as pd
import pytest

from extras import extra

torch = extra("torch", "torch")
transformers = extra("transformers", "hf-trainer")
extra("accelerate", "hf-trainer")

import torch.nn.functional as F  # noqa: E402

from recallk.digits import digit_images  # noqa: E402
from recallk.errors import InputError  # noqa: E402
from recallk.training import Evaluator  # noqa: E402
from recallk.training.hf import RetrievalTrainerCallback  # noqa: E402

TRAIN, VAL = 192, 90


class TinyViTEmbedder(torch.nn.Module):
    """A 1-layer ViT over 8×8 one-channel images (2×2 patches), its [CLS] state projected and normalised; the loss
    a normalized softmax against one learned proxy per label."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        config = transformers.ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
        self.vit = transformers.ViTModel(config, add_pooling_layer=False)
        self.head = torch.nn.Linear(32, 16)
        self.proxies = torch.nn.Parameter(torch.randn(10, 16))

    def forward(self, pixel_values, labels=None):
        emb = F.normalize(self.head(self.vit(pixel_values=pixel_values).last_hidden_state[:, 0]), dim=1)
        if labels is None:
            return (emb,)
        loss = F.cross_entropy(emb @ F.normalize(self.proxies, dim=1).T / 0.1, labels)
        return loss, emb


class Digits(torch.utils.data.Dataset):
    def __init__(self, rows: slice) -> None:
        pixels, labels = digit_images()
        self.x = torch.as_tensor(pixels[rows], dtype=torch.float32).unsqueeze(1) / 255.0
        self.y = torch.as_tensor(labels[rows])

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"pixel_values": self.x[i], "labels": self.y[i]}


def _trainer(tmp_path, callback, epochs: int = 3, val_rows: slice = slice(TRAIN, TRAIN + VAL), **args):
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), num_train_epochs=epochs, per_device_train_batch_size=32,
        per_device_eval_batch_size=32, eval_strategy="epoch", save_strategy="no", logging_strategy="epoch",
        report_to="none", use_cpu=True, disable_tqdm=True, seed=0, **{"learning_rate": 1e-3, **args})
    return transformers.Trainer(TinyViTEmbedder(), arguments, train_dataset=Digits(slice(0, TRAIN)),
                                eval_dataset=Digits(val_rows), compute_metrics=callback.compute_metrics,
                                callbacks=[callback])


def _labels() -> list[int]:
    return digit_images()[1][TRAIN:TRAIN + VAL].tolist()


def test_every_epoch_is_scored_and_logged_at_step_epoch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside any git repo: dvclive looks for one from here
    evaluator = Evaluator(_labels(), ks=(1, 5), metrics=["recall", "map@r"], log=str(tmp_path / "dvclive"))
    callback = RetrievalTrainerCallback(evaluator)
    trainer = _trainer(tmp_path, callback)
    trainer.train()
    assert [r.epoch for r in callback.results] == [1, 2, 3]  # the Trainer's epochs (state.epoch)
    tsv = pd.read_csv(tmp_path / "dvclive" / "plots" / "metrics" / "map@r.tsv", sep="\t")
    assert tsv["step"].tolist() == [1, 2, 3]
    assert tsv["map@r"].tolist() == [r.metrics["map@r"] for r in callback.results]
    logged = [entry for entry in trainer.state.log_history if "eval_map@r" in entry]
    assert [e["eval_map@r"] for e in logged] == tsv["map@r"].tolist()
    assert [e["eval_map@r_ci_low"] for e in logged] == [r.intervals["map@r"][0] for r in callback.results]
    # the numbers are the evaluator's on the trained model's embeddings
    model = trainer.model.eval()
    with torch.no_grad():
        emb = model(Digits(slice(TRAIN, TRAIN + VAL)).x)[0]
    direct = Evaluator(_labels(), ks=(1, 5), metrics=["recall", "map@r"])(0, emb)
    assert direct.metrics == pytest.approx(callback.result.metrics, abs=1e-12)
    # a later evaluate() at the same epoch is not scored twice (one row per epoch)
    assert "eval_map@r" not in trainer.evaluate() and len(tsv) == 3


def test_patience_stops_the_training(tmp_path):
    # a learning rate of 0: no epoch is better than the first, so patience 1 stops after the second
    evaluator = Evaluator(_labels(), ks=(1,), metrics=["recall", "map@r"], patience=1)
    callback = RetrievalTrainerCallback(evaluator)
    trainer = _trainer(tmp_path, callback, epochs=5, learning_rate=0.0)
    trainer.train()
    assert [r.epoch for r in callback.results] == [1, 2] and callback.result.should_stop
    assert trainer.state.epoch == 2


def test_an_evaluation_set_of_another_size_is_one_error(tmp_path):
    callback = RetrievalTrainerCallback(Evaluator(_labels(), ks=(1,), metrics=["recall"]))
    trainer = _trainer(tmp_path, callback, epochs=1, val_rows=slice(TRAIN, TRAIN + VAL - 10))
    with pytest.raises(InputError, match=r"^The evaluation gave 80 embeddings, but the evaluator's validation set has "
                                         r"90 rows: evaluate on that set"):
        trainer.evaluate()
