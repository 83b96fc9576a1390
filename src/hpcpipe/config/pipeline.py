"""The ``pipeline:`` config section: what `hpcpipe run` does after training (export, register,
report). Its own module so the steps downstream of training can be fingerprinted apart from it."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from hpcpipe.config.section import Section

# MLflow's rules for a registered model's alias (mlflow.utils.validation): checked before a
# version is created, so a refused alias does not leave a version behind on every retry.
_ALIAS = re.compile(r"^[\w\-]{1,255}$")
_VERSION_ALIAS = re.compile(r"^[vV]\d+$")


def alias_problem(alias: str) -> str | None:
    """Why MLflow would refuse ``alias`` (None when it takes it)."""
    if not _ALIAS.match(alias):
        return f"alias {alias!r}: only letters, digits, _ and - (1 to 255 of them)"
    if alias.lower() == "latest" or _VERSION_ALIAS.match(alias):
        return f"alias {alias!r} is reserved by MLflow (latest, v<number>)"
    return None


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

    @field_validator("aliases")
    @classmethod
    def _mlflow_takes_them(cls, aliases: list[str]) -> list[str]:
        for alias in aliases:
            problem = alias_problem(alias)
            if problem:
                raise ValueError(problem)
        return aliases

    report: bool = Field(True, description="Write report.md and report.html under <run_dir>/report.")
