"""The device mesh of a job: data parallel x tensor parallel, and each rank's place in it.

world = dp x tp. The mesh is row-major over global ranks, so the ``tp`` ranks of one tensor-parallel
group are consecutive: the local ranks of one node (NVLink), as Megatron-LM and torchtitan place
them; data parallelism crosses nodes. Without tensor parallelism (tp 1) there is no mesh: the
world group is the data-parallel group, as it always was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcpipe.config import check_layout
from hpcpipe.train.distributed import DistContext


@dataclass(frozen=True)
class Layout:
    """How the world is split: ``dp`` x ``tp`` ranks, and this rank's data-parallel place."""

    dp: int
    tp: int
    dp_rank: int
    mesh: Any = None  # DeviceMesh ("dp", "tp") when tp > 1

    @property
    def tp_mesh(self) -> Any:
        return None if self.mesh is None else self.mesh["tp"]

    @property
    def dp_mesh(self) -> Any:
        return None if self.mesh is None else self.mesh["dp"]

    def describe(self) -> dict[str, Any]:
        """For the log, events.jsonl and checkpoint manifests."""
        groups = None if self.mesh is None else self.mesh.mesh.tolist()  # [[ranks of one tp group], ...]
        return {"dp": self.dp, "tp": self.tp, "tp_groups": groups}


def build_layout(tp: int, ctx: DistContext) -> Layout:
    """The layout for ``parallel.tp`` on this group (ConfigError when it does not divide a node)."""
    check_layout(tp, ctx.world_size, ctx.local_world_size)
    if tp == 1:
        return Layout(dp=ctx.world_size, tp=1, dp_rank=ctx.rank)
    from torch.distributed.device_mesh import init_device_mesh

    dp = ctx.world_size // tp
    mesh = init_device_mesh(ctx.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    return Layout(dp=dp, tp=tp, dp_rank=ctx.rank // tp, mesh=mesh)


def data_parallel_context(ctx: DistContext, layout: Layout) -> DistContext:
    """``ctx`` whose metric reductions run over this rank's data-parallel group."""
    if layout.mesh is None:
        return ctx
    from dataclasses import replace

    return replace(ctx, dp_group=layout.dp_mesh.get_group(), dp_size_=layout.dp)
