#!/usr/bin/env python3
"""Session command for the resume benchmark: log the spawn instant, then be the fake `claude`.

The log path comes as the first argument (the session's environment is scrubbed, and a
neutral argument survives it); the rest is the fake session's own argv.
"""

import json
import os
import sys
import time

log, rest = sys.argv[1], sys.argv[2:]
with open(log, "a", encoding="utf-8") as handle:
    handle.write(json.dumps({"time": time.time(), "pid": os.getpid()}) + "\n")
fake = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support", "fake_claude.py")
os.execv(sys.executable, [sys.executable, fake, *rest])
