"""Distributed checkpoint (DCP) internals and the state-dict staging helpers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from hpcpipe.compat.guard import probe, require


def dcp_set_element(root: Any, path: Any, value: Any) -> None:
    """Put ``value`` at ``path`` of a nested state dict, as DCP's default load planner does."""
    require("torch.distributed.checkpoint._traverse", "set_element", "load non-tensor checkpoint items")(
        root, path, value
    )


def dcp_metadata_path(reader: Any, rank: int | None) -> Any:
    """Where a ``FileSystemReader`` reads ``.metadata`` from (per rank on newer torch)."""
    return require(reader, "_get_metadata_path", "read checkpoint metadata safely")(rank)


_RAW = "write tensors as raw bytes into checkpoint files"


def dcp_file_prefix(plan: Any) -> str:
    """The file-name prefix (``__<rank>_``) ``FileSystemWriter.prepare_global_plan`` gave this
    rank's save plan (a private ``_StoragePrefix`` in its ``storage_data``)."""
    return str(require(plan.storage_data, "prefix", _RAW))


def dcp_storage_info(relative_path: str, offset: int, length: int) -> Any:
    """DCP's record of where one item lies in a file (``FileSystemReader`` metadata)."""
    info = require("torch.distributed.checkpoint.filesystem", "_StorageInfo", _RAW)
    return info(relative_path, offset, length)


_METADATA = "read checkpoint metadata safely"
# The private globals DCP pickles into ``.metadata``, where hpcpipe looks each up.
_METADATA_GLOBALS = (
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),  # a tensor's memory format
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),  # where an item lies in a file
    ("torch.serialization", "_get_layout"),  # looks a name up among torch's layouts, nothing more
)


def dcp_metadata_globals() -> frozenset[tuple[str, str]]:
    """(module, name) pairs the safe ``.metadata`` unpickler may resolve for DCP's private globals:
    where each is looked up, and where pickle records the object itself (``__module__``,
    ``__qualname__``), so the allow-list follows torch when it moves one behind an alias. A torch
    without one is a TorchAPIError naming it, not every checkpoint refused as corrupt."""
    pairs = set()
    for module, name in _METADATA_GLOBALS:
        found = require(module, name, _METADATA)
        pairs |= {(module, name), (found.__module__, found.__qualname__)}
    return frozenset(pairs)


_STAGE = "stage asynchronous checkpoints"


def create_cpu_state_dict(state: dict[str, Any], pin_memory: bool) -> dict[str, Any]:
    """A CPU copy of ``state``'s layout (pinned when asked): the async checkpoint staging buffer."""
    fn = require("torch.distributed._state_dict_utils", "_create_cpu_state_dict", _STAGE)
    return cast(dict[str, Any], fn(state, pin_memory=pin_memory))


def copy_state_dict(state: dict[str, Any], staged: dict[str, Any]) -> dict[str, Any]:
    """Copy ``state`` into the buffer made by ``create_cpu_state_dict``; returns the buffer."""
    fn = require("torch.distributed._state_dict_utils", "_copy_state_dict", _STAGE)
    return cast(dict[str, Any], fn(state, staged))


PRIVATE_APIS: dict[str, Callable[[], Any]] = {
    "checkpoint._traverse.set_element": probe(
        "torch.distributed.checkpoint._traverse", "set_element", purpose="load non-tensor checkpoint items"
    ),
    "FileSystemReader._get_metadata_path": probe(
        "torch.distributed.checkpoint",
        "FileSystemReader",
        "_get_metadata_path",
        purpose="read checkpoint metadata safely",
    ),
    "checkpoint.filesystem._StorageInfo": probe(
        "torch.distributed.checkpoint.filesystem", "_StorageInfo", purpose=_RAW
    ),
    "checkpoint.filesystem._StoragePrefix.prefix": probe(
        "torch.distributed.checkpoint.filesystem", "_StoragePrefix", "__dataclass_fields__", purpose=_RAW
    ),
    "checkpoint.metadata._MEM_FORMAT_ENCODING": probe(
        "torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", purpose=_METADATA
    ),
    "serialization._get_layout": probe("torch.serialization", "_get_layout", purpose=_METADATA),
    "_state_dict_utils._create_cpu_state_dict": probe(
        "torch.distributed._state_dict_utils", "_create_cpu_state_dict", purpose=_STAGE
    ),
    "_state_dict_utils._copy_state_dict": probe(
        "torch.distributed._state_dict_utils", "_copy_state_dict", purpose=_STAGE
    ),
}
"""The private names this module reaches, each with a probe (``hpcpipe.compat.PRIVATE_APIS``)."""
