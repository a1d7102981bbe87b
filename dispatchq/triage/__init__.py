"""The rules engine: config and decision key (`rules`), CEL conditions (`cel`) and the
resolution table (`table`), all pure; the engine (`engine`) and the executors (`executors`).

Import from the modules: this package re-exports nothing, so importing one part never
loads another (the pure half stays free of Redis and HTTP).
"""

__all__: list[str] = []
