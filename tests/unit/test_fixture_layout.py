"""Where fixtures live: in the `conftest.py` of their layer, each under a name of its own.

A fixture defined in a test file is invisible to the next file that needs it, so it gets
copied; two fixtures of one name shadow each other by directory, so a test's meaning
depends on where it sits. Both are refused here: no `@pytest.fixture` in a `test_*.py`
file, no fixture name defined twice anywhere under tests/, and no test file importing
another (what tests share lives in a conftest or in tests/support/). Read with ast, so
nothing here imports the files it checks.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _sources() -> dict[str, str]:
    return {
        str(p.relative_to(TESTS.parent)): p.read_text(encoding="utf-8")
        for p in sorted(TESTS.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def _is_fixture(decorator: ast.expr) -> bool:
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(node, ast.Attribute):
        return node.attr == "fixture"
    return isinstance(node, ast.Name) and node.id == "fixture"


def _fixture_name(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The name a fixture is requested by (its `name=` if it has one), or None for a plain function."""
    for decorator in function.decorator_list:
        if not _is_fixture(decorator):
            continue
        if isinstance(decorator, ast.Call):
            for keyword in decorator.keywords:
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
        return function.name
    return None


def fixtures(sources: dict[str, str]) -> dict[str, list[str]]:
    """Every fixture name, with the `path:line` of each definition."""
    found: dict[str, list[str]] = defaultdict(list)
    for path, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = _fixture_name(node)
                if name is not None:
                    found[name].append(f"{path}:{node.lineno}")
    return dict(found)


def _is_test_file(path: str) -> bool:
    return Path(path).name.startswith("test_")


def fixtures_in_test_files(sources: dict[str, str]) -> list[str]:
    return sorted(
        f"{name} ({where})"
        for name, places in fixtures(sources).items()
        for where in places
        if _is_test_file(where.rsplit(":", 1)[0])
    )


def names_defined_twice(sources: dict[str, str]) -> dict[str, list[str]]:
    return {name: places for name, places in fixtures(sources).items() if len(places) > 1}


def cross_test_imports(sources: dict[str, str]) -> list[str]:
    found = []
    for path, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            modules: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            found.extend(
                f"{path} imports {m}"
                for m in modules
                if m.startswith("tests.") and _is_test_file(m.split(".")[-1])
            )
    return sorted(found)


def test_there_are_fixtures_to_check() -> None:
    found = fixtures(_sources())
    assert "dq_env" in found and "no_subprocess" in found


def test_no_fixture_is_defined_in_a_test_file() -> None:
    assert fixtures_in_test_files(_sources()) == []


def test_no_fixture_name_is_defined_twice() -> None:
    assert names_defined_twice(_sources()) == {}


def test_no_test_file_imports_another() -> None:
    assert cross_test_imports(_sources()) == []


def test_the_checks_find_what_they_refuse() -> None:
    sources = {
        "tests/unit/conftest.py": "import pytest\n@pytest.fixture\ndef store(): ...\n",
        "tests/ha/conftest.py": "from pytest import fixture\n@fixture(scope='module')\ndef store(): ...\n",
        "tests/unit/test_a.py": (
            "import pytest\n"
            "from tests.unit.test_b import helper\n"
            "@pytest.fixture(name='renamed')\ndef _hidden(): ...\n"
            "def test_x(): ...\n"
        ),
        "tests/support/b.py": "import tests.support.gate\n",
    }
    assert fixtures_in_test_files(sources) == ["renamed (tests/unit/test_a.py:4)"]
    assert names_defined_twice(sources) == {"store": ["tests/unit/conftest.py:3", "tests/ha/conftest.py:3"]}
    assert cross_test_imports(sources) == ["tests/unit/test_a.py imports tests.unit.test_b"]
