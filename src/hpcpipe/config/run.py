"""The ``run:`` section: the run's name, where its directory lives, the seed and the recipe."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from hpcpipe.config.section import Section, one_line


class RunConfig(Section):
    """The run: its name and directory, the seed, and the recipe that defines the workload."""

    name: str = Field("run", min_length=1, description="Run name; the run directory is <out_dir>/<name>.")
    out_dir: str = Field("runs", min_length=1, description="Parent directory of run directories.")
    seed: int = Field(0, ge=0, le=2**62, description="Seed for model init, data order and dropout.")
    recipe: str = Field(
        "gpt",
        min_length=1,
        description="Workload recipe: a name registered in the entry-point group hpcpipe.recipes "
        "(hpcpipe's built-ins and those of installed packages: `hpcpipe recipes list`) or an import "
        "path package.module:Class. Its own settings go in the recipe: section "
        "(`hpcpipe recipes show NAME`).",
    )

    _one_line = field_validator("name", "out_dir", "recipe")(one_line)

    @field_validator("recipe")
    @classmethod
    def _recipe_resolves(cls, ref: str) -> str:
        from hpcpipe.recipes.registry import recipe_class

        recipe_class(ref)  # ConfigError naming run.recipe: unknown, not importable, not a recipe
        return ref

    @model_validator(mode="after")
    def _name_is_a_plain_directory_name(self) -> RunConfig:
        # The name becomes a directory under out_dir: it must not climb out of it.
        if "/" in self.name or "\\" in self.name or self.name in {".", ".."}:
            raise ValueError(f"run.name must be a plain directory name, got {self.name!r}")
        if len(self.name.encode()) > 200:  # a file name holds 255 bytes; sweeps and trials add to it
            raise ValueError(
                f"run.name is {len(self.name.encode())} bytes long; at most 200 (a sweep or an HPO study "
                "names its runs run.name plus each point's values or trial number: shorten run.name)"
            )
        return self
