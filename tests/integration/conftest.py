"""The integration layer's shared fixtures: the decision gate's world, made once here.

Every gate test file (tests/integration/test_gate*.py) asks for `world`: a git repository
with a findings report, the fake `claude` scripted per role, and the real CLI. What differs
between files is only the report the world starts with and, for one file, an extra setting;
a file says so by overriding the small `world_report` / `world_env` fixtures, never by
copying the world.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.gate import World, make_world


@pytest.fixture
def world_report() -> str:
    """The findings the report starts with (after its `# Review` heading): none by default,
    for tests that write their own report."""
    return ""


@pytest.fixture
def world_env() -> dict[str, str]:
    """Settings laid over the world's environment (the CLI's and the sessions')."""
    return {}


@pytest.fixture
def world(
    tmp_path: Path, dq_env: dict[str, str], redis_client: Any, world_report: str, world_env: dict[str, str]
) -> World:
    made = make_world(tmp_path, dq_env, redis_client, world_report)
    made.env.update(world_env)
    return made
