"""The pure model: judgements and records, answers, ladder moves, prompts. No I/O."""

__all__: list[str] = []
