"""Pieces the config file's pydantic models share: how a validator names a mistake, a text
that must match a pattern, a noul's criteria, where a value JSON cannot spell sits, and
which field an error's location names.

Pure (pydantic only), so both the config room and the rules engine's section model
(`dispatchq.triage.schema`, which sits below the config) declare their fields with them.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

__all__ = ["PROBLEM", "Matching", "NoulCriteria", "field_at", "first_non_json", "problem", "untagged"]

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


def _true_or_false(criteria: dict[str, Any]) -> dict[str, Any]:
    if set(criteria) - {"true", "false"}:
        raise problem("a noul's criteria is a mapping with true and/or false")
    return criteria


#: A noul question's criteria: what its true and/or false outcome mean.
NoulCriteria = Annotated[
    dict[str, Any],
    AfterValidator(_true_or_false),
    WithJsonSchema({"type": "object", "propertyNames": {"enum": ["true", "false"]}}),
]


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
    model, field, _ = _walk(root, loc)
    return model, field


def untagged(root: type[BaseModel], loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """`loc` without the tags pydantic adds inside a discriminated union (`questions.q.noul.x`)."""
    return _walk(root, loc)[2]


def _walk(
    root: type[BaseModel], loc: tuple[str | int, ...]
) -> tuple[type[BaseModel] | None, Any, tuple[str | int, ...]]:
    models: list[type[BaseModel]] = [root]
    field = None
    mapping_key = False  # the next part names an entry of a mapping (a kind, a question id)
    kept: list[str | int] = []
    for index, part in enumerate(loc):
        if isinstance(part, int) or part == "[key]":
            kept.append(part)
            field = None
            continue
        if mapping_key:
            kept.append(part)
            mapping_key, field = False, None
            continue
        tagged = [m for m in models if _tags(m, part)] if len(models) > 1 else []
        if tagged:  # a union's tag: it picks the section, and is no key of the file
            models, field = tagged, None
            continue
        kept.append(part)
        field = next((f for m in models for n, f in m.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return None, None, (*kept, *loc[index + 1 :])
        models = _models_in(field.annotation)
        mapping_key = _has_mapping(field.annotation)
    return (models[0] if len(models) == 1 else None), field, tuple(kept)


def _tags(model: type[BaseModel], part: str) -> bool:
    """True when one of the section's Literal fields (its tag) takes `part`."""
    return any(
        get_origin(f.annotation) is Literal and part in get_args(f.annotation)
        for f in model.model_fields.values()
    )


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The section classes a field holds (directly, or in a list, mapping, union or Optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def _has_mapping(annotation: Any) -> bool:
    return get_origin(annotation) is dict or any(_has_mapping(a) for a in get_args(annotation))
