"""The RQ workers: one class for every tier, the session worker whose dequeue is the window, and status."""

__all__: list[str] = []
