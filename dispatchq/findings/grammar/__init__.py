"""The findings report's grammar: the Markdown report, the lines dispatchq writes in it, the
verification plans and the tokens taken from it. Pure: text in, text out (the report's
locked write aside), so every rule is tested as a function."""

__all__: list[str] = []
