"""The recipe: what is this package's own (model, data, loss, metrics); hpcpipe does the rest."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

import hpcpipe


class Args(BaseModel):
    """The job's ``recipe:`` section."""

    model_config = ConfigDict(extra="forbid")

    classes: list[str] = Field(
        default_factory=lambda: [
            "asyncio", "email", "unittest", "xml", "multiprocessing", "importlib", "tkinter", "ctypes"
        ],
        min_length=2,
        description="Standard-library packages to tell apart (one class each).",
    )
    window: int = Field(256, ge=16, description="Bytes per snippet.")
    train_per_class: int = Field(512, ge=1, description="Training snippets per package.")
    val_per_class: int = Field(64, ge=1, description="Validation snippets per package.")
    val_fraction: float = Field(0.25, gt=0, lt=1, description="Share of each package's files held out.")
    data_seed: int = Field(0, ge=0, description="Where the snippets are cut (the same for every run.seed).")
    embed: int = Field(32, ge=1, description="Byte embedding width.")
    channels: int = Field(64, ge=1, description="Convolution channels.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout before the head.")


class StdlibClassifier(hpcpipe.DatasetRecipe):
    name = "stdlib-classifier"
    summary = "Which stdlib package a snippet of Python source comes from (byte-level CNN)"
    Args = Args
    metric_goals = {"val_loss": "min", "val_acc": "max"}  # noqa: RUF012  (HPO maximises val_acc)
    worker_imports = ("stdlib_classifier.model", "stdlib_classifier.data")

    def build_model(self) -> Any:
        from stdlib_classifier.model import ByteCNN

        a = self.args
        return ByteCNN(len(a.classes), a.embed, a.channels, a.dropout)

    def datasets(self) -> hpcpipe.Datasets:
        from stdlib_classifier.data import windows

        a = self.args
        split = (a.classes, a.window)
        train = windows(*split, a.train_per_class, a.data_seed, validation=False, val_fraction=a.val_fraction)
        val = windows(*split, a.val_per_class, a.data_seed, validation=True, val_fraction=a.val_fraction)
        return hpcpipe.Datasets(train=train, val=val)

    def loss(self, model: Any, batch: hpcpipe.Batch) -> Any:
        import torch.nn.functional as F

        x, y = batch  # (B, T) int64 bytes, (B,) int64 labels
        return F.cross_entropy(model(x).float(), y)

    def eval_sums(self, model: Any, batch: hpcpipe.Batch) -> dict[str, Any]:
        import torch.nn.functional as F

        x, y = batch
        logits = model(x).float()  # (B, classes)
        return {
            "loss": F.cross_entropy(logits, y, reduction="sum"),
            "correct": (logits.argmax(dim=1) == y).sum(),
            "count": y.new_tensor(len(y)),
        }

    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        count = max(totals["count"], 1.0)
        return {"val_loss": totals["loss"] / count, "val_acc": totals["correct"] / count}

    @classmethod
    def describe_model(cls, job: hpcpipe.JobConfig) -> str:
        args = job.recipe
        return f"byte CNN ({args['channels']} channels) over {len(args['classes'])} stdlib packages"
