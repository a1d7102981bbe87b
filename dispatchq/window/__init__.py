"""The usage window: reading limit messages (pure) and the marker that pauses sessions."""

__all__: list[str] = []
