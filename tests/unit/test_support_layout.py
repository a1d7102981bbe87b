"""Where test support lives: tests/support/ for the tests, dispatchq.testing for everyone.

bench/ and ops/ run from a checkout as scripts and stand beside tests/, not on it: a test
double they need ships in `dispatchq.testing`, so that moving or trimming the tests never
breaks a benchmark or the demo. Read with ast, so nothing here imports bench/ or ops/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*(REPO / "bench").glob("*.py"), *(REPO / "ops").glob("*.py")])


def _imported(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_there_are_scripts_to_check() -> None:
    assert any(p.parent.name == "bench" for p in SCRIPTS)
    assert any(p.parent.name == "ops" for p in SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_bench_and_ops_import_nothing_from_tests(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert [m for m in _imported(tree) if m == "tests" or m.startswith("tests.")] == []


def test_the_finder_sees_both_import_forms() -> None:
    tree = ast.parse("import tests.support.gate\nfrom tests.support import gate\nfrom . import x\n")
    assert _imported(tree) == ["tests.support.gate", "tests.support"]

