"""What every export of a committed checkpoint starts with: the checkpoint verified, the run's
config found, and a model's weights loaded from it. The formats themselves are the recipe's
(``Recipe.export``; ``recipes/export.py`` drives it): hpcpipe's GPT in ``models/gpt_export.py``,
LoRA adapters in ``models/lora_export.py``, any model as safetensors in ``recipes/dataset.py``.

Weights are read in one process without a process group (DCP reshards whatever world size wrote
them into one full model), after every file was verified against the manifest, through the safe
reader (``safe_dcp.py``): exporting a checkpoint from elsewhere runs none of its bytes. A
DeepSpeed checkpoint is read with ``weights_only`` and consolidated by DeepSpeed's ``zero_to_fp32``.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from hpcpipe.checkpoint.deepspeed_io import is_deepspeed_checkpoint, load_consolidated_into
from hpcpipe.checkpoint.manifest import CheckpointError, verify_dir
from hpcpipe.checkpoint.safe_dcp import load_state_safely
from hpcpipe.layout import RunLayout

__all__ = ["find_job_config", "load_weights", "verify_for_export"]


def verify_for_export(ckpt: Path) -> None:
    """CheckpointError naming the first file of ``ckpt`` that differs from its manifest."""
    _, problems = verify_dir(ckpt)
    if problems:
        raise CheckpointError(f"{ckpt}/{problems[0]} (refusing to export)")


def find_job_config(ckpt: Path) -> Path:
    """``<run_dir>/config.yaml`` for ``<run_dir>/checkpoints/step-N``; CheckpointError if absent."""
    path = RunLayout(ckpt.resolve().parent.parent).config
    if not path.is_file():
        raise CheckpointError(f"{path}: run config not found; pass --config with the job's config.yaml")
    return path


def load_weights(ckpt: Path, model: nn.Module, trainable_only: bool = False) -> None:
    """The checkpoint's weights copied into ``model`` (on CPU, unwrapped) in place; only the
    parameters that require grad when the run checkpointed only those (``trainable_only``).
    CheckpointError "<ckpt>: does not fit the run's model (...)" on a missing name or a shape."""
    if trainable_only:
        state = {name: p.data for name, p in model.named_parameters() if p.requires_grad}
    else:
        state = model.state_dict()  # tensors share storage with the model's: loaded in place
    misfit = "does not fit the run's model"
    if is_deepspeed_checkpoint(ckpt):
        load_consolidated_into(ckpt, state, misfit, trainable_only=trainable_only)
    else:
        load_state_safely(ckpt, {"model": state}, misfit)
