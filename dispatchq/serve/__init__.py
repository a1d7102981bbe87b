"""`dispatchq serve`: one ASGI application (Starlette, run by uvicorn) for tools outside.

- `app`: the application (`create_app`), bearer-token auth as middleware for every route
  but `/healthz` and `/webhooks/github`, Redis outages answered 503;
- `webhooks`: `POST /webhooks/github` (signature first, then the pure mapping in
  `dispatchq.triage.github`, then the existing triage enqueue path);
- `judgements`: `POST /judgements`, `GET /judgements/{id}`, `GET /healthz`;
- `body`: reading a request body with a size limit, without reading it whole first;
- `status`, `metrics`, `page`: `GET /status`, `GET /metrics` (Prometheus) and `GET /`, the
  live page (static files under `static/`).

Like the CLI it is an edge: it imports no redis or rq (Redis through `dispatchq.storage`).
"""

__all__: list[str] = []
