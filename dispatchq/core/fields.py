"""Pieces the config file's pydantic models share: how a validator names a mistake, a text
that must match a pattern, and where a value JSON cannot spell sits.

Pure (pydantic only), so both the config room and the rules engine's section model
(`dispatchq.triage.schema`, which sits below the config) declare their fields with them.
"""

from __future__ import annotations

import math
import re
from typing import Any, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

__all__ = ["PROBLEM", "Matching", "field_at", "first_non_json", "problem"]

#: The error type of a problem a validator names itself (with where it sits, `at`).
PROBLEM = "dispatchq_config"


def problem(message: str, *at: str | int) -> PydanticCustomError:
    """A mistake a validator found, `at` the keys below the validated object where it sits."""
    return PydanticCustomError(PROBLEM, "{message}", {"message": message, "at": list(at)})


class Matching:
    """A text that must match `regex`, declared as
    `Annotated[str, m.validator, m.schema]`.

    In the schema it is a pattern; a mistake reads "'x' is not {what}". With `got`, a value
    that is not text at all reads "expected {what}, got 3" (the rules engine's wording)
    instead of "3 is not {what}"."""

    def __init__(self, regex: str, what: str, *, got: bool = False) -> None:
        self.compiled, self.what, self.got = re.compile(regex), what, got
        self.schema = WithJsonSchema({"type": "string", "pattern": regex})
        self.validator = BeforeValidator(self.check)

    def check(self, value: Any) -> Any:
        if not isinstance(value, str) and self.got:
            raise problem(f"expected {self.what}, got {value!r}")
        if not isinstance(value, str) or not self.compiled.match(value):
            raise problem(f"{value!r} is not {self.what}")
        return value


def first_non_json(value: Any, at: tuple[str | int, ...] = ()) -> tuple[tuple[str | int, ...], Any] | None:
    """Where the first value JSON cannot spell sits (a YAML date, .nan, .inf), with the value."""
    if isinstance(value, dict):
        for key, item in value.items():
            found = first_non_json(item, (*at, str(key)))
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = first_non_json(item, (*at, index))
            if found is not None:
                return found
        return None
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float) and math.isfinite(value):
        return None
    return at, value


def field_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> tuple[type[BaseModel] | None, Any]:
    """The section `loc` ends in, and the field its last key names (None for an item or key)."""
    model: type[BaseModel] | None = root
    field = None
    mapping_key = False  # the next part names an entry of a mapping (a kind, a question id)
    for part in loc:
        if isinstance(part, int) or part == "[key]":
            field = None
            continue
        if mapping_key:
            mapping_key, field = False, None
            continue
        if model is None:
            return None, None
        field = {f.alias or n: f for n, f in model.model_fields.items()}.get(part)
        if field is None:
            return None, None
        model = _model_in(field.annotation)
        mapping_key = _has_mapping(field.annotation)
    return model, field


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The section class a field holds (directly, or in a list, mapping or Optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _has_mapping(annotation: Any) -> bool:
    return get_origin(annotation) is dict or any(_has_mapping(a) for a in get_args(annotation))
