"""The three tiers that answer judgements: code, typed (TypeSafe's Jev), session."""

__all__: list[str] = []
