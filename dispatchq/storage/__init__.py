"""Every Redis read and write: the connection, the store, its Lua scripts, locks."""

__all__: list[str] = []
