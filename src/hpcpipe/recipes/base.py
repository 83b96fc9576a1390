"""``hpcpipe.Recipe``: everything workload-specific the trainer must not know about.

A recipe is one class. Its **declaration** (class attributes: ``name``, ``Args``, ``metric_goals``,
...) is read from the class before anything is built: the config validates a job against it, HPO
reads the direction of its metric, the launcher's fork server preloads its modules, ``hpcpipe
recipes show`` lists its arguments. Its **methods** build the model, the data and the loss for
one rank, and say how it prepares, stages and exports its data and checkpoints.

Subclass ``hpcpipe.DatasetRecipe`` (``recipes/dataset.py``) to bring a model, map-style datasets
and a loss, with hpcpipe's loader; subclass this class directly for a recipe with a loader of its
own (the token shards of ``gpt``, the packed conversations of ``lora-function-calling``).

This module is imported while a job's config is validated: it needs nothing heavier than the
standard library at import time (torch only for type checking), and so should a recipe's module
(import torch, data and model code inside the methods), or every command that reads its config
pays for torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, Protocol, Self, TypeAlias

from hpcpipe.errors import ConfigError, UserError
from hpcpipe.recipes.args import parse_args

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hpcpipe.config import DataConfig, JobConfig, TrainConfig

API_VERSION = 1  # Recipe.recipe_api: the registry refuses a recipe written for another version
Batch: TypeAlias = "tuple[torch.Tensor, ...]"
Goal = Literal["min", "max"]


class PaddingBatch(NamedTuple):
    """An evaluation batch run only so that every rank takes part in every forward (FSDP2
    gathers parameters there); the trainer discards its figures."""

    batch: Batch


class TrainLoader(Protocol):
    """A stateful, rank-sharded source of micro-batches, deterministic from (seed, step, rank)."""

    def next_microbatch(self) -> Batch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def set_micro_batch_size(self, micro_batch_size: int) -> None: ...

    def close(self) -> None:
        """Optional: release worker processes or files (called once when training ends, if the
        loader has it)."""


def close_loader(loader: TrainLoader) -> None:
    """Call ``loader.close()`` where the loader has one: a recipe's own loader may have nothing
    to release, and its missing ``close`` failed a run after it had trained."""
    close = getattr(loader, "close", None)
    if close is not None:
        close()


@dataclass(frozen=True)
class RecipeContext:
    """What a recipe gets from the job besides its own arguments: the seed, the batch settings
    (``train:``) and the loader settings (``data.num_workers``, ``pin_memory``, ...)."""

    seed: int
    train: TrainConfig
    data: DataConfig

    @classmethod
    def from_job(cls, job: JobConfig) -> RecipeContext:
        return cls(seed=job.run.seed, train=job.train, data=job.data)


@dataclass(frozen=True)
class DataSummary:
    """What ``prepare`` made ready, for ``hpcpipe data prepare``: a headline, a table, and the
    fields of its ``--json`` output."""

    headline: str  # rich markup: "prepared [bold]data/prepared/ab12[/]"
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    title: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportRequest:
    """``hpcpipe ckpt export`` / the pipeline's export step: write ``checkpoint`` (verified, of
    the run in ``run_dir``) to ``out`` in format ``fmt`` (one of the recipe's ``export_formats``)."""

    checkpoint: Path
    fmt: str
    out: Path
    run_dir: Path
    dtype: str = "fp32"  # of the written weights (``--dtype``): "fp32" or "bf16"

    def torch_dtype(self) -> torch.dtype:
        """``dtype`` as torch's, for ``model.to(...)`` before the weights are written."""
        import torch

        return {"fp32": torch.float32, "bf16": torch.bfloat16}[self.dtype]


class Recipe(ABC):
    """A workload: its declaration, and model, data, loss and evaluation for one rank.

    Public API (``hpcpipe.Recipe``). hpcpipe calls ``from_job`` on every rank, then the methods
    below; the trainer supplies the process group, DDP/FSDP2/DeepSpeed, AMP, accumulation,
    clipping, checkpoints, OOM recovery, metrics and everything around them.
    """

    recipe_api: ClassVar[int] = API_VERSION

    # -- declaration: class attributes, read before anything is built ---------------------------
    name: ClassVar[str]  # run.recipe's name (an entry point's name must equal it)
    summary: ClassVar[str] = ""  # one line for `hpcpipe recipes list`
    Args: ClassVar[type | None] = None  # the job's `recipe:` section: a pydantic model or a dataclass
    # Each evaluation metric and whether it improves downwards ("min") or upwards ("max"): the keys
    # of the evaluation rows (hpo.metric) and HPO's default direction; val_loss is required.
    metric_goals: ClassVar[Mapping[str, Goal]] = {"val_loss": "min"}
    # The model.variant values it builds (None: it does not read model.variant, which is not checked).
    model_variants: ClassVar[tuple[str, ...] | None] = None
    # The data.format values it reads (None: it does not read data.format, which is not checked).
    data_formats: ClassVar[tuple[str, ...] | None] = None
    needs_model_source: ClassVar[bool] = False  # model.name_or_path is required
    # `ckpt export --format` values, the first the pipeline's; an instance may narrow it for its job.
    export_formats: tuple[str, ...] = ()
    evaluations: ClassVar[tuple[str, ...]] = ()  # `hpcpipe eval <kind>` it supports
    # Modules and libraries its workers import beyond the trainer (its own module is implied): the
    # agent's fork server imports them once for every rank and every restart.
    worker_imports: ClassVar[tuple[str, ...]] = ()
    # The model is hpcpipe's own transformer (model.n_layers, d_model, seq_len): `hpcpipe
    # roofline` models its operations.
    own_transformer: ClassVar[bool] = False
    sample_noun: ClassVar[str] = "samples"  # what one sample is, in summaries ("sequences", "images")
    # `hpcpipe recipes check` starts from this preset or YAML (None: the defaults), then applies
    # check_overrides.
    check_preset: ClassVar[str | None] = None
    # The data order is the same at any world size: `recipe check` compares the global batch of a
    # step at 1 and 2 ranks.
    world_size_invariant_order: ClassVar[bool] = True

    # -- how it trains: instance attributes a subclass may set per job --------------------------
    throughput_unit: str = "samples"  # "tokens" or "samples": the metrics key `<unit>_per_s`
    # DDP broadcasts rank 0's buffers at every forward (BatchNorm statistics);
    # parallel.broadcast_buffers overrides it. Every evaluation and checkpoint takes rank 0's either way.
    broadcasts_buffers: bool = False
    # Checkpoints hold only the parameters that require grad (a LoRA run rebuilds its frozen base).
    checkpoint_trainable_only: bool = False
    # The step training reached, set by the worker on every rank before on_train_end (what that
    # exports is the model at this step); None until then.
    trained_step: int | None = None

    def __init__(self, args: Any = None, ctx: RecipeContext | None = None) -> None:
        """What the default ``from_job`` passes: the typed ``recipe:`` section and the context."""
        self.args = args  # the typed `recipe:` section (an instance of Args), or None
        self.ctx = ctx

    @classmethod
    def from_job(cls, job: JobConfig) -> Self:
        """The recipe for ``job``, on every rank: by default ``cls(args, context)``. A recipe that
        reads shared sections (``model:``, ``data:``, ``lora:``) picks them here."""
        return cls(parse_args(cls.Args, job.recipe), RecipeContext.from_job(job))

    @classmethod
    def check_overrides(cls, work: Path) -> dict[str, Any]:
        """Config values (dotted keys) that make the recipe test-sized for ``hpcpipe recipes check``
        (a few CPU-seconds a step); it may write test data under ``work`` and point at them."""
        return {}

    @classmethod
    def check_job(cls, job: JobConfig) -> None:
        """Refuse, when the config is loaded, a job this recipe cannot train: raise
        ``hpcpipe.ConfigError`` naming the key. The default refuses ``parallel.tp`` > 1 when the
        recipe has no ``tensor_parallel_plan``; a recipe with one checks its divisors here too."""
        tp, pp = job.parallel.tp, job.parallel.pp
        if tp > 1 and cls.tensor_parallel_plan is Recipe.tensor_parallel_plan:
            raise ConfigError(no_plan_message(cls.name, tp))
        staged = cls.pipeline_stage is not Recipe.pipeline_stage
        if pp > 1 and not (staged and cls.pipeline_loss is not Recipe.pipeline_loss):
            missing = "pipeline_loss" if staged else "pipeline_stage"
            raise ConfigError(
                f"parallel.pp={pp}: recipe {cls.name!r} declares no pipeline stages "
                f"(Recipe.{missing}); set parallel.pp=1"
            )

    @classmethod
    def describe_model(cls, job: JobConfig) -> str:
        """The model in a few words (``hpcpipe presets list``, summary.md)."""
        return cls.name

    @classmethod
    def scaling_law_size(cls, job: JobConfig, steps: int) -> tuple[float, float] | None:
        """(N, D) of a run of ``job`` trained ``steps`` steps, for ``hpcpipe scaling-law fit``: the
        model's non-embedding parameters and the tokens it trained on. None (the default): the
        recipe's runs are no observations of a language model's scaling law."""
        return None

    @property
    def fsdp_param_dtype(self) -> torch.dtype | None:
        """The dtype FSDP2 gathers parameters in (one per unit); None keeps each parameter's own."""
        return None

    @property
    def items_per_sample(self) -> int:
        """Throughput items in one sample: tokens per sequence, or 1 when counting samples."""
        return 1

    # -- data --------------------------------------------------------------------------------

    def prepare(self, progress: bool) -> DataSummary | None:
        """Make data ready on disk: idempotent, run once per node before the workers train and by
        ``hpcpipe data prepare``. Bad input raises ``hpcpipe.DataError`` naming the file."""
        return None

    def dataset_hash(self) -> str | None:
        """Hash of the prepared dataset's manifest, for lineage."""
        return None

    def stage_source(self, progress: bool = False) -> Any:
        """The files ``data.cache_dir`` staging copies (``hpcpipe.data.stage.StageSource``), the
        data prepared first if they are not (``progress``: show it); None: the recipe's data have no
        file manifest to stage by."""
        return None

    @abstractmethod
    def train_loader(self, rank: int, world_size: int) -> TrainLoader: ...

    def samples_per_epoch(self) -> int | None:
        """Training samples in one epoch (for train.epochs and time/epoch); None when unbounded."""
        return None

    @abstractmethod
    def eval_batches(self, rank: int, world_size: int) -> Iterable[Batch | PaddingBatch]:
        """The same validation micro-batches at every evaluation; every rank the same count."""

    # -- model -------------------------------------------------------------------------------

    @abstractmethod
    def build_model(self) -> nn.Module:
        """The model on the CPU, from the seed the trainer set (the same on every rank)."""

    def shard_units(self, model: nn.Module) -> Sequence[nn.Module]:
        """Sub-modules FSDP2 shards one by one (transformer blocks); [] shards the model as one."""
        return []

    def tensor_parallel_plan(self, model: nn.Module, tp: int) -> Mapping[str, Any] | None:
        """How ``parallel.tp`` > 1 splits ``model``: module names (``fnmatch`` patterns allowed)
        -> ``torch.distributed.tensor.parallel`` styles, applied by the trainer on the
        tensor-parallel mesh before data parallelism wraps the model. An ``nn.Dropout`` that runs
        on sequence-parallel shards gets ``hpcpipe.models.shard_dropout.ShardDropout(dim)`` (the tp
        ranks share one random stream: a plain dropout repeats its mask on every chunk). None (the
        default): the recipe has no plan and ``parallel.tp`` must stay 1. Raise
        ``hpcpipe.ConfigError`` when ``tp`` does not divide the model (heads, widths, sequence
        length)."""
        return None

    def pipeline_stage(
        self, model: nn.Module, blocks: Sequence[int], first: bool, last: bool
    ) -> nn.Module | None:
        """One stage of ``parallel.pp`` > 1: the part of ``model`` that runs the blocks at
        ``blocks`` (indices into ``shard_units(model)``), embedding the batch's first tensor when
        ``first`` and producing the output ``pipeline_loss`` takes when ``last``; other stages take
        and give one activation tensor. Its parameters must keep the full model's names (hold the
        model's own modules under their names), so checkpoints move between layouts. None (the
        default): the recipe has no pipeline stages and ``parallel.pp`` must stay 1."""
        return None

    def pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Under ``parallel.pp`` > 1: the mean loss of the last stage's ``output`` for one
        micro-batch whose target is the batch's second tensor. Evaluation reports
        ``eval_metrics`` over its ``loss`` and ``count`` sums."""
        raise NotImplementedError  # check_job refuses parallel.pp > 1 without it

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean loss over the micro-batch (a scalar that backward() is called on). In training
        ``model`` may be a wrapper of your module (DDP's, DeepSpeed's engine): call it as
        ``model(...)`` only, whose forward is what synchronises gradients; have ``forward`` return
        whatever the loss needs (``model.head(...)`` or ``len(model)`` ran on one process and
        failed on the wrapper at ``--nproc 2``)."""

    @abstractmethod
    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        """Summed evaluation figures of one batch, including ``count``; summed over ranks after.
        ``model`` is your module itself (unwrapped, in eval mode)."""

    @abstractmethod
    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        """The all-reduced sums of every batch -> named metrics; ``val_loss`` is required."""

    def interval_counts(self) -> dict[str, torch.Tensor]:
        """Items counted since the last call on this rank (e.g. supervised tokens); reset on read.
        The trainer sums them over ranks and logs ``<key>_per_s_per_device`` next to throughput."""
        return {}

    def flops_per_sample(self) -> float | None:
        """Training FLOPs (forward + backward) per sample, for MFU; None when unknown."""
        return None

    # -- artifacts ---------------------------------------------------------------------------

    def on_train_start(self, run_dir: Path) -> None:  # noqa: B027  (optional: most recipes write nothing)
        """Files for the run directory before training (main rank only), e.g. a data report."""

    def on_train_end(self, model: nn.Module, is_main: bool, run_dir: Path) -> None:  # noqa: B027
        """Artifacts after training (every rank calls it; only the main rank writes). Under
        ``parallel.pp`` > 1, ``model`` holds only this rank's pipeline stages."""

    def on_run_end(self, run_dir: Path) -> None:  # noqa: B027
        """Work of the main rank alone after ``on_train_end``, before ``run_finished``: the other
        ranks have passed the group's last collective, so a long job here (an evaluation of what
        ``on_train_end`` exported) keeps none of them waiting in one until ``parallel.timeout_s``."""

    def export(self, request: ExportRequest) -> Path:
        """Write ``request.checkpoint`` as ``request.fmt`` into ``request.out``; returns it."""
        raise UserError(f"recipe {self.name!r} exports nothing (it declares no export_formats)")

    def load_export(self, fmt: str, path: Path) -> Any:
        """Load an export back as its consumers would (``hpcpipe recipes check`` calls it)."""
        raise NotImplementedError(f"recipe {self.name!r} does not say how its {fmt!r} export loads")


def no_plan_message(recipe_name: str, tp: int) -> str:
    """The one line for ``parallel.tp`` > 1 on a recipe without a tensor-parallel plan."""
    return (
        f"parallel.tp={tp}: recipe {recipe_name!r} declares no tensor-parallel plan "
        "(Recipe.tensor_parallel_plan); set parallel.tp=1"
    )


def checked_loss(loss: Any) -> Any:
    """``loss`` when it is one number (a 0-d tensor); a UserError saying what to return otherwise
    (a per-sample loss failed later, blaming the evaluation or autograd)."""
    numel = getattr(loss, "numel", None)
    if numel is None or numel() != 1:
        shape = tuple(loss.shape) if hasattr(loss, "shape") else type(loss).__name__
        raise UserError(
            f"the recipe's loss() returned {shape}: return one number, the mean over the micro-batch "
            "(a 0-d tensor: e.g. reduction='mean')"
        )
    return loss.reshape(())  # one number in any shape, (1,) say: as a scalar


def mean_loss_sums(loss: torch.Tensor, batch: Batch) -> dict[str, torch.Tensor]:
    """``loss``, the mean over ``batch``, as the sums the ranks add up: the loss times the batch's
    size (its first tensor's length) and that ``count``, both float64 scalars."""
    import torch

    loss = checked_loss(loss)
    count = torch.tensor(float(len(batch[0])), dtype=torch.float64, device=batch[0].device)
    return {"loss": loss.double() * count, "count": count}
