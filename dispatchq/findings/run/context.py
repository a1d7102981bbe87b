"""What every stage of the gate reads and writes: one findings report in one checkout.

The stages (`locate`, `analysis`, `sweep`, `dispatch`) are functions of a `GateContext`
rather than methods of one class, so each is read on its own; `Gate` is this context plus
the order the stages run in.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dispatchq.client import Client
from dispatchq.errors import UserError
from dispatchq.findings.evidence.pins import repo_id
from dispatchq.findings.evidence.record import (
    DecisionRecord,
    RecordStore,
    report_lock_dir,
    stalled_resolutions,
)
from dispatchq.findings.grammar.lines import RETIRED, STATUS
from dispatchq.findings.grammar.report import Finding
from dispatchq.findings.run.terminal import Terminal
from dispatchq.findings.texts.screens import who_tag
from dispatchq.findings.texts.summary import Summary

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

__all__ = ["GateContext"]


def _user() -> str:
    """Who answers at this terminal (recorded on the Decision line as its provenance)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "user"


@dataclass
class GateContext:
    """One findings report in one checkout: its record, the person's terminal (None when
    nobody may be asked), where progress is said, and the summary every stage adds to."""

    runtime: Runtime
    report: Path
    root: Path
    terminal: Terminal | None = None
    out: Callable[[str], None] = print
    summary: Summary = field(default_factory=Summary)

    def __post_init__(self) -> None:
        self.report = Path(os.path.realpath(self.report))
        self.root = Path(os.path.realpath(self.root))
        self.record = DecisionRecord(
            self.report,
            self.root,
            RecordStore(self.runtime.storage.findings, self.root),
            lock_dir=report_lock_dir(self.runtime.settings.data_dir),
        )
        self.repo = repo_id(self.root)
        self.today = dt.date.today()
        self.who = who_tag(_user())
        parsed = self.record.read()
        if parsed.problems:
            where = "; ".join(f"line {p.line}: {p.message}" for p in parsed.problems)
            raise UserError(f"{self.report}: the report does not parse: {where}")
        self.status_at_start = {f.id: f.value(STATUS) for f in parsed.findings}
        self.client = Client(runtime=self.runtime)

    @property
    def person(self) -> Terminal:
        """The terminal, for the stages that ask; only reached once one is known to exist."""
        assert self.terminal is not None
        return self.terminal

    # --- selection ---------------------------------------------------------------------------
    def undecided(self, only: Iterable[str] | None = None) -> list[Finding]:
        """needs-decision findings without a live decision or a terminal status."""
        wanted = set(only) if only is not None else None
        return [
            f
            for f in self.record.read().findings
            if f.needs_decision
            and not f.terminal
            and f.value("Decision") is None
            and (wanted is None or f.id in wanted)
        ]

    def decided(self, only: Iterable[str] | None = None) -> list[Finding]:
        wanted = set(only) if only is not None else None
        return [
            f
            for f in self.record.read().findings
            if f.value("Decision") is not None and not f.terminal and (wanted is None or f.id in wanted)
        ]

    def own_retired(self, finding: Finding) -> set[str]:
        """The `Decision-retired` values dispatchq's store holds for this finding: the only
        retired decisions that are dispatchq's own (any other is the author's text)."""
        assert self.record.store is not None
        written = self.record.store.written(self.record.ref(finding.id)) or []
        return {value for name, value in written if name == RETIRED}

    def finish(self) -> None:
        """Every finding whose two decisions were tried and retired goes into the summary."""
        for finding in self.record.read().findings:
            both = stalled_resolutions(finding)
            if both:
                self.summary.add_unique("stalled", (finding.id, both))
