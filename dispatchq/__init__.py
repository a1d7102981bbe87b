"""dispatchq: a job queue that answers each judgement at the cheapest tier that can.

Producers use `Client`; `Judgement`/`JudgementIn` and `Record` are the typed models
of what goes in and what comes out.
"""

from dispatchq.core.judgement import Judgement, JudgementIn, Record, TrailEntry

__all__ = ["Client", "Judgement", "JudgementIn", "Record", "TrailEntry"]


def __getattr__(name: str) -> object:
    # Lazy, so `import dispatchq` in a worker does not pull in Redis clients it never uses.
    if name == "Client":
        from dispatchq.client import Client

        return Client
    raise AttributeError(name)
