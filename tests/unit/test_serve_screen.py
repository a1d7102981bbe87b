"""`POST /judgements`' screen passes each line it validated on as the judgement itself, equal to
what `enqueue -` reads from the same text (so both ways in make the same content key), and every
other line as its bytes, for `enqueue_lines` to refuse in `enqueue -`'s words."""

from __future__ import annotations

import pytest

from dispatchq.core.judgement import JudgementIn, content_key
from dispatchq.serve.judgements import lines_of
from dispatchq.settings import load_settings

GOOD = [
    '{"kind": "k", "target": "acme/app#1", "priority": "urgent",'
    ' "state": {"n": 1.5, "big": 9007199254740993, "t": "caf\\u00e9 \\ud83d\\ude00", "deep": [{"a": []}]}}',
    '{"kind": "k", "target": "t", "item": "comment:9", "context": {"x": null}, "key": "mine"}',
]
BAD = '{"kind": "k"}'  # no target: refused by `enqueue_lines`, not by the screen


@pytest.mark.parametrize("media", ["application/x-ndjson", "application/json"])
def test_a_validated_line_is_passed_on_as_the_judgement_enqueue_dash_reads(media: str) -> None:
    lines = [GOOD[0], BAD, GOOD[1]]
    body = "\n".join(lines) if media == "application/x-ndjson" else "[" + ",".join(lines) + "]"
    screened = lines_of(body.encode(), media, load_settings({}))
    assert screened.refused == []
    first, bad, second = screened.lines
    assert isinstance(bad, bytes)
    expected = [JudgementIn.model_validate_json(line) for line in GOOD]
    assert [first, second] == expected
    assert [content_key(j, "kind-digest") for j in (first, second)] == [  # type: ignore[arg-type]
        content_key(j, "kind-digest") for j in expected
    ]
