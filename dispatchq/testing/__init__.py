"""Test doubles that ship with dispatchq: stand-ins that never spend a usage window.

Each stands in for a service dispatchq pays for, on loopback or as a local command, so a test,
a benchmark or the demo runs the real code paths without a key, a quota or a model:

- `dispatchq.testing.typesafe`: a loopback fake of the TypeSafe API (in-process or as its own
  process, `python -m dispatchq.testing.typesafe`), for the real `typesafe-sdk`;
- `dispatchq.testing.anthropic`: a loopback stand-in for the Messages API, for the real
  Claude Code CLI;
- `dispatchq.testing.stand_in_session`: a session command that prints what a headless
  `claude -p` prints (the demo's sessions), `python -m dispatchq.testing.stand_in_session`.

The top of the layers: it may import anything in dispatchq, and nothing in dispatchq imports
it. The package imports none of its modules itself, so importing it costs nothing.
"""

__all__: list[str] = []
