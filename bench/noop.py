"""The no-op job the bare-RQ side of the benchmarks runs."""


def noop(*args: object) -> None:
    return None


def stamp(path: str) -> None:
    """Record when the job started (the resume benchmark's bare-RQ side)."""
    import time

    with open(path, "a", encoding="utf-8") as handle:
        handle.write(f"{time.time()}\n")
