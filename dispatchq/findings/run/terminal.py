"""Where a person answers the gate: an interactive terminal, and nothing else.

A decision is a person's, so answers are read only from a TTY; with no interactive
terminal the sweep aborts before anything is spent.
"""

from __future__ import annotations

import sys
from typing import TextIO

from dispatchq.errors import Aborted

__all__ = [
    "Terminal",
]


# --- the terminal ---------------------------------------------------------------------------
class Terminal:
    """Where a person answers. Answers are read only from an interactive terminal."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout

    @staticmethod
    def interactive(stdin: TextIO | None = None) -> bool:
        stream = stdin or sys.stdin
        try:
            return stream.isatty()
        except (AttributeError, ValueError):
            return False

    def say(self, *lines: str) -> None:
        for line in lines:
            self.stdout.write(line + "\n")
        self.stdout.flush()

    def ask(self, prompt: str) -> str:
        self.stdout.write(prompt)
        self.stdout.flush()
        try:
            line = self.stdin.readline()
        except KeyboardInterrupt:
            raise Aborted("interrupted") from None
        if line == "":
            raise Aborted("the terminal closed")
        return line.rstrip("\r\n")

    def yes(self, prompt: str) -> bool:
        while True:
            answer = self.ask(prompt).strip().lower()
            if answer in ("y", "yes"):
                return True
            if answer in ("n", "no"):
                return False
            self.say("answer y or n")
