"""`dispatchq serve`: one ASGI application for webhooks, judgements, status, metrics and the page."""

__all__: list[str] = []
