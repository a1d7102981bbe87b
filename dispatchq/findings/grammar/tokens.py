"""How tokens from a document become command operands: an allow-list, rejected never escaped.

A finding's text is written by people and by other tools, and the fixer that may edit the
tree can edit it too. A path taken from it reaches git and the execution boundary only as
an argv element after `--`, and only when every character is on the allow-list; anything
else is refused (UnsafeToken), never quoted or escaped into shape. Pure: no file, no
process.
"""

from __future__ import annotations

import re

from dispatchq.errors import UnsafeToken

__all__ = [
    "LINE_SUFFIX",
    "path_tokens",
    "sanitize",
]

# --- rule 9: sanitisation ------------------------------------------------------------------
_ALLOWED = re.compile(r"^[A-Za-z0-9._/+@,-]+$")
LINE_SUFFIX = re.compile(r":\d+(?:-\d+)?$")
_LEAD = "([{<\"'`*_"
_TRAIL = ".,;:!?)]}>\"'`*_"
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,9}$")
_NOT_PATHS = {"e.g", "i.e", "etc", "vs", "cf", "and/or", "either/or", "a/b", "yes/no", "on/off", "n/a"}


def sanitize(token: str) -> str:
    """The path a document-derived token names, if it passes the allow-list.

    The `:<line>` suffix is stripped first; then every character must be one of
    `A–Z a–z 0–9 . _ / - + @ ,` and the path must not start with `-`. A token that fails
    is rejected by name, never repaired: escaping moves the problem into the quoting.
    """
    path = LINE_SUFFIX.sub("", token)
    if not path:
        raise UnsafeToken(f"{token!r}: empty path")
    if path.startswith("-"):
        raise UnsafeToken(f"{token!r}: a leading '-' could be read as an option")
    bad = sorted({ch for ch in path if not _ALLOWED.match(ch)})
    if bad:
        raise UnsafeToken(f"{token!r}: {''.join(bad)!r} outside the allow-list")
    return path


def _strip_punctuation(raw: str) -> str:
    token = raw.lstrip(_LEAD)
    while token and token[-1] in _TRAIL:
        close = token[-1]
        opener = {")": "(", "]": "[", "}": "{", ">": "<"}.get(close)
        if opener and token.count(opener) >= token.count(close):
            break  # `$(id)` keeps its own parenthesis: the token is judged whole
        token = token[:-1]
    return token


def path_tokens(text: str) -> list[str]:
    """Path tokens in prose, recognised by their shape alone (never by the filesystem).

    A whitespace-delimited token holding a `/` or ending in a file extension, with an
    optional `:<line>` or `:<line>-<line>`, surrounding punctuation and backticks
    stripped. The filesystem is not consulted because `absent` must be pinnable.
    """
    out = []
    for raw in text.split():
        token = _strip_punctuation(raw)
        if not token or "://" in token:
            continue
        base = LINE_SUFFIX.sub("", token)
        if base.lower() in _NOT_PATHS or base.lower().rstrip(".") in _NOT_PATHS:
            continue
        if "/" in base or _EXTENSION.search(base):
            out.append(token)
    return out
