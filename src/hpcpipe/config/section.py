"""The base of every config section (its own module so section modules can share it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every config section: typed, frozen, unknown keys rejected."""

    # allow_inf_nan=False: an infinite learning rate or timeout is never meant (nan fails the bounds
    # already, inf passed them and trained to NaN weights).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


def one_line(value: str | None) -> str | None:
    """A field validator's check for values that end up in scripts and manifests (an #SBATCH
    line, a job name, a path in a shell script): a newline there would start a new line."""
    if value is not None and not value.isprintable():
        raise ValueError("must not contain newlines or other control characters")
    return value
