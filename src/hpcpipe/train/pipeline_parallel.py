"""Pipeline parallelism applied outside model code: the recipe's stages on ``torch.distributed.pipelining``.

The recipe's blocks (``Recipe.shard_units``) are cut into ``pp x v`` contiguous stages, balanced by
parameter count or at ``parallel.pp_split``; rank ``r`` of a pipeline runs stages ``r, r + pp, ...``
(``v`` > 1: interleaved 1F1B). ``Recipe.pipeline_stage`` builds each stage from the full model
(every rank builds the whole model from the seed first: identical weights without a broadcast).
The stages this rank runs are gathered under their own names in one module (``StageModules``): the
optimizer steps it and the checkpoint store saves it, so a checkpoint's names are the full model's.

A step feeds the rank's share of the global batch to the schedule, which splits it into the job's
accumulation steps as micro-batches; the first stage reads the inputs (the batch's first tensor),
the last computes ``Recipe.pipeline_loss`` against the targets (its second), and the mean loss is
summed over the pipeline group so every rank logs it. Evaluation is a forward pass through the
stages in order (point-to-point sends of each activation), its loss sums on the last stage.

Parameters that two stages share (the GPT's token embedding, tied to its LM head on the last
stage) are two copies after the split; their gradients are summed over the stages that hold them
after every backward, so the copies stay equal (Megatron-LM's embedding all-reduce). After a
restore every copy takes its first holder's weight and optimizer state (``tie_copies``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from hpcpipe.config import ParallelConfig, TrainConfig
from hpcpipe.errors import ConfigError


def split_blocks(sizes: Sequence[int], stages: int, starts: Sequence[int] | None = None) -> list[range]:
    """``stages`` contiguous ranges over blocks of ``sizes`` parameters: starting at ``starts``
    (stage 2 onwards), or where the running parameter count crosses each ``k / stages`` of the
    total (every stage at least one block)."""
    n = len(sizes)
    if stages > n:
        raise ConfigError(
            f"parallel.pp x virtual_stages = {stages} stages for {n} blocks: at most one stage per block"
        )
    if starts is None:
        starts = _balanced_starts(sizes, stages)
    if len(starts) != stages - 1 or (starts[-1:] and starts[-1] >= n):
        raise ConfigError(f"parallel.pp_split {list(starts)}: {stages - 1} block indices below {n} needed")
    bounds = [0, *starts, n]
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def _balanced_starts(sizes: Sequence[int], stages: int) -> list[int]:
    total = sum(sizes)
    starts: list[int] = []
    running = 0
    for index, size in enumerate(sizes):
        remaining_stages = stages - 1 - len(starts)
        remaining_blocks = len(sizes) - index
        target = total * (len(starts) + 1) / stages
        # Cut before this block when the running count reached the next target, or when every later
        # stage needs one of the remaining blocks.
        if index > 0 and remaining_stages > 0 and (running >= target or remaining_blocks == remaining_stages):
            starts.append(index)
        running += size
    return starts


class StageModules(nn.Module):
    """The stages one rank runs, merged under their own (the full model's) names."""

    def __init__(self, stages: Sequence[nn.Module]) -> None:
        super().__init__()
        for stage in stages:
            for name, child in stage.named_children():
                if isinstance(child, nn.ModuleDict):  # blocks of the rank's stages: {"3": ..., "7": ...}
                    if name not in self._modules:  # a new dict: the stage's own stays as it is
                        self.add_module(name, nn.ModuleDict())
                    self.get_submodule(name).update(dict(child.items()))  # type: ignore[operator]
                elif name not in self._modules:
                    self.add_module(name, child)
        for stage in stages:  # non-persistent buffers (RoPE tables): not saved, kept for .to()
            for name, buffer in stage.named_buffers(recurse=False):
                if not hasattr(self, name):
                    self.register_buffer(name, buffer, persistent=False)


@dataclass
class TiedCopy:
    """One parameter held by several stages: its name here and the group of ranks holding it;
    ``counted``: this copy is the one the gradient norm counts (the first holder's); ``source``:
    the first holder's global rank."""

    name: str
    group: Any
    counted: bool
    source: int


@dataclass
class Pipeline:
    """This rank's part of a pipeline, and how to train and evaluate through it."""

    modules: StageModules
    stages: list[nn.Module]
    stage_ids: list[int]
    n_stages: int
    group: Any
    tied: list[TiedCopy] = field(default_factory=list)
    loss_fn: Any = None  # Recipe.pipeline_loss
    make_schedule: Any = None  # (stage inputs, stage outputs) -> the schedule: see schedule_for
    schedule: Any = None
    micro_batches: int = 1

    @property
    def first(self) -> bool:
        return 0 in self.stage_ids

    @property
    def last(self) -> bool:
        return self.n_stages - 1 in self.stage_ids

    def train_step(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Forward and backward of every micro-batch of ``batch``; the mean loss on every rank."""
        losses: list[torch.Tensor] = []
        inputs, target = batch[0], batch[1]
        if self.schedule is None:
            self.schedule = self.schedule_for(batch)
        if self.first:
            self.schedule.step(inputs, target=target if self.last else None, losses=losses)
        elif self.last:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
        self.sync_tied_gradients()
        device = inputs.device
        loss = torch.stack(losses).mean().detach() if losses else torch.zeros((), device=device)
        dist.all_reduce(loss, group=self.group)  # only the last stage's is non-zero
        return loss

    def not_in_norm(self) -> set[int]:
        """Ids of this rank's tied copies another stage's copy stands for in the gradient norm."""
        return {id(self.modules.get_parameter(t.name)) for t in self.tied if not t.counted}

    def sync_tied_gradients(self) -> None:
        """Sum each tied parameter's gradient over the stages that hold a copy of it. A DTensor
        gradient is first laid out as its parameter is (an embedding's row-sharded weight gets a
        replicated gradient): every copy's local piece then covers the same rows."""
        for tied in self.tied:
            param: Any = self.modules.get_parameter(tied.name)
            grad = param.grad
            if grad is None:
                continue
            if isinstance(grad, DTensor):
                if grad.placements != param.placements:
                    grad = param.grad = grad.redistribute(param.device_mesh, param.placements)
                dist.all_reduce(grad.to_local(), group=tied.group)
            else:
                dist.all_reduce(grad, group=tied.group)

    @torch.no_grad()
    def tie_copies(self, optimizer: torch.optim.Optimizer) -> None:
        """After a restore: every tied copy takes its first holder's weight and optimizer state. A
        checkpoint saved without a pipeline holds the optimizer state under the first name only
        (the embedding's): the head's copy started with none, and with other moments than the
        embedding's the copies drifted apart though their gradients were summed."""
        for tied in self.tied:
            param: Any = self.modules.get_parameter(tied.name)
            dist.broadcast(_local(param), tied.source, group=tied.group)
            _broadcast_state(optimizer.state, param, tied)

    @torch.no_grad()
    def evaluate_all(
        self, batches: Iterable[tuple[tuple[torch.Tensor, ...], bool]], dp_group: Any
    ) -> dict[str, float]:
        """The loss and count sums of every (batch, counts) over the pipeline and data-parallel
        ranks; a batch that does not count runs (every stage takes part) and adds nothing."""
        totals: torch.Tensor | None = None
        for batch, counts in batches:
            sums = self.evaluate(batch)
            totals = (sums if counts else sums * 0) + (0 if totals is None else totals)
        assert totals is not None, "every rank has evaluation batches"
        dist.all_reduce(totals, group=self.group)  # the last stage's sums, on every stage
        if dp_group is not None and dist.get_world_size(dp_group) > 1:
            dist.all_reduce(totals, group=dp_group)
        return {"loss": float(totals[0]), "count": float(totals[1])}

    def schedule_for(self, batch: tuple[torch.Tensor, ...]) -> Any:
        """The schedule, its stages given the shapes of their inputs and outputs on one
        micro-batch of ``batch``, taken by a forward pass: torch's own shape inference runs the
        stages on meta tensors, which a tensor-parallel stage's sequence-sharded activations
        (B, T/tp, C) mislead."""
        micro = tuple(t[: len(t) // self.micro_batches] for t in batch)
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        # Built at a process's first step: its pass must not draw from the generators (dropout),
        # or a resumed process's steps would differ from the uninterrupted run's.
        device = batch[0].device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            self.forward(micro, inputs, outputs)
        return self.make_schedule(inputs, outputs)

    @torch.no_grad()
    def evaluate(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """(2,) float64: the batch's loss sum and count on the last stage, zeros elsewhere."""
        sums = torch.zeros(2, dtype=torch.float64, device=batch[0].device)
        output = self.forward(batch)
        if output is not None:
            count = float(len(batch[0]))
            sums[0] = self.loss_fn(output, batch[1]).double() * count
            sums[1] = count
        return sums

    @torch.no_grad()
    def forward(
        self,
        batch: tuple[torch.Tensor, ...],
        inputs: dict[int, torch.Tensor] | None = None,
        outputs: dict[int, torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        """``batch`` through every stage in order (each activation sent to the next stage's rank);
        the last stage's output on its rank, else None. ``inputs`` and ``outputs`` collect what
        this rank's stages took and gave, by stage id."""
        activation, output = batch[0], None
        for stage_id in self.stage_ids:  # increasing: s, s + pp, ...
            index = self.stage_ids.index(stage_id)
            if stage_id > 0:
                activation = _receive(self._rank_of(stage_id - 1), self.group, batch[0].device)
            if inputs is not None:
                inputs[stage_id] = _example(activation)
            activation = self.stages[index](activation)
            if outputs is not None:
                outputs[stage_id] = _example(activation)
            if stage_id < self.n_stages - 1:
                _send(activation, self._rank_of(stage_id + 1), self.group)
            else:
                output = activation
        return output

    def _rank_of(self, stage_id: int) -> int:
        return dist.get_global_rank(self.group, stage_id % dist.get_world_size(self.group))


def _local(tensor: Any) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


_SHAPED = "shaped"  # a state tensor laid out as its parameter (Adam's moments): sent as a tensor


def _broadcast_state(states: Any, param: Any, tied: TiedCopy) -> None:
    """``param``'s optimizer state from ``tied.source`` to the other copies: what each entry is
    first (objects), then the entries shaped as the parameter's local piece as tensors."""
    piece = _local(param)
    is_source = dist.get_rank() == tied.source
    state = states.get(param)
    found: list[Any] = [None]
    if is_source and state is not None:
        found = [{key: _describe(value, piece) for key, value in state.items()}]
    dist.broadcast_object_list(found, tied.source, group=tied.group)
    entries = found[0]
    if entries is None:  # no state at the first holder (no gradient yet): none here either
        states.pop(param, None)
        return
    if not is_source:
        state = states[param] = {key: _placed(entry, param) for key, entry in entries.items()}
    assert state is not None
    for key in sorted(key for key, entry in entries.items() if entry[0] == _SHAPED):
        dist.broadcast(_local(state[key]), tied.source, group=tied.group)


def _describe(value: Any, piece: torch.Tensor) -> tuple[Any, ...]:
    """(_SHAPED, dtype), or ("value", the value, on the parameter's device)."""
    if isinstance(value, torch.Tensor):
        local = _local(value)
        if local.shape == piece.shape and local.device == piece.device:
            return (_SHAPED, value.dtype)
        return ("value", local.cpu(), local.device == piece.device)
    return ("value", value, False)


def _placed(entry: tuple[Any, ...], param: Any) -> Any:
    """A receiving copy's state entry: a tensor laid out as ``param`` for a shaped one."""
    if entry[0] == _SHAPED:
        return torch.empty_like(param.detach(), dtype=entry[1])
    value, on_device = entry[1], entry[2]
    return value.to(param.device) if on_device else value


def _example(tensor: torch.Tensor) -> torch.Tensor:
    """A stage's example input or output as training sees it: activations require gradients (a
    stage sends its input's gradient back only when its example input asks for one)."""
    return tensor.detach().requires_grad_(tensor.is_floating_point())


# -- point-to-point for evaluation: a header (ndim, shape, dtype) then the tensor ------------------

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64]
_HEADER = 8  # ndim + up to 6 dimensions + dtype index


def _send(tensor: torch.Tensor, dst: int, group: Any) -> None:
    tensor = tensor.contiguous()
    header = torch.zeros(_HEADER, dtype=torch.int64, device=tensor.device)
    header[0] = tensor.dim()
    header[1 : 1 + tensor.dim()] = torch.tensor(tensor.shape)
    header[-1] = _DTYPES.index(tensor.dtype)
    dist.send(header, dst, group=group)
    dist.send(tensor, dst, group=group)


def _receive(src: int, group: Any, device: torch.device) -> torch.Tensor:
    header = torch.zeros(_HEADER, dtype=torch.int64, device=device)
    dist.recv(header, src, group=group)
    ndim = int(header[0])
    shape = [int(d) for d in header[1 : 1 + ndim]]
    tensor = torch.empty(shape, dtype=_DTYPES[int(header[-1])], device=device)
    dist.recv(tensor, src, group=group)
    return tensor


# -- building -----------------------------------------------------------------------------------


def build_pipeline(
    recipe: Any,
    model: nn.Module,
    units: Sequence[nn.Module],
    cfg: ParallelConfig,
    layout: Any,
    train: TrainConfig,
    wrap: Callable[[nn.Module, Sequence[nn.Module]], Any],
    micro_batches: int,
    device: torch.device,
) -> Pipeline:
    """This rank's stages of ``model``, sharded (tensor parallel, then ``wrap``: FSDP2 over the
    data-parallel ranks), checkpointed and compiled per block as ``train`` asks, and scheduled."""
    from torch.distributed.pipelining import PipelineStage

    from hpcpipe.train.activation_checkpointing import apply_activation_checkpointing
    from hpcpipe.train.tensor_parallel import apply_tensor_parallel, tensor_parallel_plan

    stages, ranges = cut_stages(recipe, model, units, cfg)
    ids = [layout.pp_rank + k * cfg.pp for k in range(cfg.virtual_stages)]
    owners = {name: s % cfg.pp for s, stage in enumerate(stages) for name, _ in stage.named_parameters()}
    modules = StageModules([stages[s] for s in ids])
    tied = tied_copies(model, owners, layout.mesh.mesh, set(dict(modules.named_parameters())))
    if layout.tp > 1:  # the recipe's plan for the modules this rank holds
        plan = tensor_parallel_plan(recipe, model, layout.tp)
        apply_tensor_parallel(modules, {k: v for k, v in plan.items() if _holds(modules, k)}, layout.tp_mesh)
    own_units = {s: [units[i] for i in ranges[s]] for s in ids}
    apply_activation_checkpointing([u for s in ids for u in own_units[s]], train.activation_checkpointing)
    for s in ids:
        if train.compile:  # per-block graphs, before FSDP2 wraps them
            for unit in own_units[s]:
                unit.compile()
        wrap(stages[s], own_units[s])
    n_stages = len(stages)

    def make_schedule(inputs: dict[int, torch.Tensor], outputs: dict[int, torch.Tensor]) -> Any:
        runners = [
            PipelineStage(stages[s], s, n_stages, device, inputs[s], outputs[s], group=layout.pp_group)
            for s in ids
        ]
        return build_schedule(cfg, runners, micro_batches, recipe.pipeline_loss)

    own = [stages[s] for s in ids]
    return Pipeline(
        modules,
        own,
        ids,
        n_stages,
        layout.pp_group,
        tied,
        recipe.pipeline_loss,
        make_schedule,
        None,
        micro_batches,
    )


def cut_stages(
    recipe: Any, model: nn.Module, units: Sequence[nn.Module], cfg: ParallelConfig
) -> tuple[list[nn.Module], list[range]]:
    """Every stage of the pipeline in order (stage ``s`` runs on pipeline rank ``s % pp``) and the
    blocks each runs."""
    n_stages = cfg.pp * cfg.virtual_stages
    sizes = [sum(p.numel() for p in unit.parameters()) for unit in units]
    ranges = split_blocks(sizes, n_stages, cfg.pp_split)
    stages = []
    for stage_id, blocks in enumerate(ranges):
        stage = recipe.pipeline_stage(model, list(blocks), stage_id == 0, stage_id == n_stages - 1)
        if stage is None:
            raise ConfigError(f"parallel.pp: recipe {recipe.name!r} builds no pipeline stages")
        stages.append(stage)
    return stages, ranges


def _holds(module: nn.Module, name: str) -> bool:
    if "*" in name:
        return True
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def tied_copies(
    model: nn.Module, owners: dict[str, int], grid: torch.Tensor, mine: set[str]
) -> list[TiedCopy]:
    """The parameters of ``model`` that stages on different pipeline ranks hold (``owners``: name
    -> pipeline rank) and the groups that sum their gradients; ``grid``: the (pp, dp, tp) global
    ranks; ``mine``: this rank's parameter names. Every rank creates every group (``new_group`` is
    collective, in the same order everywhere)."""
    aliases: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    copies: list[TiedCopy] = []
    for names in aliases.values():
        holders = sorted({owners[n] for n in names if n in owners})
        if len(holders) < 2:
            continue
        for pipeline in grid.permute(1, 2, 0).reshape(-1, grid.shape[0]).tolist():  # one per (dp, tp)
            ranks = [pipeline[h] for h in holders]
            group = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                copies += [TiedCopy(n, group, owners[n] == holders[0], ranks[0]) for n in names if n in mine]
    return copies


def build_schedule(cfg: ParallelConfig, stages: list[Any], micro_batches: int, loss_fn: Any) -> Any:
    """The ``torch.distributed.pipelining`` schedule for ``parallel.pp_schedule``."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    try:
        if cfg.pp_schedule == "interleaved-1f1b":
            return ScheduleInterleaved1F1B(stages, n_microbatches=micro_batches, loss_fn=loss_fn)
        kind = ScheduleGPipe if cfg.pp_schedule == "gpipe" else Schedule1F1B
        return kind(stages[0], n_microbatches=micro_batches, loss_fn=loss_fn)
    except ValueError as exc:  # torch's own checks of micro-batches against stages
        raise ConfigError(f"parallel.pp_schedule={cfg.pp_schedule}: {exc}") from None


def bubble_fraction(pp: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """The idle share of a 1F1B step: (p - 1) / (v m + p - 1) (Narayanan et al. 2021)."""
    return (pp - 1) / (virtual_stages * micro_batches + pp - 1) if pp > 1 else 0.0
