__all__ = []
"""The decision record for findings: report and plan grammars, boundary, record, gate."""
