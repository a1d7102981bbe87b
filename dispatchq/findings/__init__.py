"""The decision gate for findings reports, in four rooms that import one way only.

- `grammar` (pure): the report and the lines dispatchq writes in it — `lines`, `plans` (the
  verification-plan grammar), `report` (the Markdown report: parsing, editing, locked
  writes), `tokens` (sanitisation of document-derived paths).
- `texts` (pure): what the gate says and reads — `prompts` (the untrusted frame and the
  sessions' prompts), `returns` (what an analyst's or restater's return must hold),
  `screens` (what a person sees and types at the sweep), `summary` (the run summary).
- `evidence` (reads and writes the world): `boundary` (running a plan's checks;
  approvals), `pins` (where a finding points, its pin, attribution), `grading`
  (observations and the four cases), `record` (the writes on a finding, tamper evidence,
  `DecisionRecord`). Their Redis state is `dispatchq.storage.findings`.
- `run` (the orchestration): `gate` and its stages (`locate`, `analysis`, `sweep`,
  `decision`, `dispatch`) over a `context`, `sessions`, `kinds` (the built-in session kinds
  and their hooks), `fixer` (one fixer attempt inside its job), `settle`, `terminal`.

run > texts | evidence > grammar (pyproject's import-linter contract holds it).
"""

__all__: list[str] = []
