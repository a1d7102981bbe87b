"""How a mistake in the config file reads: one line, starting with the full dotted path.

`problems_of` turns pydantic's `ValidationError` into those lines
(`kinds.pr-risk.session.prompt: field required`, `kinds.k.verify[0]: ...`); the wording
of a type mistake is the field's own `description` where it has one ("must be a list of
variable names or globs"), and an unknown key lists the keys allowed there. A validator
that finds a mistake itself raises `problem(message, *at)`, `at` the keys below the
validated object where the mistake sits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from dispatchq.core.fields import PROBLEM, field_at, problem, untagged

__all__ = ["PROBLEM", "WHOLE", "problem", "problems_of"]

#: Set on a problem whose message already starts with its full path (the rules engine's).
WHOLE = "whole"


_TYPE_WORDS = {
    "string_type": "text",
    "int_type": "a whole number",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


#: Mistakes a field's `description` words better than pydantic does (it says what fits).
_BOUNDS = (
    "too_short",
    "too_long",
    "string_pattern_mismatch",
    "string_too_short",
    "greater_than",
    "greater_than_equal",
    "finite_number",
)


def _where(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(root: type[BaseModel], error: Mapping[str, Any], loc: tuple[str | int, ...]) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == PROBLEM:
        return str(ctx["message"])
    if kind == "missing":
        return "field required"
    if kind == "extra_forbidden":
        owner, _ = field_at(root, loc[:-1])
        allowed = sorted(f.alias or n for n, f in owner.model_fields.items()) if owner else []
        top = "top-level " if len(loc) == 1 else ""
        return f"unknown {top}key (allowed: {', '.join(allowed)})" if allowed else f"unknown {top}key"
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace("'", "")
        return f"must be {expected} (got {value!r})"
    if kind == "union_tag_invalid":
        *tags, last = (tag.strip(" '") for tag in str(ctx["expected_tags"]).split(","))
        return f"must be {', '.join(tags)} or {last} (got {ctx['tag']!r})"
    if kind == "union_tag_not_found":
        return "field required"
    _, field = field_at(root, loc)
    described = field is not None and field.description
    if kind in _TYPE_WORDS or kind in _BOUNDS:
        if described and field is not None:
            return f"must be {field.description} (got {value!r})"
        if kind in _TYPE_WORDS:
            return f"must be {_TYPE_WORDS[kind]} (got {value!r})"
    text = str(error.get("msg", "invalid"))
    return text[:1].lower() + text[1:] + f" (got {value!r})"


def problems_of(error: ValidationError, root: type[BaseModel]) -> list[str]:
    """One line per mistake, each starting with the full path of what is wrong; `root` is
    the model validated (its fields word the mistakes)."""
    lines: list[str] = []
    for item in error.errors():
        loc = tuple(item["loc"])
        ctx = item.get("ctx") or {}
        if item["type"] in ("union_tag_invalid", "union_tag_not_found"):
            loc = (*loc, str(ctx["discriminator"]).strip("'"))
        if item["type"] == PROBLEM and ctx.get(WHOLE):
            line = str(ctx["message"])
        else:
            full = (*loc, *ctx.get("at", ())) if item["type"] == PROBLEM else loc
            where = _where(untagged(root, full)) or "config"
            line = f"{where}: {_message(root, item, loc)}"
        if line not in lines:
            lines.append(line)
    return lines
