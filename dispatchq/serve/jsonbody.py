"""Reading a JSON body within bounds: the one reader every route of `dispatchq serve` uses.

Python's own parser turns some inputs into exceptions no route expects, each of which would
be a 500 with a traceback:

- a body nested past the interpreter's recursion limit raises `RecursionError`;
- an integer of more than 4,300 digits raises a `ValueError` of its own, not a decode error;
- `\\ud800` (a lone surrogate escape) parses into text that cannot be written back as UTF-8;
- `NaN`, `Infinity` and `1e400` parse into floats JSON has no spelling for.

Here each is a `BadJSON` that says what was wrong and, where there is one, names the field:

- the nesting is measured on the raw bytes before anything is parsed (`nests_deeper`), so the
  parser never recurses past `PARSE_DEPTH`;
- the parser's hooks keep an over-long integer or a number JSON cannot spell as a marker, and
  `trouble` walks the value afterwards to name where it is (and checks the route's own depth,
  the integer range its store can write, and every text for lone surrogates);
- the bytes must be UTF-8 (the offset of the first bad byte is said).

`read_json` does all of it; `parse` and `trouble` are its halves, for a route that checks
parts of a body on their own (`POST /judgements` answers each line apart).
"""

from __future__ import annotations

import json
import math
from itertools import accumulate
from typing import Any

__all__ = [
    "MAX_DIGITS",
    "PARSE_DEPTH",
    "BadJSON",
    "nests_deeper",
    "parse",
    "read_json",
    "trouble",
]

#: How deep the parser is ever let recurse: far below Python's limit (1,000 frames, some of
#: them the server's own), far above any body a route takes (GitHub's payloads nest ~6 deep).
PARSE_DEPTH = 256
#: The longest integer read, in digits: past 64 bits (20 digits) no route or store can use one,
#: and Python refuses past 4,300 with an exception of its own.
MAX_DIGITS = 64

_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'"[]{}')))
_AS_PARENS = bytes.maketrans(b"[]{}", b"()()")
# Past this many brackets, the depth is summed in one walk rather than peeled a level a pass.
_MANY = 4096
_STEP = tuple(1 if byte == ord("(") else -1 for byte in range(256))


class BadJSON(ValueError):
    """A body (or a part of one) that cannot be read as the JSON a route takes: `status` is the
    HTTP answer (400: not JSON at all; 422: JSON, but past a bound), the message names it."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def nests_deeper(raw: bytes, limit: int) -> bool:
    """Whether the JSON text `raw` nests arrays and objects more than `limit` deep, on its bytes.

    All in C: the escapes go (an escaped backslash first, so `\\\\"` still ends its string),
    then everything but quotes and brackets. Counting the opening brackets left is enough for
    most bodies (fewer than `limit` cannot nest past it). Otherwise what lies between quotes
    goes too (the brackets inside text), and the innermost pairs are removed one level a pass,
    at most `limit` passes. What a malformed body leaves unclosed counts as nesting (the parser
    would recurse into it before it finds the end).
    """
    if b"\\" in raw:
        if b"\\\\" in raw:
            raw = raw.replace(b"\\\\", b"")
        if b'\\"' in raw:
            raw = raw.replace(b'\\"', b"")
    structure = raw.translate(None, _NOT_STRUCTURE).replace(b'""', b"")  # most text holds no bracket
    if structure.count(b"[") + structure.count(b"{") <= limit:
        return False
    if b'"' in structure:
        structure = b"".join(structure.split(b'"')[::2])
    brackets = structure.translate(_AS_PARENS)
    if len(brackets) > _MANY:  # each pass would copy it: one walk of the running depth instead
        return max(accumulate(map(_STEP.__getitem__, brackets))) > limit
    passes = 0
    while b"()" in brackets:
        passes += 1
        if passes > limit:
            return True
        brackets = brackets.replace(b"()", b"")
    return passes + brackets.count(b"(") > limit


class _Number:
    """A number the parser met that no route can take: kept, so `trouble` can say where it is."""

    def __init__(self, text: str, why: str) -> None:
        self.text = text
        self.why = why


def _int(text: str) -> int | _Number:
    digits = len(text) - text.startswith("-")
    if digits > MAX_DIGITS:
        return _Number(text, f"an integer of {digits} digits")
    return int(text)


def _float(text: str) -> float | _Number:
    value = float(text)
    if math.isfinite(value):
        return value
    return _Number(text, f"a number too large for a float ({text[:20]}{'...' if len(text) > 20 else ''})")


def _constant(text: str) -> _Number:
    return _Number(text, f"{text} (JSON has no such number)")


def parse(raw: bytes, *, what: str = "the body", depth: int = PARSE_DEPTH) -> Any:
    """`raw` parsed, or BadJSON: not UTF-8, nested past `depth`, or not JSON.

    The value may still hold what `trouble` names (an over-long integer, NaN, a lone surrogate).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        raise BadJSON(f"{what} is not UTF-8 text (bad byte at offset {bad.start})") from None
    if nests_deeper(raw, depth):
        raise BadJSON(f"{what} nests more than {depth} deep", 422)
    try:
        return json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except json.JSONDecodeError as bad:
        raise BadJSON(f"{what} is not JSON ({bad.msg} at line {bad.lineno} column {bad.colno})") from None
    except RecursionError:  # cannot happen below PARSE_DEPTH; said the same way if it ever does
        raise BadJSON(f"{what} nests too deep to read", 422) from None


def _step(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    name = str(key)
    shown = name if name.isidentifier() else json.dumps(name)[:40]
    return f"{path}.{shown}" if path else shown


def _where(path: str) -> str:
    if not path:
        return ""
    return f" at {path[:80]}{'...' if len(path) > 80 else ''}"


def _text_trouble(text: str) -> str | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "holds text that is not Unicode (a lone surrogate escape)"
    return None


def trouble(
    value: Any,
    *,
    depth: int = PARSE_DEPTH,
    integers: tuple[int, int] | None = None,
    integers_are: str = "",
    path: str = "",
) -> str | None:
    """What in a parsed `value` no route can take, with where it is; None when nothing is.

    Nested past `depth`, a number `parse` kept as a marker, an integer outside `integers`
    (said as `integers_are`, e.g. "past 64 bits"), a key or text with a lone surrogate.
    Iterative: the walk itself cannot run out of stack, whatever it is given.
    """
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, level = stack.pop()
        kind = type(item)
        if kind is str:
            found = _text_trouble(item)
        elif kind is int:
            found = None
            if integers is not None and not integers[0] <= item <= integers[1]:
                found = f"holds an integer {integers_are}"
        elif kind is _Number:
            found = f"holds {item.why}"
        elif kind is dict or kind is list:
            if level >= depth:
                return f"nests more than {depth} deep{_where(where)}"
            pairs = item.items() if kind is dict else enumerate(item)
            children = []
            for key, child in pairs:
                if type(key) is str and (bad := _text_trouble(key)) is not None:
                    return f"{bad}{_where(_step(where, '?'))}"
                children.append((child, _step(where, key), level + 1))
            stack.extend(reversed(children))  # depth first, in order: the first trouble is named
            continue
        else:
            continue
        if found is not None:
            return f"{found}{_where(where)}"
    return None


def read_json(raw: bytes, *, what: str = "the body", depth: int = PARSE_DEPTH) -> Any:
    """`raw` parsed and checked (see the module), or BadJSON naming what and where."""
    value = parse(raw, what=what)
    found = trouble(value, depth=min(depth, PARSE_DEPTH))
    if found is not None:
        raise BadJSON(f"{what} {found}", 422)
    return value
