"""Base for every configuration model (gpu-audit configuration, scenario and web-config
files): frozen, unknown keys are errors, and three things YAML lets through are refused.

- A boolean where a number is expected: pydantic reads `interval_seconds: true` as 1.
- A non-finite float (`.inf`, `.nan`): no setting means "forever" by infinity, and a
  non-finite interval or time scale only fails later, on every cycle.
- An empty string where the setting's default is not empty: `host: ""` is a forgotten
  value, never a meaningful one. Settings whose default is "" (a sink's `name`, a
  scenario's `description`) may still be empty.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Annotated, Any, Self, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

_CONTAINERS = (list, tuple, set, frozenset)


def _leaves(annotation: Any) -> list[Any]:
    """The alternatives an annotation accepts, through Annotated and unions."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _leaves(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [leaf for arg in get_args(annotation) for leaf in _leaves(arg)]
    return [annotation]


def _bool_for_number(annotation: Any, value: Any) -> bool:
    """True when value (or an item of it) is a bool where only a number is accepted."""
    leaves = _leaves(annotation)
    if isinstance(value, bool):
        if any(leaf is bool or leaf is Any for leaf in leaves):
            return False
        return any(leaf is int or leaf is float for leaf in leaves)
    if isinstance(value, list | tuple):
        for leaf in leaves:
            if get_origin(leaf) not in _CONTAINERS:
                continue
            args = get_args(leaf)
            for i, item in enumerate(value):
                if len(args) == 1 or (len(args) == 2 and args[1] is Ellipsis):
                    item_type = args[0]
                elif i < len(args):
                    item_type = args[i]
                else:
                    continue
                if _bool_for_number(item_type, item):
                    return True
    return False


def _problem(annotation: Any, default: Any, value: Any) -> str | None:
    if _bool_for_number(annotation, value):
        return "expected a number, not a boolean (true/false)"
    if isinstance(value, str) and value == "" and default != "" and any(
        leaf is str or leaf is Path for leaf in _leaves(annotation)
    ):
        return "must not be empty (leave the key out for the default)"
    return None


def _as_details(errors: list[ErrorDetails]) -> list[InitErrorDetails]:
    # rebuilt as custom errors so that any error type (ours from nested sections too)
    # can be raised again with its message and location unchanged
    return [InitErrorDetails(type=PydanticCustomError(e["type"], "{msg}", {"msg": e["msg"]}),
                             loc=e["loc"], input=e["input"]) for e in errors]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="wrap")
    @classmethod
    def _refuse_yaml_surprises(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        # A wrap validator, not a field one: pydantic forbids before-validators on the
        # discriminator field of a sink, and this way each problem keeps its own key and
        # is reported together with every other problem of the section.
        if not isinstance(data, dict):
            return handler(data)
        ours: list[InitErrorDetails] = []
        kept = dict(data)
        for name, field in cls.model_fields.items():
            key = field.alias or name
            if key not in data:
                continue
            problem = _problem(field.annotation, field.default, data[key])
            if problem is not None:
                ours.append(InitErrorDetails(
                    type=PydanticCustomError("yaml_surprise", problem), loc=(key,),
                    input=data[key]))
                del kept[key]
        if not ours:
            return handler(data)
        try:
            handler(kept)
        except ValidationError as exc:
            ours += _as_details(exc.errors())
        raise ValidationError.from_exception_data(cls.__name__, ours)
