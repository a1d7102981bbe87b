"""The no-op job the bare-RQ side of the benchmarks runs."""


def noop(*args: object) -> None:
    return None
