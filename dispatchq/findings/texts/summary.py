"""The run summary: every disclosure the gate's stages (and every fixer job) raise, in one place.

Pure: the stages add to a `Summary`, `account` folds in one fixer attempt's outcome, and
`lines`/`to_json` render it for the terminal or `--json`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatchq.findings.texts.screens import display

__all__ = ["Summary"]


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
        self._account_graded(fid, attempt, outcome)
        return None

    def _account_graded(self, fid: str, attempt: int, outcome: Mapping[str, Any]) -> None:
        """A graded attempt: its case, what the grading disclosed, its pin, its retirement."""
        s = self
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
