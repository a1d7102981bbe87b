"""The typed tier's config and key, shared by its tests and their fixtures."""

from __future__ import annotations

__all__ = ["SESSION", "TYPED_CONFIG", "TYPED_KEY"]


TYPED_KEY = "ts-live-typed-tier-0123456789abcdef"


SESSION = """
    escalate: session
    session:
      prompt: "Decide {{ target }}: {{ state }}"
"""


TYPED_CONFIG = f"""
kinds:
  noul-local:
    questions:
      yes: {{type: noul, instructions: "Does this comment ask for a change?"}}
    answer: yes
    escalate: needs-triage
  noul-external:
    effect: external
    questions:
      yes: {{type: noul, instructions: "Does this comment ask for a change?"}}
    answer: yes
    escalate: needs-triage
  choice-local:
    questions:
      area: {{type: choice, instructions: "Which area?", criteria: {{bug: null, feature: null, docs: null}}}}
    answer: area
    escalate: needs-triage
  choice-external:
    effect: external
    questions:
      area: {{type: choice, instructions: "Which area?", criteria: {{bug: null, feature: null, docs: null}}}}
    answer: area
    escalate: needs-triage
  score-local:
    questions:
      level: {{type: score, instructions: "How urgent?", criteria: [can wait, this week, today]}}
    answer: level
    escalate: needs-triage
  score-external:
    effect: external
    questions:
      level: {{type: score, instructions: "How urgent?", criteria: [can wait, this week, today]}}
    answer: level
    escalate: needs-triage
  gated:
    questions:
      yes: {{type: noul, instructions: "Does this comment ask for a change?"}}
      level: {{type: score, instructions: "How urgent?", criteria: [can wait, this week, today]}}
    answer: yes
    gateOn: [yes, level]
    escalate: needs-triage
  gated-elsewhere:
    questions:
      yes: {{type: noul, instructions: "Does this comment ask for a change?"}}
      level: {{type: score, instructions: "How urgent?", criteria: [can wait, this week, today]}}
    answer: yes
    gateOn: [level]
    escalate: needs-triage
  to-session:
    questions:
      yes: {{type: noul, instructions: "Does this comment ask for a change?"}}
    answer: yes{SESSION}
  ordered:
    questions:
      yes: {{type: noul, instructions: "Does this comment ask for a change?"}}
      level: {{type: score, instructions: "How urgent?", criteria: [can wait, this week, today]}}
    answer: yes
    order: level{SESSION}
  order-only:
    questions:
      level: {{type: score, instructions: "How urgent?", criteria: [can wait, this week, today]}}
    order: level{SESSION}
  order-by-label:
    questions:
      yes: {{type: noul, instructions: "Does this comment ask for a change?"}}
      tier: {{type: choice, criteria: {{high: null, low: null}}, priority: {{high: 10, low: 1}}}}
    answer: yes
    order: tier{SESSION}
"""
