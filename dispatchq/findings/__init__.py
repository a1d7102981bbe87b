"""The decision gate for findings reports, one concept per module.

Pure (text in, text out): `plans` (the verification-plan grammar), `lines` (the grammars of
the lines dispatchq writes), `report` (the Markdown report: parsing, editing, locked
writes), `tokens` (sanitisation of document-derived paths), `prompts` (the untrusted frame
and the sessions' prompts), `contract` (the analyst contract, the sweep's options, the
summary).

With I/O: `boundary` (running a plan's checks; approvals), `pins` (where a finding points,
its pin, attribution), `grading` (observations and the four cases), `record` (the writes
on a finding, tamper evidence, `DecisionRecord`), `kinds` (the built-in session kinds and
their hooks), `fixer` (one fixer attempt inside its job), `terminal`, `settle`, and `gate`
(the orchestrator). Their Redis state is `dispatchq.storage.findings`.
"""

__all__: list[str] = []
