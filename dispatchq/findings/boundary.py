"""Verification plans, and the execution boundary they run under.

A plan is written by an analyst session, persisted as one report line, and executed by
dispatchq after a fixer ran. The fixer can edit the report and the tree, so nothing in
a plan may be able to do more than *read the repository*: that is the boundary.

Inside it, with no approval, run only dispatchq's own `read`, `grep` and `glob` (Python,
no shell, paths contained in the repository) and five read-only git subcommands with
options from an allow-list. Everything else is a `run` check: an argv list that runs
only when a person approved that exact argv for that finding and that plan, and the
approval lives in dispatchq's store, never in the report.

The canonical one-line form of a check, used on the `**Verification-plan:**` line::

    <kind> <arg> <arg>… → <expectation>[ (soft)]

Checks are joined by `; `. The quoting rule, the one rule for every argument and for
the operand of `contains`/`equals`/`matches`: a token is written bare unless it is
empty, contains whitespace, a `'`, a `;` or a `→`, or starts with `(`; then it is
wrapped in single quotes, with each `'` inside doubled (`'it''s here'`). It is not shell
quoting on purpose: no check ever reaches a shell. A check whose canonical form would
contain `; `, a second ` → ` or a line break is rejected, never escaped, so splitting
the line on `; ` and each check on its first ` → ` is always exact.

A check passes when its raw output meets its expectation, never on exit status alone
(a grep asserting an absence "fails" when it succeeds).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import subprocess
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dispatchq import keys
from dispatchq.errors import CheckError, RegexTimeout
from dispatchq.launcher.environment import child_environment

if TYPE_CHECKING:
    import redis

CheckKind = Literal["read", "grep", "glob", "git", "run"]
ExpectKind = Literal["empty", "contains", "equals", "matches", "lines"]
CHECK_KINDS: tuple[CheckKind, ...] = ("read", "grep", "glob", "git", "run")
EXPECT_KINDS: tuple[ExpectKind, ...] = ("empty", "contains", "equals", "matches", "lines")
GIT_SUBCOMMANDS = ("log", "show", "diff", "blame", "status")

ARROW = " → "
SEPARATOR = "; "
SOFT = " (soft)"

DEFAULT_REGEX_TIMEOUT = 10.0
DEFAULT_GIT_TIMEOUT = 60.0
DEFAULT_RUN_TIMEOUT = 900.0


# --- containment ---------------------------------------------------------------------
@dataclass(frozen=True)
class Containment:
    """The verdict on one repository-relative path token.

    `why` is None when the path is contained; otherwise it is one of `absolute`, `..`,
    `symlink escape`, `outside the root`, `git internals` or `unparseable`.
    """

    token: str
    path: str | None
    resolved: Path | None
    why: str | None

    @property
    def ok(self) -> bool:
        return self.why is None


def _is_inside(candidate: str, root: str) -> bool:
    # The trailing separator is the whole point: `/r-evil/x` starts with `/r` too.
    return candidate.startswith(root.rstrip(os.sep) + os.sep)


def syntactic_path_problem(token: str) -> str | None:
    """Why a path token is refused before anything on disk is consulted, or None."""
    if not token or "\0" in token or any(ch in token for ch in "\n\r"):
        return "unparseable"
    if token.startswith("/"):
        return "absolute"
    if ".." in token.split("/"):
        return ".."
    return None


def contain(root: Path | str, token: str) -> Containment:
    """Decide whether `token` names a path inside the repository at `root`.

    Absolute paths and `..` segments are refused before resolving, so no spelling of
    "go up" is ever interpreted. The parent directory is resolved physically (symlinks
    followed) and the last component re-attached, which gives one answer for a path
    that does not exist yet; when the leaf itself is a symlink its target must be inside
    too. Paths inside `.git` are refused: they are git's state and may hold credentials.
    """
    problem = syntactic_path_problem(token)
    if problem:
        return Containment(token, None, None, problem)
    norm = posixpath.normpath(token)
    if norm in (".", ""):
        return Containment(token, None, None, "outside the root")
    if ".git" in norm.split("/"):
        return Containment(token, norm, None, "git internals")
    root_real = os.path.realpath(root)
    parent, leaf = posixpath.split(norm)
    parent_real = os.path.realpath(os.path.join(root_real, parent))
    candidate = os.path.join(parent_real, leaf)
    if not _is_inside(candidate, root_real):
        return Containment(token, norm, None, "symlink escape")
    if os.path.islink(candidate):
        target = os.path.realpath(candidate)
        if not _is_inside(target, root_real):
            return Containment(token, norm, None, "symlink escape")
        if ".git" in os.path.relpath(target, root_real).split(os.sep):
            return Containment(token, norm, None, "git internals")
    if ".git" in os.path.relpath(candidate, root_real).split(os.sep):
        return Containment(token, norm, None, "git internals")
    return Containment(token, norm, Path(candidate), None)


# --- the quoting rule ----------------------------------------------------------------
def _needs_quotes(token: str) -> bool:
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
    if not _needs_quotes(token):
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
        if _needs_quotes(token):
            raise CheckError(f"token {token!r} must be quoted: {quote(token)}")
        tokens.append(token)
        i = j
    return tokens


def _one_line(text: str) -> bool:
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
_GIT_SAFE_SUFFIX: dict[str, tuple[str, ...]] = {
    "log": ("--no-ext-diff", "--no-textconv", "--no-color"),
    "show": ("--no-ext-diff", "--no-textconv", "--no-color"),
    "diff": ("--no-ext-diff", "--no-textconv", "--no-color"),
    "blame": ("--no-textconv",),
    "status": (),
}
GIT_HARDENING = (
    "--no-pager",
    "--no-optional-locks",
    "-c", "core.fsmonitor=false",
    "-c", "core.hooksPath=/dev/null",
    "-c", "log.showSignature=false",
    "-c", "color.ui=false",
    "-c", "core.pager=cat",
)  # fmt: skip
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

    def argv(self) -> list[str]:
        return [
            "git",
            *GIT_HARDENING,
            self.subcommand,
            *_GIT_SAFE_SUFFIX[self.subcommand],
            *self.options,
            *self.revisions,
            "--",
            *self.paths,
        ]


def _forbidden(option: str) -> bool:
    name = option.split("=", 1)[0]
    return name in _GIT_FORBIDDEN or (option.startswith("-O") and not option.startswith("--"))


def parse_git_args(args: Sequence[str], root: Path | str | None = None) -> GitArgs:
    """Sort a git check's tokens and refuse anything the allow-list does not name.

    A non-option token before `--` is a path when it exists in the working tree at
    `root`, a revision otherwise; paths always go after `--` in the argv we build.
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
            if _forbidden(tok):
                raise CheckError(f"git option {tok} is not allowed: it can write or read outside the tree")
            if _NUMERIC_OPT.match(tok) and sub in ("log", "show"):
                options.append(tok)
                continue
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
                options.append(f"{name}={value}" if name.startswith("--") else f"{name}{value}")
            else:
                options.append(name)
            continue
        if root is not None and syntactic_path_problem(tok) is None and os.path.lexists(Path(root, tok)):
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


def git_environment() -> dict[str, str]:
    """The environment for every git child: scrubbed, with git's own knobs pinned.

    Every inherited `GIT_*` variable is dropped (GIT_DIR, GIT_EXTERNAL_DIFF and friends
    would redirect or extend what a read does) and the few we need are set explicitly.
    """
    env = {k: v for k, v in child_environment(os.environ).items() if not k.startswith("GIT_")}
    env.update(
        GIT_PAGER="cat",
        PAGER="cat",
        GIT_TERMINAL_PROMPT="0",
        GIT_NO_LAZY_FETCH="1",
        GIT_LITERAL_PATHSPECS="1",
        GIT_OPTIONAL_LOCKS="0",
    )
    return env


def run_git(
    root: Path | str,
    args: Sequence[str],
    *,
    input: bytes | None = None,
    timeout: float = DEFAULT_GIT_TIMEOUT,
) -> subprocess.CompletedProcess[bytes]:
    """Run `git <args>` in `root` with dispatchq's hardening; never through a shell."""
    return subprocess.run(
        ["git", *GIT_HARDENING, *args],
        cwd=root,
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        env=git_environment(),
        timeout=timeout,
        check=False,
    )


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
        if not _one_line(line):
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
        flags, rest = _grep_split(self.args)
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

    def path_operands(self, root: Path | str | None = None) -> list[str]:
        """The repository paths this check would read (a glob's matches are contained as found)."""
        if self.kind == "read":
            target = read_target(self.args[0])
            return [target[0]] if target else []
        if self.kind == "grep":
            return [p for p in _grep_split(self.args)[1][1:] if posixpath.normpath(p) != "."]
        if self.kind == "git":
            return list(parse_git_args(self.args, root).paths)
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
    def parse(cls, text: str) -> Check:
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
        if check.text != text:
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


def _grep_split(args: Sequence[str]) -> tuple[list[str], list[str]]:
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


# --- running -------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckResult:
    """What one check did. `output` is the raw output it is graded on.

    `ran` is False when the boundary refused the check or it could not be executed (no
    approval, a path escaping the tree, a regex over its time limit); such a check is
    disclosed as "not run", never silently skipped. `error` carries a failure the check
    ran into (a missing file, git's stderr, a non-zero exit) without deciding the pass.
    """

    check: Check
    ran: bool
    passed: bool
    output: str = ""
    error: str | None = None
    why_not_run: str | None = None
    quoted_from: str | None = None

    @property
    def log(self) -> str:
        """The raw log dispatchq keeps for this check."""
        head = f"$ {self.check.text}"
        if not self.ran:
            return f"{head}\n[not run: {self.why_not_run}]\n"
        verdict = "pass" if self.passed else "fail"
        where = f"[excerpt from {self.quoted_from}]\n" if self.quoted_from else ""
        err = f"[error: {self.error}]\n" if self.error else ""
        body = self.output if self.output.endswith("\n") or not self.output else self.output + "\n"
        return f"{head}\n{where}{body}{err}[{verdict}]\n"


@dataclass(frozen=True)
class PlanResult:
    """The results of one plan, in plan order."""

    results: tuple[CheckResult, ...]

    @property
    def ran(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.ran)

    @property
    def not_run(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if not r.ran)

    @property
    def passed(self) -> bool:
        """At least one check ran and every check that ran passed."""
        ran = self.ran
        return bool(ran) and all(r.passed for r in ran)

    @property
    def soft(self) -> bool:
        return any(r.check.soft for r in self.ran)


# Runs in a separate interpreter (`python -I -S -c`), so a catastrophic regex can be
# killed: `re` never releases the GIL, so a thread could not be.
_WORKER = r"""
import json, re, sys
req = json.loads(sys.stdin.buffer.read().decode("utf-8"))
if req["mode"] == "match":
    found = re.search(req["pattern"], req["text"], re.MULTILINE)
    sys.stdout.write("1" if found else "0")
    raise SystemExit(0)
rx = re.compile(req["pattern"], re.IGNORECASE if req["ignore_case"] else 0)
out = []
for display, path in req["files"]:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        sys.stderr.write("grep: %s: %s\n" % (display, error.strerror))
        continue
    if b"\0" in data[:8192]:
        continue
    pieces = data.decode("utf-8", "replace").split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()
    for number, line in enumerate(pieces, 1):
        if rx.search(line):
            out.append("%s:%d:%s" % (display, number, line))
sys.stdout.buffer.write("".join(s + "\n" for s in out).encode("utf-8", "surrogatepass"))
"""


def _worker(request: Mapping[str, object], timeout: float) -> subprocess.CompletedProcess[bytes]:
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _WORKER],
            input=json.dumps(request).encode("utf-8"),
            capture_output=True,
            env=child_environment(os.environ),
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RegexTimeout(f"regex timed out after {timeout:g}s") from None
    if done.returncode != 0:
        raise CheckError(f"regex worker failed: {done.stderr.decode('utf-8', 'replace').strip()}")
    return done


def regex_search(pattern: str, text: str, *, timeout: float = DEFAULT_REGEX_TIMEOUT) -> bool:
    """`re.search(pattern, text, re.MULTILINE)` with a time limit."""
    return _worker({"mode": "match", "pattern": pattern, "text": text}, timeout).stdout == b"1"


def meets(expect: Expectation, output: str, *, timeout: float = DEFAULT_REGEX_TIMEOUT) -> bool:
    """Whether raw output meets an expectation.

    `empty`: nothing but whitespace. `contains`: the text is a substring. `equals`: the
    output, without its trailing line breaks, is exactly the text. `matches`: the regex
    is found anywhere (multiline). `lines`: the output has exactly that many lines.
    """
    operand = expect.operand or ""
    if expect.kind == "empty":
        return output.strip() == ""
    if expect.kind == "contains":
        return operand in output
    if expect.kind == "equals":
        return output.rstrip("\r\n") == operand
    if expect.kind == "matches":
        return regex_search(operand, output, timeout=timeout)
    return len(output.splitlines()) == int(operand)


def _walk_files(start: str) -> Iterable[str]:
    """Files under `start`, like `grep -r`: symlinks met while recursing are not followed."""
    for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != ".git" and not os.path.islink(Path(dirpath, d)))
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                yield full


def _not_run(check: Check, why: str) -> CheckResult:
    return CheckResult(check, ran=False, passed=False, why_not_run=why)


def _finish(check: Check, output: str, error: str | None, timeout: float, **extra: str) -> CheckResult:
    try:
        passed = meets(check.expect, output, timeout=timeout)
    except RegexTimeout as exc:
        return _not_run(check, str(exc))
    return CheckResult(check, ran=True, passed=passed, output=output, error=error, **extra)


def _run_read(check: Check, root: Path, timeout: float) -> CheckResult:
    target = read_target(check.args[0])
    assert target is not None
    path, start, end = target
    verdict = contain(root, path)
    if not verdict.ok:
        return _not_run(check, f"path {path} refused ({verdict.why})")
    assert verdict.resolved is not None
    where = f"{verdict.path}:{start}" if start == end else f"{verdict.path}:{start}-{end}"
    try:
        data = verdict.resolved.read_bytes()
    except FileNotFoundError:
        return _finish(check, "", f"{path}: no such file", timeout, quoted_from=where)
    except OSError as error:
        return _finish(check, "", f"{path}: {error.strerror}", timeout, quoted_from=where)
    lines = data.decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    chosen = [line.rstrip("\r") for line in lines[start - 1 : end]]
    output = "".join(line + "\n" for line in chosen)
    return _finish(check, output, None, timeout, quoted_from=where)


def _run_grep(check: Check, root: Path, timeout: float) -> CheckResult:
    flags, rest = _grep_split(check.args)
    pattern, operands = rest[0], rest[1:]
    root_real = os.path.realpath(root)
    files: list[tuple[str, str]] = []
    errors: list[str] = []
    for operand in operands:
        if posixpath.normpath(operand) == ".":
            resolved = root_real
        else:
            verdict = contain(root, operand)
            if not verdict.ok or verdict.resolved is None:
                return _not_run(check, f"path {operand} refused ({verdict.why})")
            resolved = os.path.realpath(verdict.resolved)
        if os.path.isdir(resolved):
            for full in _walk_files(resolved):
                rel = os.path.relpath(full, resolved)
                display = posixpath.join(operand, rel.replace(os.sep, "/"))
                if contain(root, posixpath.normpath(os.path.relpath(full, root_real))).ok:
                    files.append((display, full))
        elif os.path.isfile(resolved):
            files.append((operand, resolved))
        else:
            errors.append(f"grep: {operand}: No such file or directory")
    request = {
        "mode": "grep",
        "pattern": re.escape(pattern) if "-F" in flags else pattern,
        "ignore_case": "-i" in flags,
        "files": files,
    }
    try:
        done = _worker(request, timeout)
    except RegexTimeout as exc:
        return _not_run(check, str(exc))
    errors.extend(done.stderr.decode("utf-8", "replace").splitlines())
    return _finish(check, done.stdout.decode("utf-8", "replace"), "; ".join(errors) or None, timeout)


_GLOB_CACHE: dict[str, re.Pattern[str]] = {}


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Translate a glob (`*`, `?`, `[…]`, `**` for any depth) into an anchored regex."""
    if pattern in _GLOB_CACHE:
        return _GLOB_CACHE[pattern]
    parts: list[str] = []
    segments = pattern.split("/")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            parts.append(".*" if last else "(?:[^/]*/)*")
            continue
        out, i = [], 0
        while i < len(segment):
            ch = segment[i]
            if ch == "*":
                out.append("[^/]*")
            elif ch == "?":
                out.append("[^/]")
            elif ch == "[" and segment.find("]", i + 2) != -1:
                close = segment.find("]", i + 2)
                body = segment[i + 1 : close]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = close
            else:
                out.append(re.escape(ch))
            i += 1
        parts.append("".join(out) + ("" if last else "/"))
    compiled = re.compile("^" + "".join(parts) + "$")
    _GLOB_CACHE[pattern] = compiled
    return compiled


def _run_glob(check: Check, root: Path, timeout: float) -> CheckResult:
    pattern = posixpath.normpath(check.args[0])
    try:
        rx = glob_regex(pattern)
    except (re.error, ValueError) as error:
        return _not_run(check, f"glob pattern does not compile: {error}")
    root_real = os.path.realpath(root)
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root_real, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in filenames + dirnames:
            rel = os.path.relpath(os.path.join(dirpath, name), root_real).replace(os.sep, "/")
            if rx.match(rel) and contain(root_real, rel).ok:
                found.append(rel)
    return _finish(check, "".join(f"{p}\n" for p in sorted(found)), None, timeout)


def _run_git(check: Check, root: Path, timeout: float, git_timeout: float) -> CheckResult:
    try:
        parsed = parse_git_args(check.args, root)
    except CheckError as error:
        return _not_run(check, str(error))
    for path in parsed.paths:
        verdict = contain(root, path)
        if not verdict.ok:
            return _not_run(check, f"path {path} refused ({verdict.why})")
    try:
        done = subprocess.run(
            parsed.argv(),
            cwd=root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=git_environment(),
            timeout=git_timeout,
            check=False,
        )
    except FileNotFoundError:
        return _not_run(check, "git is not installed")
    except subprocess.TimeoutExpired:
        return _not_run(check, f"git timed out after {git_timeout:g}s")
    error = done.stderr.decode("utf-8", "replace").strip() or None
    if done.returncode != 0:
        error = f"exit status {done.returncode}" + (f": {error}" if error else "")
    return _finish(check, done.stdout.decode("utf-8", "replace"), error, timeout)


def _run_run(check: Check, root: Path, timeout: float, run_timeout: float) -> CheckResult:
    try:
        done = subprocess.run(
            list(check.args),
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_environment(os.environ),
            timeout=run_timeout,
            check=False,
        )
    except FileNotFoundError:
        return _not_run(check, f"{check.args[0]}: command not found")
    except PermissionError:
        return _not_run(check, f"{check.args[0]}: permission denied")
    except subprocess.TimeoutExpired:
        return _not_run(check, f"timed out after {run_timeout:g}s")
    error = f"exit status {done.returncode}" if done.returncode else None
    return _finish(check, done.stdout.decode("utf-8", "replace"), error, timeout)


def run_check(
    check: Check,
    root: Path | str,
    *,
    approved: bool = False,
    regex_timeout: float = DEFAULT_REGEX_TIMEOUT,
    git_timeout: float = DEFAULT_GIT_TIMEOUT,
    run_timeout: float = DEFAULT_RUN_TIMEOUT,
) -> CheckResult:
    """Run one check under the boundary. A `run` check runs only when `approved`."""
    root = Path(root)
    if check.kind == "read":
        return _run_read(check, root, regex_timeout)
    if check.kind == "grep":
        return _run_grep(check, root, regex_timeout)
    if check.kind == "glob":
        return _run_glob(check, root, regex_timeout)
    if check.kind == "git":
        return _run_git(check, root, regex_timeout, git_timeout)
    if not approved:
        return _not_run(check, "outside the execution boundary and not approved")
    return _run_run(check, root, regex_timeout, run_timeout)


def run_plan(
    checks: Sequence[Check],
    root: Path | str,
    *,
    approved: Callable[[Check], bool] = lambda _check: False,
    inside_only: bool = False,
    **timeouts: float,
) -> PlanResult:
    """Run every check of a plan; `run` checks only where `approved(check)` says so.

    `inside_only` runs nothing outside the boundary whatever the approvals, which is
    what the reject evidence gate needs.
    """
    results = []
    for check in checks:
        ok = not inside_only and approved(check)
        results.append(run_check(check, root, approved=ok, **timeouts))
    return PlanResult(tuple(results))


@dataclass(frozen=True)
class PlanTest:
    """The plan-rejection test's verdict at decision time.

    `rejected` means the plan is to be treated as no plan at all (grading's fourth
    case): it cannot tell a fix from no fix.
    """

    rejected: bool
    why: str
    results: PlanResult | None = None


def plan_rejection(
    checks: Sequence[Check],
    root: Path | str,
    *,
    absent_text_only: Collection[int] = (),
    **timeouts: float,
) -> PlanTest:
    """Run a plan's in-boundary checks on the unedited tree and judge the plan.

    A check is useless as evidence when it already passes now, or when the analyst
    marked it (by index in `absent_text_only`) as failing only because the edit's own
    text is absent. The plan is rejected when every check is useless. An unmarked `run`
    check cannot be tested here, so a plan holding one is never rejected by this test.
    """
    if not checks:
        return PlanTest(True, "empty plan")
    inside = [c for i, c in enumerate(checks) if c.inside_boundary and i not in absent_text_only]
    results = run_plan(inside, root, inside_only=True, **timeouts)
    by_check = iter(results.results)
    useless: list[bool] = []
    for index, check in enumerate(checks):
        if index in absent_text_only:
            useless.append(True)
        elif not check.inside_boundary:
            useless.append(False)
        else:
            result = next(by_check)
            useless.append(result.ran and result.passed)
    if all(useless):
        if all(i in absent_text_only for i in range(len(checks))):
            why = "every check fails only because the edit's text is absent"
        else:
            why = "every check already passes on the unedited tree"
        return PlanTest(True, why, results)
    if not inside and not absent_text_only:
        return PlanTest(False, "no in-boundary check: not testable on the unedited tree", results)
    return PlanTest(False, "at least one check tells a fix from no fix", results)


# --- approvals of `run` checks ---------------------------------------------------------
def _approval_field(digest: str, argv: Sequence[str]) -> str:
    argv_digest = hashlib.sha256(json.dumps(list(argv)).encode("utf-8")).hexdigest()
    return f"{digest}:{argv_digest}"


@dataclass
class Approvals:
    """Approvals of out-of-boundary checks for one finding, kept only in Redis.

    Each approval is bound to the plan digest and the exact argv: a changed plan, a
    changed argv or a different finding is simply not approved. Nothing written into the
    report can approve anything, because this is never read from the report.
    """

    redis: redis.Redis
    repo_id: str
    finding: str
    _key: str = field(init=False)

    def __post_init__(self) -> None:
        self._key = keys.findings_approval(self.repo_id, self.finding)

    def approve(self, checks: Sequence[Check], argv: Sequence[str], *, who: str, at: str) -> None:
        digest = plan_digest(checks)
        if not any(c.kind == "run" and list(c.args) == list(argv) for c in checks):
            raise CheckError(f"argv {list(argv)!r} is not a `run` check of this plan")
        value = json.dumps({"argv": list(argv), "plan": digest, "by": who, "at": at})
        self.redis.hset(self._key, _approval_field(digest, argv), value)

    def is_approved(self, checks: Sequence[Check], argv: Sequence[str]) -> bool:
        digest = plan_digest(checks)
        raw = self.redis.hget(self._key, _approval_field(digest, argv))
        if raw is None:
            return False
        stored = json.loads(raw)
        return stored.get("argv") == list(argv) and stored.get("plan") == digest

    def predicate(self, checks: Sequence[Check]) -> Callable[[Check], bool]:
        """The `approved` callback `run_plan` takes, for this finding's plan."""
        return lambda check: check.kind == "run" and self.is_approved(checks, check.args)

    def revoke_all(self) -> None:
        self.redis.delete(self._key)
