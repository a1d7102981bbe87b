"""The layout is the architecture: rooms, a facade, no import circle.

These read the source (ast) and the import graph (grimp, import-linter's own graph
builder); they import nothing of dispatchq except the facade, so they stay unit tests.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

import dispatchq

PACKAGE = Path(dispatchq.__file__).resolve().parent
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
MAX_LINES = 800


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_public_facade_is_pinned() -> None:
    assert dispatchq.__all__ == [
        "Client",
        "DispatchqError",
        "Enqueued",
        "Judgement",
        "JudgementIn",
        "Record",
        "Settings",
        "TrailEntry",
        "UserError",
        "load_settings",
    ]
    for name in dispatchq.__all__:
        assert getattr(dispatchq, name) is not None


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: every component of more than one module is an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# Every package of the checkout: the library, its RQ entry points, the benchmarks and the tests.
PACKAGES = ("dispatchq", "jobs", "bench", "tests")


def _module_edges(packages: tuple[str, ...] = ("dispatchq",)) -> dict[str, set[str]]:
    """Every module's direct imports within `packages`, TYPE_CHECKING imports included:
    an annotation that names a module above is a circle all the same."""
    graph = grimp.build_graph(*packages, exclude_type_checking_imports=False)

    def inside(module: str) -> bool:
        return module.split(".")[0] in packages

    edges = {
        module: {m for m in graph.find_modules_directly_imported_by(module) if inside(m)}
        for module in graph.modules
        if inside(module)
    }
    # A package's __init__ importing its own modules is not a circle worth a name.
    for module, targets in edges.items():
        targets.discard(module)
    return edges


def _room(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_the_import_graph_has_no_circle() -> None:
    """No circle anywhere in the checkout: dispatchq, jobs/, bench/ and tests/."""
    edges = _module_edges(PACKAGES)
    assert {module.split(".")[0] for module in edges} == set(PACKAGES)
    assert _strongly_connected(edges) == []


def test_the_rooms_form_no_circle() -> None:
    """Rooms (`dispatchq.<room>`) import one another in one direction only, at any depth."""
    rooms: dict[str, set[str]] = {}
    for module, targets in _module_edges().items():
        rooms.setdefault(_room(module), set()).update(_room(t) for t in targets if _room(t) != _room(module))
    assert _strongly_connected(rooms) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_every_module_declares_all_and_stays_readable(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    assert len(source.splitlines()) <= MAX_LINES, f"{_name(path)} is over {MAX_LINES} lines: split it"
    if path.name == "__main__.py":
        return
    declared = any(
        isinstance(target, ast.Name) and target.id == "__all__"
        for node in tree.body
        for target in (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
    )
    assert declared, f"{_name(path)} declares no __all__"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_private_name_is_imported_from_another_module(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    private = [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dispatchq")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert private == []


def _unexplained_complexity(source: str) -> list[str]:
    """Functions whose `def` line says `# noqa: C901` without a docstring saying why it is one piece."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        header = " ".join(lines[node.lineno - 1 : node.body[0].lineno - 1])
        if "noqa: C901" not in header:
            continue
        doc = ast.get_docstring(node) or ""
        if "one piece" not in doc:
            found.append(f"{node.name} (line {node.lineno})")
    return found


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_every_complexity_exception_says_why_it_is_one_piece(path: Path) -> None:
    """ruff's C901 caps complexity at 15; a function past it must explain itself."""
    assert _unexplained_complexity(path.read_text(encoding="utf-8")) == []


def test_the_complexity_check_finds_an_unexplained_exception() -> None:
    source = (
        "def a(x):  # noqa: C901\n    return x\n\n"
        'def b(x):  # noqa: C901\n    """Kept as one piece: the steps share one lock."""\n    return x\n'
    )
    assert _unexplained_complexity(source) == ["a (line 1)"]


def test_complexity_is_capped_at_15() -> None:
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    lint = config["tool"]["ruff"]["lint"]
    assert "C901" in lint["select"]
    assert lint["mccabe"]["max-complexity"] == 15
