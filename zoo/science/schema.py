"""The strict pydantic base every declarative config of the zoo derives from (task specs in the
registry, each family's arch schema in its model file, train recipes, sweeps). It imports
nothing of the zoo, so every layer can declare its config with it."""

from __future__ import annotations

from typing import get_args

from pydantic import BaseModel, ConfigDict, model_validator


class Strict(BaseModel):
    # No inf/NaN anywhere (`lr = inf` is a typo, not a recipe); unknown fields are errors.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data):
        """TOML `hidden = true` would otherwise become 1."""
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key)
                if field is not None and isinstance(value, bool) and field.annotation is not bool \
                        and bool not in get_args(field.annotation):
                    raise ValueError(f"field '{key}': {value!r} is a boolean, not a number")
        return data
