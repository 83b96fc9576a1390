"""The ``run:`` section: the run's name, where its directory lives, the seed and the recipe."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from hpcpipe.config.section import Section, one_line
from hpcpipe.recipes.catalog import RECIPES, RecipeName


class RunConfig(Section):
    name: str = Field("run", min_length=1, description="Run name; the run directory is <out_dir>/<name>.")
    out_dir: str = Field("runs", description="Parent directory of run directories.")
    seed: int = Field(0, ge=0, description="Seed for model init, data order and dropout.")
    recipe: RecipeName = Field(
        "gpt",
        description="Workload recipe (registry name): "
        + "; ".join(f"{spec.name} ({spec.summary})" for spec in RECIPES.values())
        + ".",
    )

    _one_line = field_validator("name", "out_dir")(one_line)

    @model_validator(mode="after")
    def _name_is_a_plain_directory_name(self) -> RunConfig:
        # The name becomes a directory under out_dir: it must not climb out of it.
        if "/" in self.name or "\\" in self.name or self.name in {".", ".."}:
            raise ValueError(f"run.name must be a plain directory name, got {self.name!r}")
        return self
