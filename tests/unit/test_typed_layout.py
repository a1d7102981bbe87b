"""The typed tier's one door to the SDK: exactly one module of dispatchq imports it.

Everything else talks to a `Provider` (`dispatchq.tiers.typed.protocol`) and reads the
outcomes of `batching`, so the SDK (and its HTTP client) can be upgraded, faked or
replaced in one file. These read the source and the import graph; they import nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

import dispatchq

PACKAGE = Path(dispatchq.__file__).resolve().parent
SDK = ("typesafe_sdk", "httpx2")
THE_DOOR = "dispatchq.tiers.typed.provider"
#: The loopback TypeSafe stand-in validates requests against the SDK's own request model:
#: a test double that speaks the wire format, not a second door of the product.
STAND_IN = "dispatchq.testing.typesafe"


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_roots(tree: ast.AST) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(tree):  # every import, TYPE_CHECKING and function-local included
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_exactly_one_module_imports_the_sdk() -> None:
    importers = sorted(
        _name(path)
        for path in PACKAGE.rglob("*.py")
        if "__pycache__" not in path.parts
        and _imported_roots(ast.parse(path.read_text(encoding="utf-8"))) & set(SDK)
    )
    assert importers == sorted([THE_DOOR, STAND_IN])


def test_the_finder_sees_every_spelling_of_an_import() -> None:
    source = "import typesafe_sdk.constants\nif X:\n    from httpx2 import Headers\ndef f():\n    import os\n"
    assert _imported_roots(ast.parse(source)) == {"typesafe_sdk", "httpx2", "os"}


def test_the_graph_sees_the_door(graph: grimp.ImportGraph) -> None:
    """The check below is not vacuous: the tier itself does reach the SDK, through the door."""
    chain = graph.find_shortest_chain(importer="dispatchq.tiers.typed.tier", imported="typesafe_sdk")
    assert chain is not None and THE_DOOR in chain


@pytest.mark.parametrize("module", ["dispatchq.tiers.typed.batching", "dispatchq.tiers.typed.protocol"])
def test_talking_to_a_provider_never_loads_the_sdk(graph: grimp.ImportGraph, module: str) -> None:
    """Not even through another module: the pure half reaches no SDK at any depth."""
    for sdk in SDK:
        assert graph.find_shortest_chain(importer=module, imported=sdk) is None
