"""`status` warns when the server would store every record in the costly encoding."""

from __future__ import annotations

import pytest

from dispatchq.core.status import RECORD_VALUE_LIMIT, RECORD_VALUE_WARN, Status
from dispatchq.workers.warnings import collect_warnings


def _ids(status: Status) -> list[str]:
    return [w.id for w in collect_warnings(status)]


@pytest.mark.parametrize("limit", [64, 128, RECORD_VALUE_WARN - 1])
def test_a_limit_under_a_records_input_is_a_warning_that_names_the_setting(limit: int) -> None:
    status = Status(redis_hash_value_limit=limit)
    (warning,) = [w for w in collect_warnings(status) if w.id == "record_encoding"]
    assert str(limit) in warning.text and "twice the memory" in warning.text
    assert f"hash-max-listpack-value {RECORD_VALUE_LIMIT}" in warning.hint


@pytest.mark.parametrize("limit", [RECORD_VALUE_WARN, RECORD_VALUE_LIMIT, None])
def test_a_limit_a_record_fits_under_or_one_that_could_not_be_read_is_quiet(limit: int | None) -> None:
    assert "record_encoding" not in _ids(Status(redis_hash_value_limit=limit))
