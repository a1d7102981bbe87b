"""`python -m dispatchq` is the `dispatchq` command."""

from dispatchq.cli import main

main()
