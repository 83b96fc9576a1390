"""The ``pipeline:`` config section: what `hpcpipe run` does after training (export, register,
report). Its own module so the steps downstream of training can be fingerprinted apart from it."""

from __future__ import annotations

from pydantic import Field

from hpcpipe.config.section import Section


class PipelineConfig(Section):
    """The `hpcpipe pipeline` steps after training: export, evaluation, registration and the report."""

    export_format: str = Field(
        "auto",
        min_length=1,
        description="Format of the export step: auto (the first of the recipe's export formats: hf "
        "for gpt, adapter for LoRA; the step is skipped for a recipe with none), or one of them "
        "(`hpcpipe recipes show NAME`, `hpcpipe ckpt export --format`).",
    )
    register_as: str | None = Field(
        None,
        min_length=1,
        description="Registered model name: the register step adds a version to the MLflow "
        "model registry (needs observe.mlflow). Null: the step is skipped.",
    )
    aliases: list[str] = Field(
        default_factory=list, description="Aliases the new version takes (e.g. [candidate])."
    )
    report: bool = Field(True, description="Write report.md and report.html under <run_dir>/report.")
