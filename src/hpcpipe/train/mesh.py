"""The device mesh of a job: pipeline x data parallel x tensor parallel, and each rank's place.

world = pp x dp x tp. The mesh is row-major over global ranks, so the ``tp`` ranks of one
tensor-parallel group are consecutive (the local ranks of one node: NVLink), the data-parallel
replicas come next, and the pipeline stages are the slowest dimension: each stage is a block of
``dp x tp`` ranks, whole nodes when tp divides a node, and consecutive stages talk across nodes,
as Megatron-LM and torchtitan place them. Without tensor or pipeline parallelism (tp = pp = 1)
there is no mesh: the world group is the data-parallel group, as it always was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from hpcpipe.config import check_layout
from hpcpipe.train.distributed import DistContext


@dataclass(frozen=True)
class Layout:
    """How the world is split (``pp`` x ``dp`` x ``tp`` ranks) and this rank's place in it."""

    dp: int
    tp: int
    dp_rank: int
    pp: int = 1
    pp_rank: int = 0
    mesh: Any = None  # DeviceMesh ("pp", "dp", "tp") when tp > 1 or pp > 1

    @property
    def tp_mesh(self) -> Any:
        return None if self.mesh is None else self.mesh["tp"]

    @property
    def dp_mesh(self) -> Any:
        return None if self.mesh is None else self.mesh["dp"]

    @property
    def pp_group(self) -> Any:
        """The process group of this rank's pipeline (the same dp and tp place in every stage)."""
        return None if self.mesh is None else self.mesh["pp"].get_group()

    def summary(self) -> str:
        """``pipeline 2 x data 1 x tensor 2 (tensor groups [[0, 1], [2, 3]], ...)``."""
        described = self.describe()
        groups = ", ".join(
            f"{k.split('_')[0]} groups {v}" for k, v in described.items() if k.endswith("_groups")
        )
        return f"pipeline {self.pp} x data {self.dp} x tensor {self.tp} ({groups})"

    def shape(self) -> dict[str, int]:
        """``{"pp": .., "dp": .., "tp": ..}``: what a checkpoint records of the layout it was saved in."""
        return {"pp": self.pp, "dp": self.dp, "tp": self.tp}

    def describe(self) -> dict[str, Any]:
        """For the log, events.jsonl and checkpoint manifests."""
        described: dict[str, Any] = dict(self.shape())
        if self.mesh is not None:
            grid = self.mesh.mesh  # (pp, dp, tp) global ranks
            described["tp_groups"] = grid.reshape(-1, self.tp).tolist()
            described["pp_groups"] = grid.permute(1, 2, 0).reshape(-1, self.pp).tolist()
        return described


def build_layout(tp: int, ctx: DistContext, pp: int = 1) -> Layout:
    """The layout for ``parallel.tp`` and ``parallel.pp`` on this group (ConfigError when they do
    not divide a node and the world)."""
    check_layout(tp, ctx.world_size, ctx.local_world_size, pp)
    if tp == 1 and pp == 1:
        return Layout(dp=ctx.world_size, tp=1, dp_rank=ctx.rank)
    from torch.distributed.device_mesh import init_device_mesh

    dp = ctx.world_size // (tp * pp)
    mesh = init_device_mesh(ctx.device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    return Layout(
        dp=dp, tp=tp, dp_rank=(ctx.rank // tp) % dp, pp=pp, pp_rank=ctx.rank // (dp * tp), mesh=mesh
    )


def same_rank_places(
    saved: Mapping[str, Any], world_size: int, layout: Layout, recorded: Mapping[str, Any] | None = None
) -> bool:
    """Whether every rank of this run has the place its rank had when ``saved`` (a trainer state)
    was written: the same world and the same pp x dp x tp split. Only then are per-rank states
    (RNG streams, a shrunk micro-batch split) meaningful as saved; a pp 2 checkpoint resumed as
    dp 2 on the same two ranks is another layout. A state written before its layout was (states
    of 2026-12-03 and earlier) holds ``world_size`` and ``tp`` only: the layout its checkpoint's
    manifest ``recorded`` then stands in (manifests record one where tp or pp > 1), and without
    one the run was data parallel (pp 1, dp = world / tp)."""
    saved_world = int(saved["world_size"])
    tp = int(saved.get("tp", 1))
    shape = saved.get("layout") or {"pp": 1, "dp": saved_world // tp, "tp": tp, **_shape_of(recorded)}
    return saved_world == world_size and {k: int(v) for k, v in shape.items()} == layout.shape()


def _shape_of(recorded: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (recorded or {}).items() if k in ("pp", "dp", "tp")}


def data_parallel_context(ctx: DistContext, layout: Layout) -> DistContext:
    """``ctx`` whose metric reductions run over this rank's data-parallel group."""
    if layout.mesh is None:
        return ctx
    return replace(ctx, dp_group=layout.dp_mesh.get_group(), dp_size_=layout.dp)


def dropout_seed(seed: int, layout: Layout) -> int:
    """This rank's seed for the random numbers of training (dropout), from ``run.seed``: another
    per data-parallel rank (the data differ too) and per pipeline stage (other layers: one stream
    drew stage 0's masks again in every stage), the same within a tensor-parallel group (its
    replicated activations must stay equal)."""
    return seed + layout.dp_rank + layout.dp * layout.pp_rank
