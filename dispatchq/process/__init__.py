"""Process wiring: the one room that knows every part, builds a Runtime and starts a role."""

__all__: list[str] = []
