"""JobConfig: the typed, documented, frozen description of one hpcpipe job.

It composes one section per concern (each in its own module here); components receive their own
section (``TrainConfig``, ``DataConfig``, ...), never the whole tree. Unknown keys are errors.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from hpcpipe.config.checkpoint import CheckpointConfig
from hpcpipe.config.data import DataConfig
from hpcpipe.config.fault import FaultConfig
from hpcpipe.config.hpo import HpoConfig
from hpcpipe.config.launch import LaunchConfig
from hpcpipe.config.lora import LoraConfig
from hpcpipe.config.model import ModelConfig
from hpcpipe.config.observe import ObserveConfig
from hpcpipe.config.parallel import ParallelConfig
from hpcpipe.config.pipeline import PipelineConfig
from hpcpipe.config.run import RunConfig
from hpcpipe.config.section import Section
from hpcpipe.config.train import TrainConfig
from hpcpipe.yamlfile import dump_yaml

# The keys that change what is trained (the losses step by step); observe, checkpoint, fault,
# launch, pipeline and hpo do not. `hpcpipe run` re-trains when they change; chaos trials share
# one reference run per value of them.
TRAINING_KEYS = ("run.recipe", "run.seed", "recipe", "model", "data", "train", "lora", "parallel")
# Keys under TRAINING_KEYS that only decide how long the launcher waits, never what is trained.
WAITING_KEYS = (
    "parallel.timeout_s",
    "parallel.rdzv_last_call_s",
    "parallel.rdzv_keep_alive_s",
    "parallel.rdzv_keep_alive_misses",
)


class JobConfig(Section):
    """The whole job. Saved as ``config.yaml`` in the run directory."""

    run: RunConfig = Field(default_factory=RunConfig)
    recipe: dict[str, Any] = Field(
        default_factory=dict,
        description="The recipe's own settings: their keys, types and defaults are declared by "
        "the class run.recipe names (its Args; `hpcpipe recipes show NAME`). Checked when the job "
        "loads; saved with every default filled in.",
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    observe: ObserveConfig = Field(default_factory=ObserveConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    fault: FaultConfig = Field(default_factory=FaultConfig)
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    hpo: HpoConfig = Field(default_factory=HpoConfig)

    @field_validator("recipe", mode="after")
    @classmethod
    def _recipe_args(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        run = info.data.get("run")
        if run is None:  # run: failed already, and its error is the one to show
            return value
        from hpcpipe.recipes.args import validate_args
        from hpcpipe.recipes.registry import recipe_class

        recipe = recipe_class(run.recipe)
        return validate_args(recipe.Args, value, recipe.name)  # ConfigError naming recipe.<key>

    @model_validator(mode="after")
    def _watchdog_fires_before_collectives_time_out(self) -> JobConfig:
        # A hang should end with the watchdog's stack dump, not a bare collective timeout.
        hang, pg = self.fault.hang_timeout_s, self.parallel.timeout_s
        if hang > 0 and hang >= pg:
            raise ValueError(
                f"fault.hang_timeout_s ({hang:g}) must be smaller than parallel.timeout_s ({pg:g})"
            )
        return self

    @model_validator(mode="after")
    def _deepspeed_fits_the_job(self) -> JobConfig:
        # What DeepSpeed's engine makes impossible is refused here, not discovered mid-run.
        if self.parallel.strategy != "deepspeed":
            return self
        if self.checkpoint.async_save:
            raise ValueError(
                "checkpoint.async is not available with parallel.strategy=deepspeed "
                "(DeepSpeed writes its own shards synchronously); set checkpoint.async=false"
            )
        if self.train.compile:
            raise ValueError(
                "train.compile is not available with parallel.strategy=deepspeed; set train.compile=false"
            )
        self._deepspeed_batch_agrees()
        if self.fault.oom_recovery:
            raise ValueError(
                "fault.oom_recovery cannot work under parallel.strategy=deepspeed: a ZeRO step cannot be "
                "rolled back half-way through its partitioned gradients; set it to null or false"
            )
        return self

    def _deepspeed_batch_agrees(self) -> None:
        """A batch size in the DeepSpeed config that differs from the job's is an error (the
        accumulation steps, which depend on the world size, are checked when the engine starts)."""
        given = self.parallel.deepspeed_config
        if given is None:
            return
        user = given if isinstance(given, dict) else {}  # a path was replaced by its contents
        for key, ours, name in (
            ("train_batch_size", self.train.global_batch_size, "train.global_batch_size"),
            ("train_micro_batch_size_per_gpu", self.train.micro_batch_size, "train.micro_batch_size"),
        ):
            theirs = user.get(key, "auto")
            if theirs not in ("auto", ours):
                raise ValueError(
                    f"parallel.deepspeed_config: {key}={theirs} differs from {name}={ours}; "
                    'make them agree or set it to "auto"'
                )

    @model_validator(mode="after")
    def _pipeline_fits_the_job(self) -> JobConfig:
        if self.parallel.pp > 1 and self.fault.oom_recovery:
            raise ValueError(
                "fault.oom_recovery cannot work under parallel.pp > 1 (the pipeline schedule runs every "
                "micro-batch in one call, nothing to halve between them); set it to null or false"
            )
        if self.parallel.tp > 1 and self.fault.oom_recovery:
            raise ValueError(
                "fault.oom_recovery cannot work under parallel.tp > 1 (a rank out of memory inside a "
                "block leaves its tensor-parallel peers waiting in that block's collective); set it to "
                "null or false"
            )
        if self.parallel.pp > 1 and self.train.precision == "fp16":
            raise ValueError(
                "train.precision=fp16 is not available with parallel.pp > 1 (the pipeline schedule runs "
                "the backward itself, without fp16's loss scaling); use bf16 or fp32"
            )
        return self

    @model_validator(mode="after")
    def _frozen_context_keeps_its_cache(self) -> JobConfig:
        # transformers drops the KV cache under gradient checkpointing, and the cache is what
        # carries the frozen system prompts to the second pass.
        if self.lora.frozen_context and self.model.gradient_checkpointing:
            raise ValueError(
                "lora.frozen_context needs model.gradient_checkpointing=false (the frozen pass keeps "
                "no activations anyway; checkpointing would drop the prompts' KV cache)"
            )
        return self

    @model_validator(mode="after")
    def _recipe_matches_model_and_data(self) -> JobConfig:
        # The recipe declares what fits it (its model_variants, data_formats, needs_model_source).
        from hpcpipe.recipes.registry import recipe_class

        spec = recipe_class(self.run.recipe)
        variants, formats = spec.model_variants, spec.data_formats
        if variants is not None and self.model.variant not in variants:
            raise ValueError(
                f"model.variant {self.model.variant!r} does not fit run.recipe {spec.name!r} "
                f"(use {' or '.join(variants)})"
            )
        if formats is not None and self.data.format not in formats:
            raise ValueError(
                f"data.format {self.data.format!r} does not fit run.recipe {spec.name!r} "
                f"(use {', '.join(formats)})"
            )
        if spec.needs_model_source and not self.model.name_or_path:
            raise ValueError(f"model.name_or_path is required for run.recipe {spec.name!r}")
        fmt = self.pipeline.export_format
        if fmt != "auto" and fmt not in spec.export_formats:
            known = ", ".join(spec.export_formats) or "none: it exports nothing"
            raise ValueError(
                f"pipeline.export_format {fmt!r} does not fit run.recipe {spec.name!r} (auto, or {known})"
            )
        spec.check_job(self)  # what only the recipe knows (its tensor-parallel plan's divisors)
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return dump_yaml(self.to_dict(), sort_keys=False)

    def training_hash(self) -> str:
        """SHA-256 of the TRAINING_KEYS values (less WAITING_KEYS): equal for jobs that train the
        same steps."""
        tree = self.to_dict()
        for key in WAITING_KEYS:
            section, name = key.split(".")
            tree[section].pop(name)
        values = {}
        for key in TRAINING_KEYS:
            node: Any = tree
            for part in key.split("."):
                node = node[part]
            values[key] = node
        canonical = json.dumps(values, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def config_hash(self) -> str:
        """SHA-256 of the canonical JSON form: equal configs hash equal."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()
