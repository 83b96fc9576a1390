"""The base of every config section (its own module so section modules can share it)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from hpcpipe.annotations import is_number


class Section(BaseModel):
    """Base of every config section: typed, frozen, unknown keys rejected, no true/false for a number."""

    # allow_inf_nan=False: an infinite learning rate or timeout is never meant (nan fails the bounds
    # already, inf passed them and trained to NaN weights).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic reads true as 1 for an int or float key: `train.steps=true` trained one step."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and is_number(field.annotation):
            raise ValueError("expected a number, not true or false")
        return value


def one_line(value: str | None) -> str | None:
    """A field validator's check for values that end up in scripts and manifests (an #SBATCH
    line, a job name, a path in a shell script): a newline there would start a new line."""
    if value is not None and not value.isprintable():
        raise ValueError("must not contain newlines or other control characters")
    return value
