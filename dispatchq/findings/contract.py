"""The decision gate's pure parts: the analyst contract, the sweep's options, the summary.

Nothing here touches Redis, git, a file or a terminal, so each rule is a function of its
inputs and is tested as one (`dispatchq.findings.gate` does the I/O around them):

- **Framing and prompts** are `dispatchq.findings.prompts`.
- **The analyst contract**: what a return must hold to be used (`parse_analysis`), and the
  restater's (`parse_restatement`). A return that fails is not repaired: the finding takes
  the degraded path, visibly.
- **The sweep**: which options a finding gets (`sweep_options`), how an answer is read
  (`parse_choice`), what is always rendered and what is held back (`render_*`), and the
  reject evidence gate's support test (`supported`).
- **The run summary**: every disclosure the stages raise, in one place (`Summary`).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dispatchq.errors import CheckError, ContractError, GrammarError, UnsafeToken
from dispatchq.findings.lines import Decision, one_physical_line, parse_path_line
from dispatchq.findings.plans import GIT_SUBCOMMANDS, Check, Expectation, split_tokens
from dispatchq.findings.prompts import is_feedback_origin, retired_lines
from dispatchq.findings.report import Finding
from dispatchq.findings.tokens import path_tokens, sanitize

__all__ = [
    "ANALYST",
    "ANALYST_BATCH",
    "FIXER",
    "LOCATION_BATCH",
    "RESTATER",
    "Alternative",
    "Candidate",
    "Citation",
    "Claim",
    "Label",
    "Proposal",
    "Summary",
    "announce_analysis",
    "batches",
    "display",
    "indent",
    "options_line",
    "parse_alternative",
    "parse_analysis",
    "parse_check",
    "parse_choice",
    "parse_citation",
    "parse_restatement",
    "render_details",
    "render_evidence",
    "render_header",
    "render_proposal",
    "render_refused",
    "render_retired",
    "render_source",
    "resolution_problem",
    "supported",
    "sweep_options",
    "who_tag",
]

ANALYST = "findings-analyst"
RESTATER = "findings-restater"
FIXER = "findings-fixer"

ANALYST_BATCH = 8  # analysts dispatched together, announced per batch
LOCATION_BATCH = 4  # location questions asked together

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
    rec = value.get("recommendation")
    if not isinstance(rec, Mapping) or rec.get("label") not in [a.label for a in alts]:
        raise ContractError("`recommendation` must name one of the alternatives, with a reason")
    reason = _str(rec, "reason")
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
    candidate = None
    raw_candidate = value.get("rejection_candidate")
    if raw_candidate is not None:
        if not isinstance(raw_candidate, Mapping):
            raise ContractError("`rejection_candidate` must be null or an object")
        citations = raw_candidate.get("citations") or []
        if not isinstance(citations, list):
            raise ContractError("a rejection candidate's citations must be a list")
        why = " ".join(_str(raw_candidate, "reason").split())
        if not why:
            raise ContractError("a rejection candidate needs a reason")
        candidate = Candidate(why, tuple(parse_citation(c) for c in citations))
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


# --- the sweep ------------------------------------------------------------------------------
def sweep_options(alternatives: Sequence[str], *, reject: bool = True, other: bool = True) -> list[str]:
    """The options one finding is offered, in order: `[A] [B] [skip] [reject]`, `[A] [skip]
    [reject]` when A is alone, without reject when its evidence diverged, and `other…`."""
    out = [label for label in ("A", "B") if label in alternatives]
    out.append("skip")
    if reject:
        out.append("reject")
    if other:
        out.append("other")
    return out


_ALIASES = {
    "a": "A",
    "b": "B",
    "s": "skip",
    "skip": "skip",
    "r": "reject",
    "reject": "reject",
    "o": "other",
    "other": "other",
    "other…": "other",
    "other...": "other",
    "d": "details",
    "details": "details",
    "?": "details",
}


def parse_choice(text: str, options: Sequence[str]) -> str | None:
    """The option a person typed, or None when it is not one of `options` (never a guess)."""
    choice = _ALIASES.get(text.strip().lower())
    if choice == "details" or (choice is not None and choice in options):
        return choice
    return None


def options_line(options: Sequence[str]) -> str:
    return " ".join(f"[{'other…' if o == 'other' else o}]" for o in options)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def display(text: str) -> str:
    """Untrusted text made safe to print on a terminal: no escape sequences, no controls."""
    return _CONTROL.sub("?", text)


def indent(text: str, prefix: str = "    ") -> list[str]:
    return [prefix + display(line) for line in (text.rstrip("\n").splitlines() or [""])]


def render_header(finding: Finding, position: int, total: int) -> list[str]:
    return [
        "",
        f"── {finding.id} [{display(finding.severity)}] {display(finding.title)}  ({position} of {total})",
    ]


def render_source(finding: Finding) -> list[str]:
    """The Source row: always rendered, and marked when the block is feedback-origin."""
    value = finding.value("Source")
    if value is None:
        return []
    mark = (
        "  [feedback-origin: a third party's comment, not validated]" if is_feedback_origin(finding) else ""
    )
    return [f"Source: {display(value)}{mark}"]


def render_retired(finding: Finding, own: Collection[str] = ()) -> list[str]:
    """Retired decisions as the person sees them: only those dispatchq's store holds are
    "already tried"; any other `Decision-retired` line is flagged as not dispatchq's."""
    mine, forged = retired_lines(finding, own)
    out = []
    if mine:
        out += ["Retired decisions (already tried):", *(f"  - {display(v)}" for v in mine)]
    if forged:
        out += [
            "Decision-retired lines NOT written by dispatchq (the block author's text, ignored):",
            *(f"  ! {display(v)}" for v in forged),
        ]
    return out


def render_proposal(proposal: Proposal) -> list[str]:
    """The always-rendered class: Target, Recommendation, Risk, both Alternatives in full,
    Code Preview, and the claims behind the analysis (their command output is held back)."""
    out = []
    if proposal.degraded:
        out.append("No code analysis: the alternatives below restate the Remediation; confirm one to use it")
    if proposal.target:
        out.append(f"Target: {display(proposal.target)}")
    if proposal.claims:
        out.append("Findings:")
        out.extend(f"  - {display(c.claim)}" for c in proposal.claims)
    out.append("Alternatives:")
    for alt in proposal.alternatives:
        recommended = proposal.recommendation is not None and proposal.recommendation[0] == alt.label
        out.append(f"  {alt.label}{' (recommended)' if recommended else ''}: {display(alt.resolution)}")
    if proposal.a_alone:
        why = f": {display(proposal.a_alone_reason)}" if proposal.a_alone_reason else ""
        out.append(f"  (A alone{why})")
    who = "restater" if proposal.degraded else "analyst"
    for alt in proposal.alternatives:
        out.extend(render_refused(alt, who))
    if proposal.recommendation is not None:
        out.append(f"Recommendation: {proposal.recommendation[0]} — {display(proposal.recommendation[1])}")
    if proposal.risk:
        out.append(f"Risk: {display(proposal.risk)}")
    if proposal.code_preview:
        out.append("Code preview:")
        out.extend(indent(proposal.code_preview))
    return out


def render_refused(alt: Alternative, who: str) -> list[str]:
    """The checks of `alt` the check grammar refused: the session's error, each dropped from
    the plan alone (the rest of its answer stands), and said so, never silently."""
    if not alt.refused:
        return []
    n = len(alt.refused)
    out = [
        f"  {alt.label}: {n} check{'s' if n != 1 else ''} the {who} wrote "
        f"{'are' if n != 1 else 'is'} refused by the check grammar and dropped from the plan "
        f"(the {who}'s error):"
    ]
    out.extend(f"    ! {display(text)} ({display(why)})" for text, why in alt.refused)
    return out


def render_details(proposal: Proposal) -> list[str]:
    """The held-back class: the command output behind each claim, and every plan."""
    out = ["Evidence behind the findings:"]
    for claim in proposal.claims:
        out.append(f"  - {display(claim.claim)}")
        for command, output in claim.evidence:
            out.append(f"    $ {display(command)}")
            out.extend(indent(output or "(no output)", "      "))
    for alt in proposal.alternatives:
        out.append(f"Verification plan for {alt.label}:")
        if not alt.plan:
            out.append("    (none)")
        for index, check in enumerate(alt.plan):
            flag = "  [fails only because the edit's text is absent]" if index in alt.absent_text_only else ""
            where = "" if check.inside_boundary else "  [outside the boundary: needs your approval]"
            out.append(f"    {display(check.text)}{where}{flag}")
    return out


def render_evidence(rows: Sequence[tuple[Citation, str | None, bool | None]]) -> list[str]:
    """The reject evidence gate's re-run, never held back: per citation the fresh output,
    side by side with the recording where they diverge, or why it was not executed."""
    out = []
    for citation, fresh, ok in rows:
        out.append(f"  $ {display(citation.command)}")
        if citation.check is None or fresh is None:
            out.append(f"    [not executed: {citation.outside or 'outside the execution boundary'}]")
            out.append("    recorded:")
            out.extend(indent(citation.recorded or "(empty)", "      "))
            continue
        if ok:
            out.append("    re-run output (supports the recording):")
            out.extend(indent(fresh or "(empty)", "      "))
        else:
            out.append("    DIVERGES — recorded | fresh:")
            rec = (citation.recorded or "(empty)").splitlines()
            new = (fresh or "(empty)").splitlines()
            width = max((len(display(r)) for r in rec), default=0)
            for index in range(max(len(rec), len(new))):
                left = display(rec[index]) if index < len(rec) else ""
                right = display(new[index]) if index < len(new) else ""
                out.append(f"      {left.ljust(width)} | {right}")
    return out


# --- the run summary ------------------------------------------------------------------------
@dataclass
class Summary:
    """Everything a run must disclose, gathered from every stage (and every fixer job)."""

    fixed: list[str] = field(default_factory=list)
    partially_fixed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    unverified: list[tuple[str, str]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    unobservable: list[str] = field(default_factory=list)
    unpinned: list[tuple[str, str]] = field(default_factory=list)
    unpinnable: list[tuple[str, str, str]] = field(default_factory=list)
    out_of_scope: list[tuple[str, list[str]]] = field(default_factory=list)
    advisory: list[str] = field(default_factory=list)
    coverage: list[tuple[str, list[str]]] = field(default_factory=list)
    unavailable: list[tuple[str, str]] = field(default_factory=list)
    stalled: list[tuple[str, list[str]]] = field(default_factory=list)
    decided: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    set_aside: list[tuple[str, str]] = field(default_factory=list)
    interrupted: list[tuple[str, int]] = field(default_factory=list)
    waiting: list[tuple[str, str]] = field(default_factory=list)
    tampered: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    undecided: int = 0
    aborted: str | None = None

    HEADINGS: tuple[tuple[str, str], ...] = (
        ("fixed", "fixed"),
        ("partially_fixed", "partially fixed"),
        ("failed", "failed"),
        ("unverified", "unverified"),
        ("unobservable", "unobservable"),
        ("unpinned", "unpinned"),
        ("unpinnable", "unpinnable"),
        ("out_of_scope", "out-of-scope writes"),
        ("advisory", "advisory verification"),
        ("coverage", "coverage warnings"),
        ("unavailable", "verification: unavailable"),
        ("stalled", "stalled — no progress"),
        ("rejected", "rejected"),
        ("decided", "decided this run"),
        ("skipped", "skipped (offered again next run)"),
        ("retired", "decisions retired after two attempts"),
        ("set_aside", "set aside for a second sweep"),
        ("interrupted", "dispatched, outcome unknown: verified, then recorded"),
        ("waiting", "waiting"),
        ("tampered", "lines dispatchq wrote were changed by someone else"),
    )

    def add_unique(self, name: str, item: Any) -> None:
        items = getattr(self, name)
        if item not in items:
            items.append(item)

    def account(self, fid: str, attempt: int, outcome: Mapping[str, Any]) -> str | None:
        """Fold one fixer attempt's outcome in; "again" when it needs a new attempt,
        "set-aside" when the finding goes to a second sweep."""
        kind = outcome.get("outcome")
        s = self
        if kind == "set-aside":
            s.set_aside.append((fid, str(outcome.get("why", ""))))
            if outcome.get("tampered"):
                s.add_unique("tampered", (fid, str(outcome.get("why", ""))))
            return "set-aside"
        if kind == "interrupted":
            s.interrupted.append((fid, attempt))
            if outcome.get("retired"):
                s.retired.append(fid)
                return None
            return "again"
        if kind == "error":
            s.failed.append((fid, f"attempt {attempt}: the fixer job failed: {outcome.get('why')}"))
            return None
        if kind != "graded":
            s.notes.append(f"{fid}: attempt {attempt}: {kind}")
            return None
        g = outcome.get("grade") or {}
        case = g.get("case")
        if case == "fixed":
            s.fixed.append(fid)
        elif case == "partially-fixed":
            s.partially_fixed.append(fid)
        elif case == "failed":
            s.failed.append((fid, f"attempt {attempt}: failed"))
        else:
            s.unavailable.append(
                (fid, f"attempt {attempt}: dispatched, unverified ({g.get('verification')})")
            )
        if g.get("unobservable"):
            s.unobservable.append(fid)
        if g.get("advisory") and case == "fixed":
            s.advisory.append(fid)
        if g.get("out_of_scope"):
            s.out_of_scope.append((fid, list(g["out_of_scope"])))
        if g.get("coverage_warning"):
            s.coverage.append((fid, [str(g.get("verification"))]))
        if outcome.get("unpinned"):
            s.add_unique("unpinned", (fid, "no Decision-pin line: graded by the re-derived expected set"))
        for path, why in outcome.get("unpinnable") or []:
            s.add_unique("unpinnable", (fid, path, why))
        if outcome.get("retired"):
            s.retired.append(fid)
        return None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for name, _ in self.HEADINGS:
            items = getattr(self, name)
            data[name] = [list(i) if isinstance(i, tuple) else i for i in items]
        data["undecided"] = self.undecided
        data["aborted"] = self.aborted
        data["notes"] = list(self.notes)
        return data

    def lines(self) -> list[str]:
        out = ["", "Run summary:"]
        if self.aborted:
            out.append(f"  ABORTED: {self.aborted}")
        for name, heading in self.HEADINGS:
            items = getattr(self, name)
            if not items:
                continue
            out.append(f"  {heading}:")
            for item in items:
                out.append(f"    - {_item_text(name, item)}")
        if self.undecided:
            out.append(f"  left undecided: {self.undecided}")
        out.extend(f"  note: {display(n)}" for n in self.notes)
        if len(out) == 2:
            out.append("  nothing to do")
        return out


def _item_text(name: str, item: Any) -> str:
    if isinstance(item, str):
        return display(item)
    if name == "unpinnable":
        fid, path, why = item
        return f"{fid}: {display(path)} ({display(why)})"
    if name == "stalled":
        fid, resolutions = item
        both = " | ".join(display(r) for r in resolutions)
        return f"{fid}: tried {both}"
    if name == "interrupted":
        return f"{item[0]}: attempt {item[1]}"
    fid, detail = item
    if isinstance(detail, list):
        detail = ", ".join(display(str(d)) for d in detail)
    return f"{fid}: {display(str(detail))}"


def batches(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def announce_analysis(count: int) -> str:
    """`13 findings to analyse, in 2 batches of at most 8`, stated before anything is dispatched."""
    n = -(-count // ANALYST_BATCH)
    noun = "finding" if count == 1 else "findings"
    return f"{count} {noun} to analyse, in {n} batch{'es' if n != 1 else ''} of at most {ANALYST_BATCH}"


def who_tag(name: str) -> str:
    """The person's name as the Decision line's grammar allows it."""
    clean = re.sub(r"[^A-Za-z0-9._@-]", "", name)
    return clean or "user"
