"""The orchestration: the gate and its stages, the session kinds and their hooks, one fixer
attempt inside its job, and waiting for the judgements in this process."""

__all__: list[str] = []
