"""What the gate says and reads: the sessions' prompts and what their returns must hold,
the sweep's screens and the run summary. Pure, above the grammar and beside the evidence:
nothing here runs a check or reads the store."""

__all__: list[str] = []
