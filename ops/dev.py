#!/usr/bin/env python3
"""Set up and run dispatchq from a fresh clone, with nothing but python3.

    python3 ops/dev.py demo     # the main job, end to end, on the embedded Redis
    python3 ops/dev.py check    # the fast loop: ruff, lint-imports, mypy, unit tests (no apt/npm)
    python3 ops/dev.py test     # the whole test suite (what CI runs)
    python3 ops/dev.py bench    # the benchmarks (bench/README.md)

Each command first makes `.venv` (if needed) and installs dispatchq into it with its
dev extra; the install is skipped when pyproject.toml has not changed since.
Standard library only: this runs before anything is installed.
"""

from __future__ import annotations

import hashlib
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STAMP = VENV / ".dispatchq-installed"
# The real Claude Code CLIs the real-client tests run (tests/integration/test_claude_cli.py):
# every release in dispatchq/launcher/releases.py's RELEASES, each in its own folder
# .cache/claude-code/<version>/. That file is the one list (read here without importing
# dispatchq, which is not installed yet); adding the next release is appending it there.
CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"
CLAUDE_CODE_CACHE = ROOT / ".cache" / "claude-code"
CLAUDE_CODE_RELEASES: tuple[str, ...] = tuple(
    runpy.run_path(str(ROOT / "dispatchq" / "launcher" / "releases.py"))["RELEASES"]
)


def say(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


def run(argv: list[str], **kwargs: object) -> int:
    return subprocess.call(argv, **kwargs)  # type: ignore[arg-type]


def setup() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - this script runs under any python3
        sys.exit(f"dispatchq needs Python 3.11 or newer (this is {sys.version.split()[0]})")
    if not (BIN / "python").exists():
        say(f"creating {VENV}")
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text().strip() == digest:
        return
    say("installing dispatchq and its dev tools into .venv (once; repeated only when pyproject.toml changes)")
    pip = [str(BIN / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    for args in (["install", "--upgrade", "pip"], ["install", "-e", f"{ROOT}[dev]"]):
        done = subprocess.run([*pip, *args], capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            sys.exit(f"pip {' '.join(args)} failed (exit {done.returncode})")
    STAMP.write_text(digest)


LIFT_AFTER = 6  # seconds: the stand-in's usage limit lifts this long after it is hit


def demo() -> int:
    """Run examples/judgements.jsonl through every tier on a fresh embedded Redis.

    Sessions use the shipped test double dispatchq.testing.stand_in_session (never a real
    session command: the demo must never spend a person's usage window). Its first session
    hits a usage limit that lifts a few seconds later, so the demo shows the marker, zero
    spawns while it is up, the probe at the lift and the drain.
    """
    data = Path(tempfile.mkdtemp(prefix="dispatchq-demo-"))
    if os.environ.get("DISPATCHQ_SESSION_COMMAND"):
        say("ignoring DISPATCHQ_SESSION_COMMAND: the demo never spends a real usage window")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHQ_")}
    env["DISPATCHQ_DATA_DIR"] = str(data)
    env["DISPATCHQ_CONFIG"] = str(ROOT / "examples" / "dispatchq.yaml")
    env["DISPATCHQ_CHECKOUT_ROOTS"] = str(ROOT)
    env["DISPATCHQ_SESSION_COMMAND"] = (
        f"{BIN / 'python'} -m dispatchq.testing.stand_in_session --state {data / 'stand-in.json'} "
        f"--lift-after {LIFT_AFTER} -p --output-format stream-json --verbose"
    )
    # The stand-in is dispatchq's own trusted code and keeps its state in the data dir, so it
    # runs unconfined (the README's first command needs nothing but python3, not bubblewrap);
    # it checks no credential, but a session worker refuses to start without one.
    env["DISPATCHQ_SESSION_SANDBOX"] = "off"
    env["DISPATCHQ_SESSION_CREDENTIAL_VAR"] = "CLAUDE_CODE_OAUTH_TOKEN"
    env["CLAUDE_CODE_OAUTH_TOKEN"] = "stand-in-needs-no-credential"  # noqa: S105 (not a secret)
    dispatchq = str(BIN / "dispatchq")
    judgements = str(ROOT / "examples" / "judgements.jsonl")
    say("sessions run the STAND-IN dispatchq.testing.stand_in_session: no model, no usage window spent")
    say("the stand-in is our own trusted code: it runs unconfined (DISPATCHQ_SESSION_SANDBOX=off)")
    say("dispatchq run examples/judgements.jsonl  (embedded Redis in a temporary data dir)")
    try:
        run([dispatchq, "run", judgements], env=env, cwd=ROOT)
        say("the stand-in's first session hit a usage limit: the marker is up, nothing more spawns")
        run([dispatchq, "status"], env=env, cwd=ROOT)
        say(f"waiting {LIFT_AFTER + 1} s for the limit to lift (a worker would wake at the lift instant)")
        time.sleep(LIFT_AFTER + 1)
        say("dispatchq run again: one probe session first, then the rest drain")
        code = run([dispatchq, "run", judgements], env=env, cwd=ROOT)
        say("dispatchq status")
        run([dispatchq, "status"], env=env, cwd=ROOT)
    finally:
        run([dispatchq, "redis", "stop"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)
    return code


def apt_install(packages: list[str]) -> None:
    """Debian's packages for the tests, where this host can install them (root with apt-get)."""
    if not packages or not shutil.which("apt-get") or os.geteuid() != 0:
        return
    say(f"apt-get install {' '.join(packages)} (for the real-client tests)")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-q"], env=env, **quiet)
    if run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], env=env, **quiet):
        say(f"apt-get install {' '.join(packages)} failed")


def claude_code_prefix(version: str) -> Path:
    """One release's own npm prefix: two releases never share a node_modules."""
    return CLAUDE_CODE_CACHE / version


def _claude_code_stamp(version: str) -> Path:
    return claude_code_prefix(version) / ".dispatchq-installed"


def claude_code_installed(version: str) -> bool:
    """True when the release's CLI is in its folder, stamped, and says it is that version."""
    prefix = claude_code_prefix(version)
    package = prefix / "node_modules" / "@anthropic-ai" / "claude-code" / "package.json"
    binary = prefix / "node_modules" / ".bin" / "claude"
    stamp = _claude_code_stamp(version)
    if not (package.is_file() and binary.exists() and stamp.is_file()):
        return False
    if stamp.read_text().strip() != version:
        return False
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and version in done.stdout


def install_claude_code(npm: str, version: str) -> bool:
    """npm install one release into its own folder, then stamp it; False when that failed."""
    prefix = claude_code_prefix(version)
    spec = f"{CLAUDE_CODE_PACKAGE}@{version}"
    say(f"npm install {spec} into {prefix.relative_to(ROOT)} (once per release; ~400 MB for the newest)")
    prefix.mkdir(parents=True, exist_ok=True)
    _claude_code_stamp(version).unlink(missing_ok=True)
    started = time.monotonic()
    argv = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", spec]
    if run(argv, cwd=ROOT):
        say(f"npm install {spec} failed")
        return False
    _claude_code_stamp(version).write_text(version + "\n")
    if not claude_code_installed(version):
        say(f"npm install {spec} finished but `claude --version` does not say {version}")
        return False
    say(f"Claude Code {version} installed in {time.monotonic() - started:.0f} s")
    return True


def _drop_single_release_layout() -> None:
    """The layout before releases had folders (.cache/claude-code/node_modules): one CLI too many."""
    for name in ("node_modules", "package.json", "package-lock.json"):
        old = CLAUDE_CODE_CACHE / name
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        elif old.is_file():
            old.unlink()


def install_test_tools() -> int:
    """bubblewrap, socat, node/npm, chromium and every supported Claude Code CLI, for the real-client tests.

    npm installs each release of CLAUDE_CODE_RELEASES under .cache/claude-code/<version>/
    (ignored by git); never with --omit=optional: the native binary is an optional,
    per-platform package. Under CI=true a missing npm or a failed install fails the run;
    elsewhere that release's real-client tests skip, saying why.
    """
    missing = [] if shutil.which("bwrap") else ["bubblewrap"]
    if not shutil.which("socat"):  # Claude Code's own tool sandbox relays through it
        missing += ["socat"]
    if not (shutil.which("npm") and shutil.which("node")):
        missing += ["nodejs", "npm"]
    if not shutil.which("chromium"):  # the status page's browser test (Playwright drives it)
        missing += ["chromium"]
    apt_install(missing)
    wanted = [version for version in CLAUDE_CODE_RELEASES if not claude_code_installed(version)]
    if not wanted:
        _drop_single_release_layout()
        return 0
    ci = os.environ.get("CI") == "true"
    npm = shutil.which("npm")
    if npm is None:
        if ci:
            say("npm is needed for the real Claude Code CLI tests (CI=true): install nodejs and npm")
            return 1
        say("npm not found: the real Claude Code CLI tests will be SKIPPED (install nodejs and npm)")
        return 0
    failed = [version for version in wanted if not install_claude_code(npm, version)]
    if not failed:
        _drop_single_release_layout()
    return 1 if failed and ci else 0


def run_steps(steps: list[tuple[str, list[str]]], what: str) -> int:
    """Each step in turn, stopping at the first that fails, with one line naming it."""
    for title, argv in steps:
        say(title)
        code = run(argv, cwd=ROOT)
        if code:
            say(f"{what} FAILED at step: {title} (exit {code})")
            return code
    return 0


def lint_steps() -> list[tuple[str, list[str]]]:
    return [
        ("ruff check", [str(BIN / "ruff"), "check", "dispatchq", "jobs", "tests", "bench", "ops"]),
        # The cache named, so a second run only rechecks what changed (seconds, not minutes).
        ("mypy (strict on the pure rooms)", [str(BIN / "mypy"), "--cache-dir", str(ROOT / ".mypy_cache")]),
        ("import contracts (lint-imports)", [str(BIN / "lint-imports")]),
    ]


def check(args: list[str]) -> int:
    """The fast loop before a commit: ruff, the import contracts, mypy, the unit tests.

    No apt-get, no npm and no server: only what .venv has, so it runs the same on any
    clone, offline, in about a minute when mypy's cache is warm. `test` is the whole
    suite CI runs; this is the part of it a change breaks most often.
    """
    ruff, mypy, contracts = lint_steps()
    pytest = [str(BIN / "python"), "-m", "pytest", "tests/unit", "-n", "2", "-q", *args]
    unit = ("unit tests (pytest tests/unit -n 2)", pytest)
    return run_steps([ruff, contracts, mypy, unit], "check")


def test(args: list[str]) -> int:
    if install_test_tools():
        return 1
    if run_steps(lint_steps(), "test"):
        return 1
    say("pytest (2 processes): tests/unit, tests/integration, tests/cli")
    return run([str(BIN / "python"), "-m", "pytest", "-n", "2", "-q", *args], cwd=ROOT)


def bench(args: list[str]) -> int:
    return run([str(BIN / "python"), str(ROOT / "bench" / "run.py"), *args], cwd=ROOT)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "check", "test", "bench", "setup"):
        print(__doc__, file=sys.stderr)
        return 2
    setup()
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "demo":
        return demo()
    if command == "check":
        return check(rest)
    if command == "test":
        return test(rest)
    if command == "bench":
        return bench(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
