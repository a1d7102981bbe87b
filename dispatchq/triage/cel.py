"""CEL conditions: a rule's `if`, parsed once, with the names it reads found in its parse tree.

CEL comes from `cel-python` (`celpy`): its parse tree is a plain `lark` tree, so the
identifiers an `if` references can be read off the parsed expression (comprehension
variables excluded) instead of guessed from error messages at run time. Knowing them
at load time is what lets the config refuse an `if` naming no question, and lets the
table tell "the `if` is false" from "an answer it needs is missing".

Pure: no I/O, only the parser and the evaluator.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
import lark
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from dispatchq.core.answers import Answer
from dispatchq.errors import ConditionError

__all__ = ["BINDINGS", "RESERVED_WORDS", "Condition", "bindings"]

# CEL reserved words and the names CEL gives its types: a question called `in` or `int`
# would be unreadable in an expression.
_CEL_WORDS = (
    "true false null in as break const continue else for function if import let loop package "
    "namespace return var void while bool bytes double duration int list map null_type string "
    "timestamp uint dyn type has"
)
RESERVED_WORDS = frozenset(_CEL_WORDS.split())
#: The names an `if` may read besides question ids.
BINDINGS = frozenset({"event", "confidence"})
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})


@functools.cache
def _environment() -> celpy.Environment:
    """The CEL environment, built on first use: building its parser costs ~0.3 s, which a
    command that never evaluates a rule (`dispatchq enqueue`, a worker) must not pay."""
    return celpy.Environment()


@dataclass(frozen=True, eq=False)
class Condition:
    """A parsed `if`: the source, the names it reads, and a program to run it."""

    source: str
    names: frozenset[str]
    confidence_refs: frozenset[str]
    program: Any = field(repr=False)

    @classmethod
    def compile(cls, source: str) -> Condition:
        """Parse now so a broken `if` refuses the file at load time; raise ValueError."""
        try:
            tree = _environment().compile(source)
        except Exception as error:  # celpy raises CELParseError, lark a few others
            line = getattr(error, "line", None)
            column = getattr(error, "column", None)
            where = f" at line {line}, column {column}" if line is not None else ""
            raise ValueError(f"does not parse as CEL{where}: {source!r}") from None
        names = _free_names(tree, frozenset())
        return cls(source, frozenset(names), frozenset(_confidence_refs(tree)), _environment().program(tree))

    def question_refs(self, question_ids: Iterable[str]) -> frozenset[str]:
        ids = set(question_ids)
        return frozenset((self.names | self.confidence_refs) & ids)

    def evaluate(self, activation: Mapping[str, Any]) -> bool:
        """True or False, or ConditionError: a non-boolean result is a type error too."""
        try:
            value = self.program.evaluate(dict(activation))
        except Exception as error:
            raise ConditionError(_cel_message(error)) from None
        if isinstance(value, CELEvalError):
            raise ConditionError(_cel_message(value))
        if not isinstance(value, bool | celtypes.BoolType):
            raise ConditionError(f"evaluates to {type(value).__name__}, not a bool")
        return bool(value)


def _cel_message(error: BaseException) -> str:
    """One readable line: celpy embeds the whole activation in some messages."""
    args: tuple[Any, ...] = getattr(error, "args", ())
    text = str(args[0]) if args else str(error)
    cause = args[1] if len(args) > 1 and isinstance(args[1], type) else type(error)
    text = text.split(" (in activation", 1)[0].splitlines()[0] if text else ""
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{cause.__name__}: {text}"


def _children(node: lark.Tree[Any]) -> list[Any]:
    return [c for c in node.children if c is not None]


def _bare_ident(node: Any) -> str | None:
    """The name when a subtree is nothing but one identifier (a macro's loop variable)."""
    while isinstance(node, lark.Tree):
        kids = _children(node)
        if node.data == "ident":
            return str(kids[0])
        if len(kids) != 1:
            return None
        node = kids[0]
    return None


def _free_names(node: Any, bound: frozenset[str]) -> set[str]:
    """Identifiers the expression reads from its bindings (not macro loop variables)."""
    if not isinstance(node, lark.Tree):
        return set()
    kids = _children(node)
    if node.data in ("ident", "dot_ident"):
        name = str(kids[0])
        return set() if name in bound else {name}
    if node.data == "ident_arg":  # a global function call: the name is not a variable
        return set().union(*(_free_names(k, bound) for k in kids[1:]))
    if node.data == "member_dot_arg":
        target, method, *rest = kids
        names = _free_names(target, bound)
        args = _children(rest[0]) if rest else []
        if str(method) in _MACROS and len(args) >= 2 and (var := _bare_ident(args[0])):
            inner = bound | {var}
            return names.union(*(_free_names(a, inner) for a in args[1:]))
        return names.union(*(_free_names(a, bound) for a in args))
    if node.data == "member_dot":  # `x.field`: the field name is not a variable
        return _free_names(kids[0], bound)
    return set().union(*(_free_names(k, bound) for k in kids))


def _confidence_refs(tree: lark.Tree[Any]) -> set[str]:
    """Question ids read as `confidence.q` or `confidence["q"]`: they are dependencies too."""
    refs: set[str] = set()
    for node in tree.iter_subtrees():
        kids = _children(node)
        if node.data == "member_dot" and _bare_ident(kids[0]) == "confidence":
            refs.add(str(kids[1]))
        elif node.data == "member_index" and _bare_ident(kids[0]) == "confidence":
            literal = _string_literal(kids[1])
            if literal is not None:
                refs.add(literal)
    return refs


def _string_literal(node: Any) -> str | None:
    while isinstance(node, lark.Tree):
        kids = _children(node)
        if node.data == "literal":
            text = str(kids[0])
            if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" and "\\" not in text:
                return text[1:-1]
            return None
        if len(kids) != 1:
            return None
        node = kids[0]
    return None


def bindings(event_json: Mapping[str, Any], answers: Mapping[str, Answer]) -> dict[str, Any]:
    """CEL bindings: each question id → its value, `confidence` → map, `event` → the event."""
    activation: dict[str, Any] = {}
    for qid, answer in answers.items():
        value = answer.expression_value
        activation[qid] = celtypes.StringType(value) if isinstance(value, str) else celtypes.DoubleType(value)
    activation["confidence"] = celtypes.MapType(
        {celtypes.StringType(q): celtypes.DoubleType(a.confidence) for q, a in answers.items()}
    )
    activation["event"] = json_to_cel(dict(event_json))
    return activation
