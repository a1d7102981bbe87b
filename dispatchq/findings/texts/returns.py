"""What the gate's read-only sessions must return to be used: the analyst's and the restater's.

A return is validated here and never repaired: one that breaks a rule raises ContractError
naming the first rule it breaks, and the finding takes the degraded path, visibly. The
rules are functions of the return alone (no Redis, git, file or terminal), so each is
tested as one:

- **The analyst's return** (`parse_analysis`): a target, A (and B, or A said to be alone),
  a recommendation, the claims behind them, and perhaps a rejection candidate whose cited
  commands dispatchq re-runs (`parse_citation`, and the support test, `supported`).
- **The restater's return** (`parse_restatement`): a person's `other…` or a Remediation
  restated self-containedly, never the Remediation copied.
- **A resolution** (`resolution_problem`, `parse_alternative`): one line a fixer can act on
  and the Decision line's grammar keeps, with its verification plan (`parse_check`).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dispatchq.errors import CheckError, ContractError, GrammarError, UnsafeToken
from dispatchq.findings.grammar.lines import Decision, one_physical_line, parse_path_line
from dispatchq.findings.grammar.plans import GIT_SUBCOMMANDS, Check, Expectation, split_tokens
from dispatchq.findings.grammar.tokens import path_tokens, sanitize

__all__ = [
    "ANALYST",
    "FIXER",
    "RESTATER",
    "Alternative",
    "Candidate",
    "Citation",
    "Claim",
    "Label",
    "Proposal",
    "parse_alternative",
    "parse_analysis",
    "parse_check",
    "parse_citation",
    "parse_restatement",
    "resolution_problem",
    "supported",
]

ANALYST = "findings-analyst"
RESTATER = "findings-restater"
FIXER = "findings-fixer"

Label = Literal["A", "B", "other"]


# --- the contract ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Alternative:
    """One resolution a person may choose, with its plan and the roles of its paths."""

    label: Label
    resolution: str
    roles: Mapping[str, str]
    plan: tuple[Check, ...] = ()
    absent_text_only: frozenset[int] = frozenset()
    #: Checks the session wrote that the check grammar refuses, as (what it wrote, why):
    #: dropped from the plan one by one (never the whole return), and shown at the sweep.
    refused: tuple[tuple[str, str], ...] = ()

    @property
    def outside(self) -> list[Check]:
        return [c for c in self.plan if not c.inside_boundary]


@dataclass(frozen=True)
class Citation:
    """A command an analyst cited with the output it recorded.

    `check` is set when dispatchq can re-run it inside the boundary; otherwise `outside`
    says why it is displayed unexecuted.
    """

    command: str
    recorded: str
    check: Check | None
    outside: str | None = None


@dataclass(frozen=True)
class Candidate:
    reason: str
    citations: tuple[Citation, ...]


@dataclass(frozen=True)
class Claim:
    claim: str
    evidence: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Proposal:
    """What the sweep renders for one finding (an analyst's return, or a degraded restatement)."""

    target: str | None
    alternatives: tuple[Alternative, ...]
    claims: tuple[Claim, ...] = ()
    a_alone: bool = False
    a_alone_reason: str = ""
    recommendation: tuple[str, str] | None = None
    risk: str = ""
    code_preview: str = ""
    candidate: Candidate | None = None
    degraded: bool = False

    def alternative(self, label: str) -> Alternative | None:
        return next((a for a in self.alternatives if a.label == label), None)


_PLACEHOLDER = re.compile(r"\bresolve\b.{0,20}\bdifferently\b|\bdo something else\b", re.IGNORECASE)
_BACKREF = re.compile(
    r"\b(?:the|its|this) remediation\b|\bas (?:described|stated|suggested) (?:above|in the)\b"
    r"|\bthe other (?:alternative|option)\b|\b(?:alternative|option) [AB]\b",
    re.IGNORECASE,
)


def resolution_problem(text: Any) -> str | None:
    """Why a resolution cannot be dispatched as `User decision:`, or None.

    One physical line that survives the Decision line's grammar, naming at least one path,
    neither a placeholder nor a back-reference to text the fixer never sees.
    """
    if not isinstance(text, str) or not text.strip():
        return "the resolution is empty"
    if not one_physical_line(text):
        return "the resolution spans more than one line"
    if len(text) > 2000:
        return "the resolution is longer than 2000 characters"
    if _PLACEHOLDER.search(text):
        return "the resolution is a placeholder, not a direction a fixer can act on"
    if _BACKREF.search(text):
        return "the resolution refers back to the Remediation or another alternative"
    try:
        decision = Decision("A", text.strip(), "check", dt.date(2000, 1, 1))
        if Decision.parse(decision.format()).resolution != text.strip():
            return "the resolution does not survive the Decision line's grammar"
    except GrammarError as error:
        return f"the resolution does not fit a Decision line: {error}"
    if not path_tokens(text):
        return "the resolution names no file"
    return None


def _str(data: Mapping[str, Any], key: str, *, required: bool = True) -> str:
    value = data.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise ContractError(f"`{key}` must be a string")
    return value


def parse_check(raw: Any) -> tuple[Check, bool]:
    """A check from its structured form or its one-line form; (check, absent_text_only)."""
    try:
        if isinstance(raw, str):
            return Check.parse(raw.strip(), canonical=False), False
        if isinstance(raw, Mapping):
            absent = raw.get("absent_text_only", False)
            if not isinstance(absent, bool):
                raise ContractError("`absent_text_only` must be true or false")
            return Check.from_json(raw), absent
    except CheckError as error:
        raise ContractError(f"verification check: {error}") from None
    raise ContractError("a verification check must be an object or one line of text")


def _roles(raw: Any, resolution: str) -> dict[str, str]:
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ContractError("`paths` must be a list")
    named = {_strip_line(t) for t in path_tokens(resolution)}
    roles: dict[str, str] = {}
    for item in raw:
        if not isinstance(item, Mapping):
            raise ContractError("each `paths` entry must be an object with path and role")
        path, role = item.get("path"), item.get("role")
        if not isinstance(path, str) or role not in ("edit", "ref"):
            raise ContractError("each `paths` entry needs a path and a role of edit or ref")
        try:
            clean = sanitize(path)
        except UnsafeToken:
            continue  # pinned as unpinnable from the resolution text, never escaped
        if clean not in named:
            raise ContractError(f"path {clean} is in `paths` but the resolution does not name it")
        roles[clean] = role
    return roles


def _strip_line(token: str) -> str:
    return re.sub(r":\d+(?:-\d+)?$", "", token)


def parse_alternative(raw: Any, *, label: str | None = None) -> Alternative:
    """One alternative of a return, validated (resolution, paths, plan)."""
    if not isinstance(raw, Mapping):
        raise ContractError("an alternative must be an object")
    got = raw.get("label", label)
    if label is not None and got != label:
        raise ContractError(f"expected alternative {label}, got {got!r}")
    if got not in ("A", "B", "other"):
        raise ContractError(f"alternative label {got!r} is not A, B or other")
    resolution = raw.get("resolution")
    problem = resolution_problem(resolution)
    if problem:
        raise ContractError(f"alternative {got}: {problem}")
    assert isinstance(resolution, str)
    resolution = resolution.strip()
    plan_raw = raw.get("verification_plan", raw.get("plan", []))
    if plan_raw is None:
        plan_raw = []
    if not isinstance(plan_raw, list):
        raise ContractError(f"alternative {got}: `verification_plan` must be a list")
    checks: list[Check] = []
    absent: set[int] = set()
    refused: list[tuple[str, str]] = []
    for item in plan_raw:
        try:
            check, flag = parse_check(item)
        except ContractError as error:
            refused.append((_shown(item), str(error).removeprefix("verification check: ")))
            continue
        if flag:
            absent.add(len(checks))
        checks.append(check)
    return Alternative(
        got,
        resolution,
        _roles(raw.get("paths"), resolution),
        tuple(checks),
        frozenset(absent),
        tuple(refused),
    )


def _shown(item: Any) -> str:
    """A refused check as the session wrote it, on one line and bounded."""
    text = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False, default=str)
    text = " ".join(str(text).split())
    return text if len(text) <= 200 else text[:199] + "…"


def parse_citation(raw: Any) -> Citation:
    """A cited command: re-runnable inside the boundary, or displayed unexecuted."""
    if not isinstance(raw, Mapping):
        raise ContractError("a citation must be an object with command and output")
    recorded = raw.get("output", "")
    if not isinstance(recorded, str):
        raise ContractError("a citation's output must be a string")
    command = raw.get("command")
    if isinstance(command, Mapping):
        kind, args = command.get("kind"), command.get("args", [])
    elif isinstance(raw.get("kind"), str):
        kind, args = raw.get("kind"), raw.get("args", [])
    elif isinstance(command, str):
        try:
            tokens = split_tokens(command.strip())
        except CheckError:
            tokens = command.split()
        kind, args = (tokens[0] if tokens else ""), tokens[1:]
    else:
        raise ContractError("a citation needs a command")
    if not isinstance(args, list | tuple) or not all(isinstance(a, str) for a in args):
        raise ContractError("a citation's args must be a list of strings")
    shown = command if isinstance(command, str) else " ".join([str(kind), *args])
    if kind not in ("read", "grep", "glob", "git"):
        return Citation(shown, recorded, None, "outside the execution boundary")
    if kind == "git" and (not args or args[0] not in GIT_SUBCOMMANDS):
        return Citation(shown, recorded, None, "a git subcommand outside the execution boundary")
    try:
        check = Check(kind, tuple(args), Expectation("empty"))
    except CheckError as error:
        return Citation(shown, recorded, None, f"not a check dispatchq can run: {error}")
    return Citation(shown, recorded, check)


def parse_analysis(value: Any) -> Proposal:
    """Validate an analyst's return; ContractError says the first rule it breaks."""
    if not isinstance(value, Mapping):
        raise ContractError("the return is not a JSON object")
    target = _str(value, "target")
    if parse_path_line(target.strip().strip("`")) is None:
        raise ContractError(f"target {target!r} is not path:line or path:line-line")
    alts, a_alone = _alternatives(value)
    rec = value.get("recommendation")
    if not isinstance(rec, Mapping) or rec.get("label") not in [a.label for a in alts]:
        raise ContractError("`recommendation` must name one of the alternatives, with a reason")
    reason = _str(rec, "reason")
    claims = _claims(value)
    candidate = _candidate(value.get("rejection_candidate"))
    return Proposal(
        target=target.strip().strip("`"),
        alternatives=tuple(alts),
        claims=tuple(claims),
        a_alone=a_alone,
        a_alone_reason=_str(value, "a_alone_reason", required=False),
        recommendation=(str(rec["label"]), reason),
        risk=_str(value, "risk", required=False),
        code_preview=_str(value, "code_preview", required=False),
        candidate=candidate,
    )


def _alternatives(value: Mapping[str, Any]) -> tuple[list[Alternative], bool]:
    """A, and B unless A is said to be alone (`a_alone`), and never the same resolution twice."""
    raw_alts = value.get("alternatives")
    if not isinstance(raw_alts, list) or not 1 <= len(raw_alts) <= 2:
        raise ContractError("`alternatives` must hold A, and optionally B")
    alts = [parse_alternative(raw, label=label) for raw, label in zip(raw_alts, ("A", "B"), strict=False)]
    a_alone = value.get("a_alone", False)
    if not isinstance(a_alone, bool):
        raise ContractError("`a_alone` must be true or false")
    if len(alts) == 1 and not a_alone:
        raise ContractError("A returned without B must be said to be alone (`a_alone: true`)")
    if len(alts) == 2 and a_alone:
        raise ContractError("`a_alone` is true but B was returned")
    if len(alts) == 2 and alts[0].resolution == alts[1].resolution:
        raise ContractError("A and B are the same resolution")
    return alts, a_alone


def _claims(value: Mapping[str, Any]) -> list[Claim]:
    """The analysis's claims, each with the commands and output behind it."""
    claims = []
    raw_claims = value.get("findings", [])
    if not isinstance(raw_claims, list):
        raise ContractError("`findings` must be a list")
    for item in raw_claims:
        if not isinstance(item, Mapping):
            raise ContractError("each finding must be an object with a claim")
        evidence = []
        for ev in item.get("evidence") or []:
            if not isinstance(ev, Mapping):
                raise ContractError("evidence must be objects with command and output")
            evidence.append((_str(ev, "command"), _str(ev, "output", required=False)))
        claims.append(Claim(_str(item, "claim"), tuple(evidence)))
    return claims


def _candidate(raw_candidate: Any) -> Candidate | None:
    """The rejection candidate, if any: a reason and the citations dispatchq re-runs."""
    if raw_candidate is None:
        return None
    if not isinstance(raw_candidate, Mapping):
        raise ContractError("`rejection_candidate` must be null or an object")
    citations = raw_candidate.get("citations") or []
    if not isinstance(citations, list):
        raise ContractError("a rejection candidate's citations must be a list")
    why = " ".join(_str(raw_candidate, "reason").split())
    if not why:
        raise ContractError("a rejection candidate needs a reason")
    return Candidate(why, tuple(parse_citation(c) for c in citations))


def parse_restatement(value: Any, *, mode: str, remediation: str = "") -> tuple[Alternative, ...]:
    """Validate a restater's return. `other` gives one alternative labelled `other`; a
    Remediation restatement gives A (and B) and is refused when it copies the Remediation."""
    if not isinstance(value, Mapping):
        raise ContractError("the return is not a JSON object")
    why = value.get("unrestatable")
    raw = value.get("restated") or []
    if why:
        raise ContractError(f"cannot be restated self-containedly: {why}")
    if not isinstance(raw, list) or not raw:
        raise ContractError("nothing was restated")
    if mode == "other":
        if len(raw) != 1:
            raise ContractError("an other… answer restates to exactly one resolution")
        return (parse_alternative(raw[0], label="other"),)
    if len(raw) > 2:
        raise ContractError("a Remediation restates to A, and at most B")
    alts = tuple(parse_alternative(r, label=label) for r, label in zip(raw, ("A", "B"), strict=False))
    verbatim = " ".join(remediation.split()).lower()
    for alt in alts:
        if verbatim and " ".join(alt.resolution.split()).lower() == verbatim:
            raise ContractError(f"alternative {alt.label} copies the Remediation verbatim")
    return alts


# --- the reject evidence gate ---------------------------------------------------------------
def supported(recorded: str, output: str, *, ran: bool, error: str | None) -> bool:
    """The support test, stated once: the re-run exits without error, and its fresh output
    contains verbatim every non-empty line the analyst recorded; an empty recording is
    matched by emptiness, never by containment."""
    if not ran or error:
        return False
    lines = [line.rstrip("\r") for line in recorded.splitlines() if line.strip()]
    if not lines:
        return output.strip() == ""
    return all(line in output for line in lines)
