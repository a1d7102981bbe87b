"""Hand-off to RQ: dispatch, workers, the scheduler (the only RQ code)."""

__all__: list[str] = []
