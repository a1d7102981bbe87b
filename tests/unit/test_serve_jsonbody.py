"""The bounded JSON reader every `dispatchq serve` route uses: depth measured on the bytes
(brackets inside text and escapes not counted), then what Python's parser would turn into an
unexpected exception named as a refusal with the field it is in."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatchq.serve.jsonbody import PARSE_DEPTH, BadJSON, nests_deeper, read_json, trouble


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


TRICKY = [
    b"[]",
    b'{"a": "[[[[[[[[[[[["}',
    b'{"a": "\\\\", "b": [[[1]]]}',  # an escaped backslash ends no string early
    b'{"a": "\\"[[[[[[[[", "b": [[[1]]]}',  # an escaped quote keeps the text open
    b'{"a": "\\\\\\"[[[[[[[[[", "b": [[1]]}',
    b'[{"x": [{"y": [{"z": []}]}]}, [[], [[], [[]]]]]',
    b'{"u": "{/other_user}", "v": [{"w": "[x]"}]}',
]


@pytest.mark.parametrize("body", TRICKY)
def test_the_measured_depth_is_the_parsers(body: bytes) -> None:
    depth = _depth(json.loads(body))
    for limit in range(max(depth - 2, 0), depth + 2):
        assert nests_deeper(body, limit) is (depth > limit), (limit, depth)


def test_long_bodies_and_unclosed_ones_are_measured_too() -> None:
    wave = b"[" * 9 + b"]" * 9
    assert not nests_deeper(wave * 2000, 9)  # 36,000 brackets: the one-walk path
    assert nests_deeper(wave * 2000 + b"[" * 10 + b"]" * 10, 9)
    assert nests_deeper(b"[" * 5000, 64)  # never closed: the parser recurses into it anyway
    assert nests_deeper(b'[1, "x", ' * 70, 64)


def test_a_body_past_the_parse_depth_is_refused_before_parsing() -> None:
    with pytest.raises(BadJSON, match=f"nests more than {PARSE_DEPTH} deep") as refused:
        read_json(b"[" * 6000 + b"]" * 6000)
    assert refused.value.status == 422


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"until": ' + b"7" * 5000 + b"}", "the body holds an integer of 5000 digits at until"),
        (b'{"a": {"b c": [NaN]}}', 'the body holds NaN (JSON has no such number) at a."b c"[0]'),
        (b'{"a": [1e400]}', "the body holds a number too large for a float (1e400) at a[0]"),
        (
            b'{"reason": "\\ud800"}',
            "the body holds text that is not Unicode (a lone surrogate escape) at reason",
        ),
        (b'{"a": [[[[1]]]]}', "the body nests more than 3 deep at a[0][0]"),
    ],
)
def test_what_the_parser_would_choke_on_is_named_with_its_field(body: bytes, said: str) -> None:
    with pytest.raises(BadJSON) as refused:
        read_json(body, depth=3)
    assert str(refused.value) == said and refused.value.status == 422


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"a": "\xff"}', "the body is not UTF-8 text (bad byte at offset 7)"),
        (b'{"a": "x\x00"}', "the body is not JSON (Invalid control character at"),
        (b"", "the body is not JSON (Expecting value"),
    ],
)
def test_what_is_not_json_at_all_is_400(body: bytes, said: str) -> None:
    with pytest.raises(BadJSON) as refused:
        read_json(body)
    assert str(refused.value).startswith(said) and refused.value.status == 400


def test_an_integer_range_is_said_in_the_callers_words() -> None:
    value = json.loads('{"state": {"n": [18446744073709551616]}}')
    found = trouble(value, integers=(0, 2**64 - 1), integers_are="past 64 bits")
    assert found == "holds an integer past 64 bits at state.n[0]"
    assert trouble({"state": {"n": [2**64 - 1], "t": "\U0001f600"}}, integers=(0, 2**64 - 1)) is None
