"""The decision record for findings: report and plan grammars, boundary, record, gate."""

__all__: list[str] = []
