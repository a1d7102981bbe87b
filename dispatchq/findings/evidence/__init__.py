"""What the gate reads and writes in the world: a plan's checks run inside the execution
boundary, pins and attribution from git, the observations graded, and the decision record
(the report's lines and their copies in the store)."""

__all__: list[str] = []
