"""``hpcpipe.DatasetRecipe``: bring a model, map-style datasets and a loss; hpcpipe brings the rest.

The author writes what is theirs (``build_model``, ``datasets``, ``loss``; optionally ``collate``,
``eval_sums``/``eval_metrics``, ``shard_units``, the export) and declares the recipe's ``name``,
``Args`` and ``metric_goals`` as class attributes. hpcpipe supplies the loader over the datasets
(``data/map_style.py``: rank-sharded, resumable, the same batch from the same seed, step and rank
across restarts and world sizes, augmentations reproducible), evaluation sharded over the ranks,
FLOPs per sample for MFU (counted by torch on the meta device), a safetensors export, and
everything the trainer does around them (DDP/FSDP2/DeepSpeed, AMP, accumulation, clipping,
checkpoints, metrics, chaos-proven recovery).

A sketch (examples/recipes/ has a whole package)::

    class Args(pydantic.BaseModel):
        hidden: int = 64

    class Regression(hpcpipe.DatasetRecipe):
        name = "my-regression"
        Args = Args

        def build_model(self):
            hidden = self.args.hidden
            return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 1))

        def datasets(self):
            data = TensorDataset(...)
            return hpcpipe.Datasets(train=Subset(data, range(900)), val=Subset(data, range(900, 1000)))

        def loss(self, model, batch):
            x, y = batch
            return torch.nn.functional.mse_loss(model(x), y)

Like every recipe module, this one imports torch only inside its methods: the config reads a
recipe's declaration without it.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from hpcpipe.errors import DataError
from hpcpipe.recipes.base import (
    Batch,
    DataSummary,
    ExportRequest,
    PaddingBatch,
    Recipe,
    TrainLoader,
    mean_loss_sums,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    import torch
    from torch import nn

EXPORT_FILE = "model.safetensors"
EXPORT_INFO = "hpcpipe-export.json"


class MapDataset(Protocol):
    """A map-style dataset (``torch.utils.data.Dataset`` with ``__len__``, or any such object)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class Datasets(NamedTuple):
    """A recipe's map-style datasets: every item a tuple of tensors or numbers (or one tensor),
    unless the recipe's ``collate`` says otherwise."""

    train: MapDataset
    val: MapDataset


class DatasetRecipe(Recipe):
    """A recipe over map-style datasets, with hpcpipe's loader (public API: ``hpcpipe.DatasetRecipe``).

    ``self.args`` is the typed ``recipe:`` section (an instance of ``Args``), ``self.ctx`` the
    seed and the ``train:``/``data:`` sections. Build heavy things lazily (in the methods, or
    ``functools.cached_property``): hpcpipe constructs the recipe on every rank and in tools
    that only read its declaration.
    """

    export_formats: tuple[str, ...] = ("safetensors",)

    # -- what the author writes ----------------------------------------------------------------

    @abstractmethod
    def build_model(self) -> nn.Module:
        """The model on the CPU (the trainer seeds torch first, the same on every rank)."""

    @abstractmethod
    def datasets(self) -> Datasets:
        """The training and validation datasets (map-style: ``__len__`` and ``__getitem__``)."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean loss over a micro-batch (``collate``'s tuple, on the device). In training ``model``
        may be a wrapper of your module (DDP's): call it as ``model(...)`` only (its forward
        synchronises gradients; the wrapper has none of your module's attributes)."""

    def collate(self, items: list[Any]) -> Batch:
        """A micro-batch from dataset items: torch's ``default_collate``, as a tuple."""
        from hpcpipe.data.map_style import collate_tuple

        return collate_tuple(items)

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        """Summed figures of one validation batch, ``count`` included: by default the loss times
        the batch's size (its first tensor's length)."""
        return mean_loss_sums(self.loss(model, batch), batch)

    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        """Metrics from the sums over every rank and batch: by default ``val_loss``."""
        return {"val_loss": totals["loss"] / max(totals["count"], 1.0)}

    def save_export(self, model: nn.Module, fmt: str, out: Path) -> None:
        """Write ``model`` (the checkpoint's weights, on the CPU) as ``fmt`` into ``out``: by default
        ``model.safetensors`` (``safetensors.torch.load_model`` reads it back)."""
        from safetensors.torch import save_model

        save_model(model, str(out / EXPORT_FILE))

    def load_export(self, fmt: str, path: Path) -> Any:
        """The model ``save_export`` wrote, loaded as a user would (every weight must fit)."""
        from safetensors.torch import load_model

        model = self.build_model()
        load_model(model, str(path / EXPORT_FILE), strict=True)
        return model

    # -- what hpcpipe supplies -----------------------------------------------------------------

    @cached_property
    def data(self) -> Datasets:
        """``datasets()``, checked once per process."""
        data = self.datasets()
        if not isinstance(data, tuple) or len(data) != 2:
            raise DataError(f"recipe {self.name!r}: datasets() must return hpcpipe.Datasets(train, val)")
        for split, dataset in zip(("train", "val"), data, strict=True):
            try:
                size = len(dataset)
            except TypeError:
                raise DataError(f"recipe {self.name!r}: the {split} dataset has no len()") from None
            if size == 0:
                raise DataError(f"recipe {self.name!r}: the {split} dataset is empty")
        return Datasets(*data)

    def prepare(self, progress: bool) -> DataSummary:
        """The datasets built and checked (their files read, if they read any) before any worker starts."""
        sizes = {split: len(dataset) for split, dataset in zip(("train", "val"), self.data, strict=True)}
        return DataSummary(
            headline=f"recipe [bold]{self.name}[/]: {sizes['train']:,} training, {sizes['val']:,} validation",
            details={"recipe": self.name, "samples": sizes},
        )

    def samples_per_epoch(self) -> int | None:
        return len(self.data.train)

    def dataset_hash(self) -> str | None:
        """A fingerprint of the datasets this process built (``data/fingerprint.py``): lineage
        records it, and a resume on other data is noticed (it trained on silently)."""
        from hpcpipe.data.fingerprint import datasets_fingerprint

        return datasets_fingerprint(self.data)

    def train_loader(self, rank: int, world_size: int) -> TrainLoader:
        from hpcpipe.data.map_style import MapStyleTrainLoader, SeededSamples

        ctx = self._context()
        train = self.data.train
        return MapStyleTrainLoader(
            SeededSamples(train, ctx.seed),
            len(train),
            ctx.data,
            ctx.train.micro_batch_size,
            ctx.train.global_batch_size,
            rank,
            world_size,
            ctx.seed,
            self.collate,
        )

    def eval_batches(self, rank: int, world_size: int) -> Iterable[Batch | PaddingBatch]:
        from hpcpipe.data.map_style import MapStyleEvalBatches

        micro = self._context().train.micro_batch_size
        return MapStyleEvalBatches(self.data.val, micro, rank, world_size, self.collate)

    def flops_per_sample(self) -> float | None:
        """Training FLOPs of one sample: 3x the forward of ``loss`` (forward + backward), counted
        by torch on the meta device; None when the model or loss cannot run there."""
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        try:
            batch = tuple(t.to("meta") for t in self.collate([self.data.train[0]]))
            with torch.device("meta"):
                model = self.build_model()
                with FlopCounterMode(display=False) as counter:
                    self.loss(model, batch)
        except Exception:  # a data-dependent op, a custom kernel: no MFU rather than a wrong one
            return None
        flops = counter.get_total_flops()
        return 3.0 * flops if flops else None

    def export(self, request: ExportRequest) -> Path:
        """The checkpoint's weights in a freshly built model, in ``request.dtype``, handed to
        ``save_export``."""
        from hpcpipe.checkpoint.export import load_weights

        model = self.build_model()
        load_weights(request.checkpoint, model, trainable_only=self.checkpoint_trainable_only)
        model.eval().to(request.torch_dtype())  # --dtype: the weights as written
        request.out.mkdir(parents=True, exist_ok=True)
        self.save_export(model, request.fmt, request.out)
        info = {"recipe": self.name, "format": request.fmt, "checkpoint": request.checkpoint.name}
        (request.out / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")
        return request.out

    def _context(self) -> Any:
        if self.ctx is None:
            raise TypeError(f"{type(self).__name__} was built without a context: build it with from_job(job)")
        return self.ctx
