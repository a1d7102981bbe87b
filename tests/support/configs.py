"""Configs the small integration tests and their fixtures (tests/integration/conftest.py) start from."""

from __future__ import annotations

__all__ = ["ID_PREFIX_CONFIG", "INTEGRATION_CONFIG"]


ID_PREFIX_CONFIG = """
kinds:
  ask:
    questions:
      yes: {type: noul, instructions: "Does this comment ask for a change?"}
    answer: yes
    escalate: needs-triage
"""


INTEGRATION_CONFIG = """
kinds:
  lock:
    check: {check}
  lock-then-typed:
    check: {check}
    questions:
      ok: {{type: noul, instructions: "Is it fine?"}}
    answer: ok
    escalate: needs-triage
  lock-then-session:
    check: {check}
    questions:
      ok: {{type: noul, instructions: "Is it fine?"}}
    answer: ok
    session:
      prompt: "Decide {{{{ target }}}} given {{{{ state }}}}"
  typed-only:
    questions:
      ok: {{type: noul, instructions: "Is it fine?"}}
    answer: ok
    escalate: needs-triage
"""
