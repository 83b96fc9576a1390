"""The job configuration: one typed, documented, frozen section per concern, composed by JobConfig.

A job is loaded from a shipped preset name (``quickstart``) or a YAML path, then dotted
``--set section.key=value`` overrides are applied, each parsed to its field's type. Unknown keys
are errors. Components receive their own section (``TrainConfig``, ``DataConfig``, ...), never the
whole tree.

Modules: ``section`` (the base), one per section (``run``, ``model``, ``data``, ``train``, ``lora``,
``parallel``, ``checkpoint``, ``fault``, ``observe``, ``launch``, ``pipeline``, ``hpo``), ``job``
(JobConfig and the checks across sections) and ``loading`` (presets, paths, overrides).
"""

from __future__ import annotations

from hpcpipe.config.checkpoint import CheckpointConfig
from hpcpipe.config.data import FUNCTION_CALLING_FORMATS, IMAGE_FORMATS, TOKEN_FORMATS, DataConfig
from hpcpipe.config.fault import FaultConfig
from hpcpipe.config.job import JobConfig
from hpcpipe.config.loading import apply_values, first_error, load_config, validate_config, with_overrides
from hpcpipe.config.lora import LoraConfig
from hpcpipe.config.model import ModelConfig
from hpcpipe.config.parallel import ParallelConfig, check_layout, check_micro_batches
from hpcpipe.config.run import RunConfig
from hpcpipe.config.train import TrainConfig, grad_accum_steps

__all__ = [
    "FUNCTION_CALLING_FORMATS",
    "IMAGE_FORMATS",
    "TOKEN_FORMATS",
    "CheckpointConfig",
    "DataConfig",
    "FaultConfig",
    "JobConfig",
    "LoraConfig",
    "ModelConfig",
    "ParallelConfig",
    "RunConfig",
    "TrainConfig",
    "apply_values",
    "check_layout",
    "check_micro_batches",
    "first_error",
    "grad_accum_steps",
    "load_config",
    "validate_config",
    "with_overrides",
]
