"""Spawning one headless session safely, and the environment every child gets."""

__all__: list[str] = []
