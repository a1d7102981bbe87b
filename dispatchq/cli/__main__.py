"""`python -m dispatchq.cli` is the `dispatchq` command (tests run it this way)."""

from dispatchq.cli import main

main()
