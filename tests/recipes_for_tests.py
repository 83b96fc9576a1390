"""Recipes the tests name by import path (``tests.recipes_for_tests:Tiny``): one that works, and
one of each mistake a recipe author can make."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

import hpcpipe


class TinyArgs(BaseModel):
    hidden: int = Field(8, ge=1, description="Hidden width.")
    samples: int = Field(64, ge=8, description="Training samples.")
    activation: str = Field("relu", description="relu or tanh.")
    val_samples: int = Field(16, ge=1, description="Validation samples.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout after the hidden layer.")
    inputs: str = Field(
        "float32", description="The inputs' dtype (float64: a mistake, the model is float32)."
    )


class Tiny(hpcpipe.DatasetRecipe):
    """A regression small enough for in-process tests."""

    name = "tiny-regression"
    summary = "an MLP on generated (x, y) pairs"
    Args = TinyArgs
    metric_goals = {"val_loss": "min", "val_r2": "max"}  # noqa: RUF012

    def build_model(self) -> Any:
        from torch import nn

        if self.args.activation not in ("relu", "tanh"):
            raise ValueError(f"activation {self.args.activation!r}: relu or tanh")  # a bug of the user's
        act = nn.ReLU() if self.args.activation == "relu" else nn.Tanh()
        hidden = self.args.hidden
        return nn.Sequential(nn.Linear(4, hidden), act, nn.Dropout(self.args.dropout), nn.Linear(hidden, 1))

    def datasets(self) -> hpcpipe.Datasets:
        import torch
        from torch.utils.data import TensorDataset

        g = torch.Generator().manual_seed(0)
        n = self.args.samples + self.args.val_samples
        x = torch.randn(n, 4, generator=g)
        y = x.sum(dim=1, keepdim=True)
        x = x.to(getattr(torch, self.args.inputs))  # float64: torch's own RuntimeError in the loss
        cut = self.args.samples
        return hpcpipe.Datasets(TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:]))

    def loss(self, model: Any, batch: hpcpipe.Batch) -> Any:
        import torch.nn.functional as F

        x, y = batch
        return F.mse_loss(model(x), y)

    def eval_sums(self, model: Any, batch: hpcpipe.Batch) -> dict[str, Any]:
        x, y = batch
        err = ((model(x) - y) ** 2).sum()
        return {"loss": err / 1.0, "sq": (y**2).sum(), "count": x.new_tensor(len(x))}

    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        return {
            "val_loss": totals["loss"] / totals["count"],
            "val_r2": 1 - totals["loss"] / max(totals["sq"], 1e-9),
        }


class BatchNormTiny(Tiny):
    """Tiny with a BatchNorm layer: running statistics each DDP rank updates from its own batches
    (a DatasetRecipe does not broadcast buffers at every forward)."""

    name = "batchnorm-tiny"

    def build_model(self) -> Any:
        from torch import nn

        hidden = self.args.hidden
        return nn.Sequential(nn.Linear(4, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, 1))


class _Jittered:
    """A split whose items draw noise from torch's generator (an augmentation, as the docs allow)."""

    def __init__(self, base: Any) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> Any:
        import torch

        x, y = self.base[i]
        return x + 0.01 * torch.randn(x.shape), y


class JitteredTiny(Tiny):
    """Augmented training and validation items beside dropout: the MFU count read a training item
    after the resume restored the streams, and each evaluation drew from them."""

    name = "jittered-tiny"

    def datasets(self) -> hpcpipe.Datasets:
        data = super().datasets()
        return hpcpipe.Datasets(_Jittered(data.train), _Jittered(data.val))


class WorldSizedOrder(Tiny):
    """A data order that depends on the world size, declared as the docs say."""

    name = "world-sized-order"
    world_size_invariant_order = False

    def train_loader(self, rank: int, world_size: int) -> Any:
        from hpcpipe.data.map_style import MapStyleTrainLoader, SeededSamples

        ctx, train = self._context(), self.data.train
        seed = ctx.seed + 1000 * world_size
        sizes = (ctx.train.micro_batch_size, ctx.train.global_batch_size)
        samples = SeededSamples(train, seed)
        return MapStyleTrainLoader(
            samples, len(train), ctx.data, *sizes, rank, world_size, seed, self.collate
        )


class RankBlind(WorldSizedOrder):
    """A loader that ignores its rank: every rank trains on rank 0's samples."""

    name = "rank-blind"

    def train_loader(self, rank: int, world_size: int) -> Any:
        return super().train_loader(0, world_size)


class UnusedHead(Tiny):
    """A model with a head the loss never uses (as an expert no token reaches)."""

    name = "unused-head"

    def build_model(self) -> Any:
        from torch import nn

        class WithSpareHead(nn.Module):
            def __init__(self, body: nn.Module) -> None:
                super().__init__()
                self.body, self.spare = body, nn.Linear(4, 1)

            def forward(self, x: Any) -> Any:
                return self.body(x)

        return WithSpareHead(super().build_model())


class SummedLoss(Tiny):
    """A loss summed over the micro-batch: every property that trains passed it."""

    name = "summed-loss"

    def loss(self, model: Any, batch: hpcpipe.Batch) -> Any:
        import torch.nn.functional as F

        x, y = batch
        return F.mse_loss(model(x), y, reduction="sum")


class MissingLoss(hpcpipe.DatasetRecipe):
    name = "missing-loss"

    def build_model(self) -> Any:
        raise NotImplementedError

    def datasets(self) -> hpcpipe.Datasets:
        raise NotImplementedError


class NotARecipe:
    name = "not-a-recipe"


class NoValLoss(Tiny):
    metric_goals = {"val_r2": "max"}  # noqa: RUF012


class BadName(Tiny):
    name = "Bad Name"


class EmptyData(Tiny):
    name = "empty-data"

    def datasets(self) -> hpcpipe.Datasets:
        return hpcpipe.Datasets([], [1])


class NoArgs(Tiny):
    name = "no-args"
    Args = None

    def build_model(self) -> Any:
        from torch import nn

        return nn.Linear(4, 1)

    @property
    def args(self) -> Any:
        return TinyArgs()

    @args.setter
    def args(self, value: Any) -> None:
        pass


class BadDefaultArgs(TinyArgs):
    hidden: int = Field(0, ge=1, description="A default its own rule refuses.")


class BadDefault(Tiny):
    name = "bad-default"
    Args = BadDefaultArgs


class EvalModeTiny(Tiny):
    """Built in eval mode, as Hugging Face's from_pretrained returns a model."""

    name = "eval-mode-tiny"

    def build_model(self) -> Any:
        return super().build_model().eval()


class SignalledInEval(Tiny):
    """Each rank gets SIGTERM at its first evaluation batch (a preemption while a long evaluation
    runs) and counts the batches it evaluated in ``$EVAL_BATCHES/rank<RANK>``."""

    name = "signalled-in-eval"

    def eval_sums(self, model: Any, batch: hpcpipe.Batch) -> dict[str, Any]:
        import os
        import signal
        from pathlib import Path

        counted = Path(os.environ["EVAL_BATCHES"], f"rank{os.environ.get('RANK', '0')}")
        done = int(counted.read_text()) if counted.exists() else 0
        counted.write_text(str(done + 1))
        if done == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().eval_sums(model, batch)
