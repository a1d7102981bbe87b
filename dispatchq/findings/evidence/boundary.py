"""The execution boundary: running a verification plan, and approving what lies outside it.

A plan is written by an analyst session, persisted as one report line, and executed by
dispatchq after a fixer ran. The fixer can edit the report and the tree, so nothing in
a plan may be able to do more than *read the repository*: that is the boundary. (The
plan's grammar, pure text, is `dispatchq.findings.grammar.plans`.)

Inside it, with no approval, run only dispatchq's own `read`, `grep` and `glob` (Python,
no shell, paths contained in the repository) and five read-only git subcommands with
options from an allow-list. Everything else is a `run` check: an argv list that runs
only when a person approved that exact argv for that finding and that plan, and the
approval lives in dispatchq's store, never in the report.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dispatchq.errors import CheckError, RegexTimeout
from dispatchq.findings.grammar.plans import (
    Check,
    Expectation,
    PathProbe,
    grep_split,
    parse_git_args,
    plan_digest,
    read_target,
    syntactic_path_problem,
)
from dispatchq.git import runner as git
from dispatchq.launcher.environment import child_environment
from dispatchq.settings import parent_environment
from dispatchq.storage.findings import FindingsStore

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_GIT_TIMEOUT",
    "DEFAULT_REGEX_TIMEOUT",
    "DEFAULT_RUN_TIMEOUT",
    "Approvals",
    "CheckResult",
    "Containment",
    "PlanResult",
    "PlanTest",
    "contain",
    "exists_in",
    "glob_regex",
    "meets",
    "plan_rejection",
    "regex_search",
    "run_check",
    "run_plan",
]

DEFAULT_REGEX_TIMEOUT = 10.0
DEFAULT_GIT_TIMEOUT = git.DEFAULT_GIT_TIMEOUT
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


def exists_in(root: Path | str) -> PathProbe:
    """The grammar's path probe for a checkout: does this token name something in the tree?"""
    return lambda token: os.path.lexists(Path(root, token))


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
            env=child_environment(parent_environment()),
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
    flags, rest = grep_split(check.args)
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
        parsed = parse_git_args(check.args, exists_in(root))
    except CheckError as error:
        return _not_run(check, str(error))
    for path in parsed.paths:
        verdict = contain(root, path)
        if not verdict.ok:
            return _not_run(check, f"path {path} refused ({verdict.why})")
    try:
        done = git.run(root, parsed.subcommand_argv(), timeout=git_timeout)
    except FileNotFoundError:
        return _not_run(check, "git is not installed")
    except subprocess.TimeoutExpired:
        return _not_run(check, f"git timed out after {git_timeout:g}s")
    stderr = done.stderr.decode("utf-8", "replace").strip() or None
    if done.returncode != 0:
        stderr = f"exit status {done.returncode}" + (f": {stderr}" if stderr else "")
    return _finish(check, done.stdout.decode("utf-8", "replace"), stderr, timeout)


def _run_run(check: Check, root: Path, timeout: float, run_timeout: float) -> CheckResult:
    try:
        done = subprocess.run(
            list(check.args),
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_environment(parent_environment()),
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


def _never(_check: Check) -> bool:
    return False


def run_plan(
    checks: Sequence[Check],
    root: Path | str,
    *,
    approved: Callable[[Check], bool] = _never,
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
    #: In-boundary checks the boundary refused on the unedited tree (a path escaping it,
    #: git internals, a regex over its time limit): they will not run after the fix either.
    refused: tuple[CheckResult, ...] = ()


def plan_rejection(
    checks: Sequence[Check],
    root: Path | str,
    *,
    absent_text_only: Collection[int] = (),
    **timeouts: float,
) -> PlanTest:
    """Run a plan's in-boundary checks on the unedited tree and judge the plan.

    A check is useless as evidence when it already passes now, when the boundary refuses
    it (it cannot run after the fix either), or when the analyst marked it (by index in
    `absent_text_only`) as failing only because the edit's own text is absent. The plan is
    rejected when every check is useless; the refused ones are named either way. An
    unmarked `run` check cannot be tested here, so a plan holding one is never rejected by
    this test.
    """
    if not checks:
        return PlanTest(True, "empty plan")
    inside = [c for i, c in enumerate(checks) if c.inside_boundary and i not in absent_text_only]
    results = run_plan(inside, root, approved=_never, inside_only=True, **timeouts)
    refused = tuple(r for r in results.results if not r.ran)
    by_check = iter(results.results)
    useless: list[bool] = []
    passing = 0
    for index, check in enumerate(checks):
        if index in absent_text_only:
            useless.append(True)
        elif not check.inside_boundary:
            useless.append(False)
        else:
            result = next(by_check)
            passing += result.ran and result.passed
            useless.append(not result.ran or result.passed)
    if all(useless):
        if all(i in absent_text_only for i in range(len(checks))):
            why = "every check fails only because the edit's text is absent"
        elif len(refused) == len(checks):
            why = "the execution boundary refuses every check"
        elif not refused:
            why = "every check already passes on the unedited tree"
        else:
            why = (
                f"no check tells a fix from no fix ({passing} already pass on the unedited tree, "
                f"{len(refused)} refused by the execution boundary)"
            )
        return PlanTest(True, why, results, refused)
    if not inside and not absent_text_only:
        return PlanTest(False, "no in-boundary check: not testable on the unedited tree", results)
    return PlanTest(False, "at least one check tells a fix from no fix", results, refused)


# --- approvals of `run` checks ---------------------------------------------------------
def _approval_field(digest: str, argv: Sequence[str]) -> str:
    argv_digest = hashlib.sha256(json.dumps(list(argv)).encode("utf-8")).hexdigest()
    return f"{digest}:{argv_digest}"


@dataclass
class Approvals:
    """Approvals of out-of-boundary checks for one finding, kept only in Redis.

    Each approval is bound to the plan digest and the exact argv: a changed plan, a
    changed argv or a different finding is simply not approved. Nothing written into the
    report can approve anything, because this is never read from the report. The Redis
    operations are the findings area's (`runtime.storage.findings`).
    """

    store: FindingsStore
    repo_id: str
    finding: str

    def approve(self, checks: Sequence[Check], argv: Sequence[str], *, who: str, at: str) -> None:
        digest = plan_digest(checks)
        if not any(c.kind == "run" and list(c.args) == list(argv) for c in checks):
            raise CheckError(f"argv {list(argv)!r} is not a `run` check of this plan")
        value = json.dumps({"argv": list(argv), "plan": digest, "by": who, "at": at})
        self.store.save_approval(self.repo_id, self.finding, _approval_field(digest, argv), value)

    def is_approved(self, checks: Sequence[Check], argv: Sequence[str]) -> bool:
        digest = plan_digest(checks)
        raw = self.store.approval(self.repo_id, self.finding, _approval_field(digest, argv))
        if raw is None:
            return False
        stored = json.loads(raw)
        return stored.get("argv") == list(argv) and stored.get("plan") == digest

    def predicate(self, checks: Sequence[Check]) -> Callable[[Check], bool]:
        """The `approved` callback `run_plan` takes, for this finding's plan."""
        return lambda check: check.kind == "run" and self.is_approved(checks, check.args)

    def revoke_all(self) -> None:
        self.store.revoke_approvals(self.repo_id, self.finding)
