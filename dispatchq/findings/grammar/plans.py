"""The verification plan's grammar: checks, expectations, quoting and the git allow-list.

Pure on purpose: a plan is parsed when a report is read, and reading a report must not
be able to run anything. Everything here is text in, text (or a refusal) out; what
touches the disk or runs a process is `dispatchq.findings.evidence.boundary`.

The canonical one-line form of a check, used on the `**Verification-plan:**` line::

    <kind> <arg> <arg>… → <expectation>[ (soft)]

Checks are joined by `; `. The quoting rule, the one rule for every argument and for
the operand of `contains`/`equals`/`matches`: a token is written bare unless it is
empty, contains whitespace, a `'`, a `;` or a `→`, or starts with `(`; then it is
wrapped in single quotes, with each `'` inside doubled (`'it''s here'`). It is not shell
quoting on purpose: no check ever reaches a shell. A check whose canonical form would
contain `; `, a second ` → ` or a line break is rejected, never escaped, so splitting
the line on `; ` and each check on its first ` → ` is always exact.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from dispatchq.errors import CheckError
from dispatchq.git.hardening import GIT_HARDENING

__all__ = [
    "ARROW",
    "CHECK_KINDS",
    "EXPECT_KINDS",
    "GIT_SAFE_SUFFIX",
    "GIT_SUBCOMMANDS",
    "SEPARATOR",
    "SOFT",
    "Check",
    "CheckKind",
    "ExpectKind",
    "Expectation",
    "GitArgs",
    "PathProbe",
    "format_plan",
    "grep_split",
    "needs_quotes",
    "one_line",
    "parse_git_args",
    "parse_plan",
    "plan_digest",
    "quote",
    "read_target",
    "split_tokens",
    "syntactic_path_problem",
]

CheckKind = Literal["read", "grep", "glob", "git", "run"]
ExpectKind = Literal["empty", "contains", "equals", "matches", "lines"]
CHECK_KINDS: tuple[CheckKind, ...] = ("read", "grep", "glob", "git", "run")
EXPECT_KINDS: tuple[ExpectKind, ...] = ("empty", "contains", "equals", "matches", "lines")
GIT_SUBCOMMANDS = ("log", "show", "diff", "blame", "status")

ARROW = " → "
SEPARATOR = "; "
SOFT = " (soft)"

# Answers "is this token a path in the working tree?" for the git argument sorter; the
# execution boundary supplies one that looks at the disk, the grammar alone never does.
PathProbe = Callable[[str], bool]


def syntactic_path_problem(token: str) -> str | None:
    """Why a path token is refused before anything on disk is consulted, or None."""
    if not token or "\0" in token or any(ch in token for ch in "\n\r"):
        return "unparseable"
    if token.startswith("/"):
        return "absolute"
    if ".." in token.split("/"):
        return ".."
    return None


# --- the quoting rule ----------------------------------------------------------------
def needs_quotes(token: str) -> bool:
    return (
        token == ""
        or any(ch.isspace() for ch in token)
        or "'" in token
        or ";" in token
        or "→" in token
        or token.startswith("(")
    )


def quote(token: str) -> str:
    """Write one token by the plan line's quoting rule (see the module docstring)."""
    if not needs_quotes(token):
        return token
    return "'" + token.replace("'", "''") + "'"


def split_tokens(text: str) -> list[str]:
    """Read tokens written by `quote`; anything `quote` would not have written is refused."""
    tokens: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == " ":
            i += 1
            continue
        if text[i] == "'":
            j, buf = i + 1, []
            while True:
                if j >= n:
                    raise CheckError(f"unterminated quote in {text!r}")
                if text[j] == "'":
                    if j + 1 < n and text[j + 1] == "'":
                        buf.append("'")
                        j += 2
                        continue
                    j += 1
                    break
                buf.append(text[j])
                j += 1
            if j < n and text[j] != " ":
                raise CheckError(f"a quoted token must be followed by a space in {text!r}")
            tokens.append("".join(buf))
            i = j
            continue
        j = i
        while j < n and text[j] != " ":
            j += 1
        token = text[i:j]
        if needs_quotes(token):
            raise CheckError(f"token {token!r} must be quoted: {quote(token)}")
        tokens.append(token)
        i = j
    return tokens


def one_line(text: str) -> bool:
    return len(text.splitlines()) <= 1 and "\n" not in text and "\r" not in text


# --- git option allow-list -------------------------------------------------------------
# "flag": no value. "value": needs one (`--x=v`, `-xv` or the next token). "optional":
# a flag, or a value attached with `=` only. Everything absent is refused.
_OptSpec = dict[str, Literal["flag", "value", "optional"]]

_DIFF_OPTS: _OptSpec = {
    "-p": "flag", "-u": "flag", "--patch": "flag", "-s": "flag", "--no-patch": "flag",
    "--stat": "optional", "--shortstat": "flag", "--numstat": "flag", "--summary": "flag",
    "--name-only": "flag", "--name-status": "flag", "--raw": "flag", "-w": "flag",
    "--ignore-all-space": "flag", "-b": "flag", "--ignore-space-change": "flag",
    "--ignore-blank-lines": "flag", "--word-diff": "optional", "--minimal": "flag",
    "--patience": "flag", "--histogram": "flag", "-M": "flag", "-C": "flag",
    "--find-renames": "optional", "--find-copies": "optional", "--no-renames": "flag",
    "-R": "flag", "--full-index": "flag", "--abbrev": "optional", "--no-color": "flag",
    "--exit-code": "flag", "--quiet": "flag", "-U": "value", "--unified": "value",
    "--diff-filter": "value", "--color": "optional",
}  # fmt: skip
_LOG_OPTS: _OptSpec = {
    **_DIFF_OPTS,
    "--oneline": "flag", "--abbrev-commit": "flag", "--no-abbrev-commit": "flag",
    "--follow": "flag", "--all": "flag", "--reverse": "flag", "--first-parent": "flag",
    "--no-merges": "flag", "--merges": "flag", "--decorate": "optional",
    "--no-decorate": "flag", "--graph": "flag", "--date-order": "flag",
    "--topo-order": "flag", "--full-history": "flag", "--left-right": "flag",
    "--cherry-pick": "flag", "-i": "flag", "--regexp-ignore-case": "flag", "-E": "flag",
    "--extended-regexp": "flag", "-F": "flag", "--fixed-strings": "flag",
    "--all-match": "flag", "--invert-grep": "flag", "--pickaxe-all": "flag",
    "--pickaxe-regex": "flag", "--source": "flag", "--parents": "flag",
    "--children": "flag", "-n": "value", "--max-count": "value", "--skip": "value",
    "--since": "value", "--after": "value", "--until": "value", "--before": "value",
    "--author": "value", "--committer": "value", "--grep": "value", "-S": "value",
    "-G": "value", "--format": "value", "--pretty": "optional", "--date": "value",
    "--min-parents": "value", "--max-parents": "value",
}  # fmt: skip
_BLAME_OPTS: _OptSpec = {
    "-L": "value", "-w": "flag", "-M": "flag", "-C": "flag", "-s": "flag", "-e": "flag",
    "--show-email": "flag", "-l": "flag", "-t": "flag", "-f": "flag", "--show-name": "flag",
    "-n": "flag", "--show-number": "flag", "-p": "flag", "--porcelain": "flag",
    "--line-porcelain": "flag", "--root": "flag", "--show-stats": "flag",
    "--abbrev": "optional", "--date": "value",
}  # fmt: skip
_STATUS_OPTS: _OptSpec = {
    "-s": "flag", "--short": "flag", "-b": "flag", "--branch": "flag",
    "--porcelain": "optional", "--long": "flag", "-z": "flag", "--show-stash": "flag",
    "--ahead-behind": "flag", "--no-ahead-behind": "flag", "--renames": "flag",
    "--no-renames": "flag", "--ignored": "optional", "-u": "optional",
    "--untracked-files": "optional", "--find-renames": "optional",
}  # fmt: skip
_GIT_OPTS: dict[str, _OptSpec] = {
    "log": _LOG_OPTS,
    "show": _LOG_OPTS,
    "diff": {**_DIFF_OPTS, "--cached": "flag", "--staged": "flag", "--merge-base": "flag"},
    "blame": _BLAME_OPTS,
    "status": _STATUS_OPTS,
}
# Named so the refusal can say why; the allow-list above would refuse them anyway.
_GIT_FORBIDDEN = (
    "--output", "--no-index", "--ext-diff", "--textconv", "-c", "--git-dir",
    "--work-tree", "--exec-path", "--contents", "--ignore-revs-file", "-O",
    "--open-files-in-pager", "--show-signature", "--paginate", "--namespace",
)  # fmt: skip
# What dispatchq itself adds, so repository or user config cannot turn a read into a run.
GIT_SAFE_SUFFIX: dict[str, tuple[str, ...]] = {
    "log": ("--no-ext-diff", "--no-textconv", "--no-color"),
    "show": ("--no-ext-diff", "--no-textconv", "--no-color"),
    "diff": ("--no-ext-diff", "--no-textconv", "--no-color"),
    "blame": ("--no-textconv",),
    "status": (),
}
_REVISION = re.compile(r"^[A-Za-z0-9._/~^@{}:+,-]+$")
_BLAME_RANGE = re.compile(r"^\d+(,[+-]?\d+)?$")
_NUMERIC_OPT = re.compile(r"^-\d+$")
_GIT_PATH = re.compile(r"^[A-Za-z0-9._/+@,-]+$")


@dataclass(frozen=True)
class GitArgs:
    """A git check's arguments, sorted into options, revisions and paths."""

    subcommand: str
    options: tuple[str, ...]
    revisions: tuple[str, ...]
    paths: tuple[str, ...]

    def subcommand_argv(self) -> list[str]:
        """What follows `git` and its hardening: the subcommand, its safe suffix, the rest."""
        return [
            self.subcommand,
            *GIT_SAFE_SUFFIX[self.subcommand],
            *self.options,
            *self.revisions,
            "--",
            *self.paths,
        ]

    def argv(self) -> list[str]:
        """The whole argv, as `dispatchq.git.run` builds it."""
        return ["git", *GIT_HARDENING, *self.subcommand_argv()]


def _forbidden(option: str) -> bool:
    name = option.split("=", 1)[0]
    return name in _GIT_FORBIDDEN or (option.startswith("-O") and not option.startswith("--"))


def _git_option(sub: str, spec: _OptSpec, tok: str, rest: Sequence[str], i: int) -> tuple[str, int]:
    """One option token of `git sub`, as the argv will carry it, and the index after it
    (past its value when the value is the next token); refused unless the allow-list names it."""
    if _forbidden(tok):
        raise CheckError(f"git option {tok} is not allowed: it can write or read outside the tree")
    if _NUMERIC_OPT.match(tok) and sub in ("log", "show"):
        return tok, i
    name, eq, value = tok.partition("=")
    mode = spec.get(name)
    if mode is None and not name.startswith("--") and len(name) > 2:
        # attached short value: -n5, -U3, -Sfoo, -L10,20, -uno
        name, value, eq = name[:2], tok[2:], "attached"
        mode = spec.get(name)
        if mode == "flag":
            mode = None
    if mode is None:
        raise CheckError(f"git {sub} option {tok} is not on the allow-list")
    if mode == "flag" and eq:
        raise CheckError(f"git {sub} option {name} takes no value")
    if mode == "value" and not eq:
        if i >= len(rest):
            raise CheckError(f"git {sub} option {name} needs a value")
        value = rest[i]
        i += 1
    if name == "-L" and not _BLAME_RANGE.match(value):
        raise CheckError(f"git blame -L takes START[,END] line numbers, not {value!r}")
    if eq or mode == "value":
        return (f"{name}={value}" if name.startswith("--") else f"{name}{value}"), i
    return name, i


def parse_git_args(args: Sequence[str], is_path: PathProbe | None = None) -> GitArgs:
    """Sort a git check's tokens and refuse anything the allow-list does not name.

    A non-option token before `--` is a path when `is_path` says it exists in the working
    tree (the boundary's `exists_in(root)`), a revision otherwise; paths always go after
    `--` in the argv we build. Without a probe every such token is a revision.
    """
    if not args:
        raise CheckError("git check needs a subcommand")
    sub, rest = args[0], list(args[1:])
    if sub not in GIT_SUBCOMMANDS:
        raise CheckError(f"git {sub} is outside the boundary (only {', '.join(GIT_SUBCOMMANDS)})")
    spec = _GIT_OPTS[sub]
    options: list[str] = []
    revisions: list[str] = []
    paths: list[str] = []
    after_dashdash = False
    i = 0
    while i < len(rest):
        tok = rest[i]
        i += 1
        if after_dashdash:
            paths.append(tok)
            continue
        if tok == "--":
            after_dashdash = True
            continue
        if tok.startswith("-") and tok != "-":
            option, i = _git_option(sub, spec, tok, rest, i)
            options.append(option)
            continue
        if is_path is not None and syntactic_path_problem(tok) is None and is_path(tok):
            paths.append(tok)
        elif _REVISION.match(tok) and not tok.startswith("-"):
            revisions.append(tok)
        else:
            raise CheckError(f"git {sub}: {tok!r} is neither a revision nor a path in the repository")
    for path in paths:
        problem = syntactic_path_problem(path)
        if problem:
            raise CheckError(f"git {sub}: path {path!r} refused ({problem})")
        if not _GIT_PATH.match(path) or path.startswith("-"):
            raise CheckError(f"git {sub}: path {path!r} has characters outside the allow-list")
    return GitArgs(sub, tuple(options), tuple(revisions), tuple(paths))


# --- checks ----------------------------------------------------------------------------
_READ_TARGET = re.compile(r"^(?P<path>.+):(?P<start>\d+)(?:-(?P<end>\d+))?$")


@dataclass(frozen=True)
class Expectation:
    """What a check's raw output must show; the operand is text, a regex or a count."""

    kind: ExpectKind
    operand: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in EXPECT_KINDS:
            raise CheckError(f"unknown expectation {self.kind!r} (one of {', '.join(EXPECT_KINDS)})")
        if self.kind == "empty":
            if self.operand is not None:
                raise CheckError("expectation `empty` takes no operand")
            return
        if self.operand is None:
            raise CheckError(f"expectation `{self.kind}` needs an operand")
        if self.kind == "lines" and not self.operand.isdigit():
            raise CheckError(f"expectation `lines` takes a count, not {self.operand!r}")
        if self.kind == "matches":
            try:
                re.compile(self.operand, re.MULTILINE)
            except re.error as error:
                raise CheckError(f"expectation regex {self.operand!r} does not compile: {error}") from None

    @property
    def text(self) -> str:
        return self.kind if self.operand is None else f"{self.kind} {quote(self.operand)}"


@dataclass(frozen=True)
class Check:
    """One structured check: a kind, its argument tokens and the expected output.

    For `git`, `args[0]` is the subcommand; for `run`, `args` is the argv.
    """

    kind: CheckKind
    args: tuple[str, ...]
    expect: Expectation
    soft: bool = False

    def __post_init__(self) -> None:
        if self.kind not in CHECK_KINDS:
            raise CheckError(f"unknown check kind {self.kind!r} (one of {', '.join(CHECK_KINDS)})")
        object.__setattr__(self, "args", tuple(self.args))
        validate = getattr(self, f"_validate_{self.kind}")
        validate()
        if self.soft and not (self.kind == "read" and self.expect.kind in ("contains", "equals")):
            raise CheckError("only a `read` whose expectation is an excerpt (contains/equals) can be soft")
        line = self.text
        if not one_line(line):
            raise CheckError("a check must fit on one physical line")
        if SEPARATOR in line:
            raise CheckError(f"check {line!r} contains '; ', the plan separator; rewrite or split it")
        if line.count(ARROW) != 1:
            raise CheckError(f"check {line!r} contains ' → ' beyond its own separator")

    def _validate_read(self) -> None:
        if len(self.args) != 1:
            raise CheckError("read takes exactly one PATH:LINE[-LINE]")
        target = read_target(self.args[0])
        if target is None:
            raise CheckError(f"read target {self.args[0]!r} is not PATH:LINE or PATH:LINE-LINE")
        problem = syntactic_path_problem(target[0])
        if problem:
            raise CheckError(f"read path {target[0]!r} refused ({problem})")

    def _validate_grep(self) -> None:
        flags, rest = grep_split(self.args)
        if len(rest) < 2:
            raise CheckError("grep takes [-i] [-F] PATTERN PATH…")
        if len(flags) != len(set(flags)):
            raise CheckError("grep flag repeated")
        pattern = rest[0]
        try:
            re.compile(re.escape(pattern) if "-F" in flags else pattern)
        except re.error as error:
            raise CheckError(f"grep pattern {pattern!r} does not compile: {error}") from None
        for path in rest[1:]:
            problem = syntactic_path_problem(path)
            if problem:
                raise CheckError(f"grep path {path!r} refused ({problem})")

    def _validate_glob(self) -> None:
        if len(self.args) != 1:
            raise CheckError("glob takes exactly one PATTERN")
        problem = syntactic_path_problem(self.args[0])
        if problem:
            raise CheckError(f"glob pattern {self.args[0]!r} refused ({problem})")

    def _validate_git(self) -> None:
        parse_git_args(self.args)

    def _validate_run(self) -> None:
        if not self.args:
            raise CheckError("run needs an argv")

    def path_operands(self, is_path: PathProbe | None = None) -> list[str]:
        """The repository paths this check would read (a glob's matches are contained as found)."""
        if self.kind == "read":
            target = read_target(self.args[0])
            return [target[0]] if target else []
        if self.kind == "grep":
            return [p for p in grep_split(self.args)[1][1:] if posixpath.normpath(p) != "."]
        if self.kind == "git":
            return list(parse_git_args(self.args, is_path).paths)
        return []

    @property
    def inside_boundary(self) -> bool:
        """Inside the boundary a check runs unasked; outside it needs a person's approval."""
        return self.kind != "run"

    @property
    def command(self) -> str:
        """The check without its expectation: what would run."""
        return " ".join([self.kind, *(quote(a) for a in self.args)])

    @property
    def text(self) -> str:
        """The canonical one-line form, as written on the `**Verification-plan:**` line."""
        return f"{self.command}{ARROW}{self.expect.text}{SOFT if self.soft else ''}"

    @classmethod
    def parse(cls, text: str, *, canonical: bool = True) -> Check:
        """A check from its one-line form. On a report's plan line the form must be canonical
        (what dispatchq wrote); a session's one-line check may quote more than it must
        (`matches '.+'`), and is read into the same tokens (`canonical=False`)."""
        if ARROW not in text:
            raise CheckError(f"check {text!r} has no ' → <expected>'")
        command, _, expected = text.partition(ARROW)
        soft = expected.endswith(SOFT)
        if soft:
            expected = expected[: -len(SOFT)]
        tokens = split_tokens(command)
        if not tokens:
            raise CheckError(f"check {text!r} names no command")
        exp = split_tokens(expected)
        if not exp:
            raise CheckError(f"check {text!r} has an empty expectation")
        if len(exp) > 2:
            raise CheckError(f"expectation {expected!r} must be one kind and at most one operand")
        check = cls(
            tokens[0],  # type: ignore[arg-type]
            tuple(tokens[1:]),
            Expectation(exp[0], exp[1] if len(exp) == 2 else None),  # type: ignore[arg-type]
            soft,
        )
        if canonical and check.text != text:
            raise CheckError(f"check {text!r} is not in canonical form: {check.text!r}")
        return check

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Check:
        """Build a check from the analyst's structured form.

        ``{"kind": "grep", "args": ["-F", "x", "docs"], "expect": {"kind": "empty"},
        "soft": false}``; `expect.text` carries the operand.
        """
        expect = data.get("expect")
        args = data.get("args", [])
        kind = data.get("kind")
        soft = data.get("soft", False)
        if (
            not isinstance(kind, str)
            or not isinstance(expect, Mapping)
            or not isinstance(expect.get("kind"), str)
            or not isinstance(args, list | tuple)
            or not all(isinstance(a, str) for a in args)
            or not isinstance(soft, bool)
        ):
            raise CheckError(f"malformed structured check {dict(data)!r}")
        operand = expect.get("text")
        if operand is not None and not isinstance(operand, str | int):
            raise CheckError(f"malformed expectation operand in {dict(data)!r}")
        return cls(
            kind,  # type: ignore[arg-type]
            tuple(args),
            Expectation(expect["kind"], None if operand is None else str(operand)),
            soft,
        )

    def to_json(self) -> dict[str, object]:
        expect: dict[str, object] = {"kind": self.expect.kind}
        if self.expect.operand is not None:
            expect["text"] = self.expect.operand
        return {"kind": self.kind, "args": list(self.args), "expect": expect, "soft": self.soft}


def grep_split(args: Sequence[str]) -> tuple[list[str], list[str]]:
    flags: list[str] = []
    i = 0
    while i < len(args) and args[i] in ("-i", "-F"):
        flags.append(args[i])
        i += 1
    return flags, list(args[i:])


def read_target(token: str) -> tuple[str, int, int] | None:
    """`PATH:LINE[-LINE]` as (path, first, last), or None when it does not parse."""
    m = _READ_TARGET.match(token)
    if not m:
        return None
    start = int(m["start"])
    end = int(m["end"]) if m["end"] else start
    if start < 1 or end < start:
        return None
    return m["path"], start, end


def parse_plan(value: str) -> list[Check]:
    """The checks of a `**Verification-plan:**` value, split on `; ` then on ` → `."""
    if not value.strip():
        raise CheckError("empty verification plan")
    return [Check.parse(part) for part in value.split(SEPARATOR)]


def format_plan(checks: Sequence[Check]) -> str:
    """The one-line value for `**Verification-plan:**`."""
    if not checks:
        raise CheckError("a plan needs at least one check; write no plan line instead")
    return SEPARATOR.join(c.text for c in checks)


def plan_digest(checks: Sequence[Check]) -> str:
    """The identity an approval is bound to: any change to the plan voids it."""
    return hashlib.sha256(format_plan(checks).encode("utf-8")).hexdigest()
