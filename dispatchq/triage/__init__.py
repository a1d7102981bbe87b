"""The rules engine: rules and the resolution table (pure), the engine, executors."""
