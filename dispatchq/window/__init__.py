"""The usage window: reading limit messages (pure), the marker that pauses sessions, and its face.

`limits` reads a session's whole run, `signals` the CLI's own fields (read first) and
`messages` the words of a limit (all pure); `marker` is the marker as a value and the rules
over it; `usage` turns the reported use of each window into what people see; `face.Window` is
the one object the session tier, operators and the retrigger use to ask and tell the window.
"""

__all__: list[str] = []
