"""The rules engine: rules and the resolution table (pure), the engine, executors."""

__all__: list[str] = []
