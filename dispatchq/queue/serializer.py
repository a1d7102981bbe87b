"""The one serializer of dispatchq's RQ jobs: strict JSON, never pickle.

RQ pickles a job's data (function name, arguments), its `meta` and its results by default,
and unpickling is running code: whoever can write into Redis (a session that found the
store, another local user) once had a code or typed worker run `os.system` just by pushing
a job. Every dispatchq job carries plain data (judgement ids, a delivery id list, an event
that came in as JSON), so JSON loses nothing, and reading JSON runs nothing.

Strict on both sides: `NaN` and the infinities are neither written nor read (they are not
JSON, and a reader in another language would choke on them), and what is read must be UTF-8.
The bytes are plain JSON all the same, so RQ's own `rq.serializers.JSONSerializer` reads
them: `rq info --serializer rq.serializers.JSONSerializer` and rq-dashboard work as before.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["SERIALIZER_PATH", "JSONSerializer", "is_plain"]

#: The dotted path an operator gives RQ's tools (`--serializer`); RQ's own class reads the same bytes.
SERIALIZER_PATH = "dispatchq.queue.serializer.JSONSerializer"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class JSONSerializer:
    """RQ's `Serializer` protocol: `dumps` to UTF-8 JSON bytes, `loads` back; nothing else."""

    @staticmethod
    def dumps(obj: Any, /) -> bytes:
        return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode("utf-8")

    @staticmethod
    def loads(data: bytes, /) -> Any:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else str(data)
        return json.loads(text, parse_constant=_no_constant)


def is_plain(value: object) -> bool:
    """True when `value` survives JSON unchanged but for tuples becoming lists.

    `json.dumps` would quietly turn an int key into a string, or refuse bytes only when it
    meets them: what the upgrade rewrites must come back as the job wrote it.
    """
    if value is None or isinstance(value, bool | int | str):
        return True
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, list | tuple):
        return all(is_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False
