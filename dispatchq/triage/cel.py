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
    tree: Any = field(default=None, repr=False)

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
        for pattern in _regex_literals(tree):
            problem = _regex_problem(pattern)
            if problem is not None:
                raise ValueError(f"matches({pattern!r}): not a regular expression ({problem})")
        names = _free_names(tree, frozenset())
        return cls(
            source, frozenset(names), frozenset(_confidence_refs(tree)), _environment().program(tree), tree
        )

    def int_double_comparisons(self, doubles: Iterable[str]) -> list[tuple[str, str]]:
        """Comparisons of a double (a noul's p, a score, a confidence) with an int literal that
        cel-python refuses at run time (`2 <= sev`, `hi == 1`, `sev in [1, 2]`): each as
        `(the comparison, the literal)`. Found by probing cel-python with the same operator and
        operand order, so what is reported is exactly what it would refuse.
        """
        if self.tree is None:
            return []
        names = frozenset(doubles)
        found: list[tuple[str, str]] = []
        for node in self.tree.iter_subtrees_topdown():
            kids = _children(node)
            if node.data != "relation" or len(kids) != 2 or not isinstance(kids[0], lark.Tree):
                continue
            op = _OPERATORS.get(str(kids[0].data))
            if op is None or not _children(kids[0]):
                continue
            left, right = _children(kids[0])[0], kids[1]
            sides = [_operand(left, names), _operand(right, names)]
            if op == "in":
                ints = _int_list(right)
                if sides[0] == "double" and ints:
                    probe = f"x in [{ints[0]}]"
                    if _refused(probe):
                        found.append((f"{_text(left)} in [{', '.join(ints)}]", ints[0]))
                continue
            kinds = [
                side if side == "double" else _int_literal(n)
                for side, n in zip(sides, (left, right), strict=True)
            ]
            literals = [k for k in kinds if k not in (None, "double")]
            if "double" not in kinds or not literals:
                continue
            a, b = ("x" if k == "double" else literals[0] for k in kinds)
            probe = f"{a} {op} {b}"
            if _refused(probe):
                found.append((f"{_text(left)} {op} {_text(right)}", literals[0]))
        return found

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


def _regex_literals(tree: Any) -> list[str]:
    """The text patterns written as literals in `matches` calls (`s.matches("^v[0-9]")`,
    `matches(s, "x")`): checked at load, since a broken one fails only when it is evaluated."""
    found: list[str] = []
    for node in tree.iter_subtrees():
        kids = _children(node)
        if node.data == "member_dot_arg" and len(kids) == 3 and str(kids[1]) == "matches":
            args = _children(kids[2])
        elif node.data == "ident_arg" and len(kids) == 2 and str(kids[0]) == "matches":
            args = _children(kids[1])[1:]
        else:
            continue
        literal = _pattern_literal(args[0]) if len(args) == 1 else None
        if literal is not None:
            found.append(literal)
    return found


def _pattern_literal(node: Any) -> str | None:
    """The value of a plain string literal (CEL's own reading of its escapes), else None."""
    while isinstance(node, lark.Tree):
        kids = _children(node)
        if len(kids) != 1:
            return None
        node = kids[0]
    if not (isinstance(node, lark.Token) and node.type == "STRING_LIT"):
        return None
    value = _environment().program(_environment().compile(str(node))).evaluate({})
    return str(value) if isinstance(value, celtypes.StringType) else None


def _regex_problem(pattern: str) -> str | None:
    """Why RE2 (the engine `matches` runs on) refuses `pattern`, or None."""
    import re2  # type: ignore[import-untyped]  # noqa: PLC0415 (celpy's own dependency, loaded with it)

    options = re2.Options()
    options.log_errors = False  # the reason is in the exception; RE2 would also print it
    try:
        re2.compile(pattern, options)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        return reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
    return None


_OPERATORS = {
    "relation_lt": "<",
    "relation_le": "<=",
    "relation_gt": ">",
    "relation_ge": ">=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "relation_in": "in",
}


def _operand(node: Any, doubles: frozenset[str]) -> str | None:
    """ "double" when the operand is a double-valued answer (`sev`, `confidence.q`), else None."""
    name = _bare_ident(node)
    if name is not None:
        return "double" if name in doubles else None
    while isinstance(node, lark.Tree) and node.data != "member_dot":
        kids = _children(node)
        if len(kids) != 1:
            return None
        node = kids[0]
    if isinstance(node, lark.Tree) and _bare_ident(_children(node)[0]) == "confidence":
        return "double"
    return None


def _int_literal(node: Any) -> str | None:
    """The text of a plain int literal (`2`, `0x10`), else None."""
    while isinstance(node, lark.Tree):
        kids = _children(node)
        if len(kids) != 1:
            return None
        node = kids[0]
    text = str(node) if isinstance(node, lark.Token) and node.type == "INT_LIT" else None
    return text


def _int_list(node: Any) -> list[str]:
    """The int literals of a list literal (`[1, 2.0, 3]` -> ["1", "3"])."""
    for sub in node.iter_subtrees() if isinstance(node, lark.Tree) else ():
        if sub.data == "list_lit":
            return [t for t in (_int_literal(e) for e in sub.iter_subtrees() if e.data == "expr") if t]
    return []


def _text(node: Any) -> str:
    """A readable rendering of a simple operand (an identifier, `a.b`, a literal)."""
    if not isinstance(node, lark.Tree):
        return str(node)
    tokens = [str(t) for t in node.scan_values(lambda v: isinstance(v, lark.Token))]
    return ".".join(tokens) if tokens else "?"


@functools.cache
def _refused(probe: str) -> bool:
    """Whether cel-python refuses `probe` with x a double: the check lint reports on."""
    try:
        Condition.compile(probe).evaluate({"x": celtypes.DoubleType(1.0)})
    except ConditionError:
        return True
    return False


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
