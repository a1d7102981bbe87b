#!/usr/bin/env python3
"""Set up and run dispatchq from a fresh clone, with nothing but python3.

    python3 ops/dev.py demo     # the main job, end to end, on the embedded Redis
    python3 ops/dev.py stack    # the whole Procfile locally (stand-ins, a project-local data dir)
    python3 ops/dev.py check    # the fast loop: ruff, lint-imports, mypy, unit tests (no apt/npm)
    python3 ops/dev.py test     # the whole test suite (what CI runs)
    python3 ops/dev.py bench    # the benchmarks (bench/README.md)

Each command first makes `.venv` (if needed) and installs dispatchq into it: `demo` and
`stack` only its runtime dependencies, the others the dev extra too (into the same venv; a
stamp per extra, so each install is skipped when pyproject.toml has not changed since).
Standard library only: this runs before anything is installed.
"""

from __future__ import annotations

import hashlib
import os
import re
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STAMP = VENV / ".dispatchq-installed"  # the dev extra (runtime included); `.runtime` beside it
# Where `stack` keeps its embedded Redis: in the checkout (ignored by git), never the shared
# per-user default, so a second checkout's stack is a stack of its own.
STACK_DIR = ROOT / ".dispatchq-dev"
# The real Claude Code CLIs the real-client tests run (tests/integration/test_claude_cli.py):
# every release in dispatchq/launcher/releases.py's RELEASES, each in its own folder
# .cache/claude-code/<version>/. That file is the one list (read here without importing
# dispatchq, which is not installed yet); adding the next release is appending it there.
CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"
CLAUDE_CODE_CACHE = ROOT / ".cache" / "claude-code"
CLAUDE_CODE_RELEASES: tuple[str, ...] = tuple(
    runpy.run_path(str(ROOT / "dispatchq" / "launcher" / "releases.py"))["RELEASES"]
)
# The real OpenAI Codex CLIs (tests/integration/test_codex_cli.py), the same way: every release
# in dispatchq/launcher/codex_releases.py's RELEASES, each in .cache/codex/<version>/. That module
# imports dispatchq, so its list is read from the text (one tuple of "X.Y.Z" strings).
CODEX_PACKAGE = "@openai/codex"
CODEX_CACHE = ROOT / ".cache" / "codex"


def releases_in(path: Path) -> tuple[str, ...]:
    """The `RELEASES = ("X.Y.Z", ...)` tuple of a module, read without running it."""
    found = re.search(r"^RELEASES\b[^=\n]*=\s*\(([^)]*)\)", path.read_text(), re.MULTILINE)
    if found is None:
        sys.exit(f"{path} has no RELEASES = (...) tuple")
    return tuple(re.findall(r"[\"']([0-9]+\.[0-9]+\.[0-9]+)[\"']", found.group(1)))


CODEX_RELEASES = releases_in(ROOT / "dispatchq" / "launcher" / "codex_releases.py")


def say(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


def run(argv: list[str], **kwargs: object) -> int:
    return subprocess.call(argv, **kwargs)  # type: ignore[arg-type]


def setup(extra: str = "dev") -> None:
    """`.venv` with dispatchq installed editable: its runtime dependencies, or with `[dev]`."""
    if sys.version_info < (3, 11):  # noqa: UP036 - this script runs under any python3
        sys.exit(f"dispatchq needs Python 3.11 or newer (this is {sys.version.split()[0]})")
    if not (BIN / "python").exists():
        say(f"creating {VENV}")
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    stamps = [STAMP] if extra == "dev" else [STAMP, STAMP.with_suffix(".runtime")]
    if any(p.exists() and p.read_text().strip() == digest for p in stamps):
        return  # the dev extra includes the runtime
    what = "its runtime dependencies" if extra == "runtime" else "its runtime and dev dependencies"
    say(f"installing dispatchq and {what} into .venv (once; again only when pyproject.toml changes)")
    pip = [str(BIN / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    target = f"{ROOT}[dev]" if extra == "dev" else str(ROOT)
    for args in (["install", "--upgrade", "pip"], ["install", "-e", target]):
        started = time.monotonic()
        done = subprocess.run([*pip, *args], capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            sys.exit(f"pip {' '.join(args)} failed (exit {done.returncode})")
        say(f"pip {' '.join(args[:2])}: done in {time.monotonic() - started:.0f} s")
    (STAMP if extra == "dev" else STAMP.with_suffix(".runtime")).write_text(digest)


def demo() -> int:
    """`dispatchq demo`: the examples through every tier, with its stand-ins (nothing spent)."""
    return run([str(BIN / "dispatchq"), "demo"], cwd=ROOT)


def stack_environment(data: Path) -> dict[str, str]:
    """The Procfile's environment for a local stack: the example config, stand-ins, `data`.

    A variable already set wins (a port, a real TypeSafe key), except the session command:
    the stand-in, so a local stack never spends a person's usage window.
    """
    env = dict(os.environ)
    env.setdefault("DISPATCHQ_CONFIG", str(ROOT / "examples" / "dispatchq.yaml"))
    env.setdefault("DISPATCHQ_CHECKOUT_ROOTS", str(ROOT))
    env["DISPATCHQ_DATA_DIR"] = str(data)
    env["DISPATCHQ_SESSION_COMMAND"] = (
        f"{BIN / 'python'} -m dispatchq.testing.stand_in_session --state {data / 'stand-in.json'} "
        "-p --output-format stream-json --verbose"
    )
    env["DISPATCHQ_SESSION_SANDBOX"] = "off"  # the stand-in is our own trusted code
    env.setdefault("CLAUDE_CODE_OAUTH_TOKEN", "stand-in-needs-no-credential")
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def stack(args: list[str]) -> int:
    """The Procfile (a worker per tier, the scheduler, serve) under honcho, on a local default.

    The data dir is `.dispatchq-dev/` in this checkout, not the per-user default every
    checkout shares; sessions are the stand-in. Ctrl-C stops every process (honcho sends
    SIGTERM: the workers finish their current job). `--data DIR` puts the data elsewhere.
    """
    data = Path(args[args.index("--data") + 1]) if "--data" in args else STACK_DIR / "data"
    data.mkdir(parents=True, exist_ok=True)
    env = stack_environment(data.resolve())
    port = env.get("DISPATCHQ_SERVE_PORT", "8484")
    say(
        f"data dir {data} (this checkout's own); sessions run the STAND-IN; serve on http://127.0.0.1:{port}/"
    )
    say(
        f"in another shell: export DISPATCHQ_DATA_DIR={data.resolve()} "
        f"DISPATCHQ_CONFIG={env['DISPATCHQ_CONFIG']}; .venv/bin/dispatchq status"
    )
    try:
        code = run([str(BIN / "honcho"), "-f", str(ROOT / "Procfile"), "-d", str(ROOT), "start"], env=env)
    except KeyboardInterrupt:
        code = 130
    # Every process is down: the embedded server they shared goes too (stopped while they
    # ran, the next of them would only have started it again).
    run([str(BIN / "dispatchq"), "redis", "stop"], env=env, stdout=subprocess.DEVNULL)
    say("the stack is down; embedded Redis stopped")
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


class NpmCli:
    """One npm package whose every supported release the real-client tests run: each release in
    its own prefix (`<cache>/<version>/`, so two never share a node_modules), stamped once installed."""

    def __init__(self, title: str, package: str, binary: str, cache: Path) -> None:
        self.title, self.package, self.binary, self.cache = title, package, binary, cache

    def prefix(self, version: str) -> Path:
        return self.cache / version

    def stamp(self, version: str) -> Path:
        return self.prefix(version) / ".dispatchq-installed"

    def installed(self, version: str) -> bool:
        """True when the release's CLI is in its folder, stamped, and says it is that version."""
        prefix = self.prefix(version)
        package = prefix / "node_modules" / self.package / "package.json"
        binary = prefix / "node_modules" / ".bin" / self.binary
        stamp = self.stamp(version)
        if not (package.is_file() and binary.exists() and stamp.is_file()):
            return False
        if stamp.read_text().strip() != version:
            return False
        try:
            done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0 and version in done.stdout

    def install(self, npm: str, version: str) -> bool:
        """npm install one release into its own folder, then stamp it; False when that failed."""
        prefix = self.prefix(version)
        spec = f"{self.package}@{version}"
        say(f"npm install {spec} into {prefix.relative_to(ROOT)} (once per release; ~400 MB each)")
        prefix.mkdir(parents=True, exist_ok=True)
        self.stamp(version).unlink(missing_ok=True)
        started = time.monotonic()
        argv = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", spec]
        if run(argv, cwd=ROOT):
            say(f"npm install {spec} failed")
            return False
        self.stamp(version).write_text(version + "\n")
        if not self.installed(version):
            say(f"npm install {spec} finished but `{self.binary} --version` does not say {version}")
            return False
        say(f"{self.title} {version} installed in {time.monotonic() - started:.0f} s")
        return True


CLAUDE_CODE = NpmCli("Claude Code", CLAUDE_CODE_PACKAGE, "claude", CLAUDE_CODE_CACHE)
CODEX = NpmCli("Codex CLI", CODEX_PACKAGE, "codex", CODEX_CACHE)


def _drop_single_release_layout() -> None:
    """The layout before releases had folders (.cache/claude-code/node_modules): one CLI too many."""
    for name in ("node_modules", "package.json", "package-lock.json"):
        old = CLAUDE_CODE_CACHE / name
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        elif old.is_file():
            old.unlink()


def install_test_tools() -> int:
    """bubblewrap, socat, node/npm, chromium, every supported Claude Code CLI and every supported
    Codex CLI, for the real-client tests.

    npm installs each release of CLAUDE_CODE_RELEASES under .cache/claude-code/<version>/ and of
    CODEX_RELEASES under .cache/codex/<version>/ (ignored by git); never with --omit=optional:
    each native binary is an optional, per-platform package. Under CI=true a missing npm or a
    failed install fails the run; elsewhere that release's real-client tests skip, saying why.
    """
    missing = [] if shutil.which("bwrap") else ["bubblewrap"]
    if not shutil.which("socat"):  # Claude Code's own tool sandbox relays through it
        missing += ["socat"]
    if not (shutil.which("npm") and shutil.which("node")):
        missing += ["nodejs", "npm"]
    if not shutil.which("chromium"):  # the status page's browser test (Playwright drives it)
        missing += ["chromium"]
    apt_install(missing)
    wanted = [
        (cli, version)
        for cli, releases in ((CLAUDE_CODE, CLAUDE_CODE_RELEASES), (CODEX, CODEX_RELEASES))
        for version in releases
        if not cli.installed(version)
    ]
    if not wanted:
        _drop_single_release_layout()
        return 0
    ci = os.environ.get("CI") == "true"
    npm = shutil.which("npm")
    if npm is None:
        if ci:
            say("npm is needed for the real Claude Code and Codex CLIs' tests (CI=true): install nodejs, npm")
            return 1
        say("npm not found: the real Claude Code and Codex CLIs' tests will be SKIPPED (install nodejs, npm)")
        return 0
    failed = [(cli.title, version) for cli, version in wanted if not cli.install(npm, version)]
    if not any(title == CLAUDE_CODE.title for title, _ in failed):
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
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "stack", "check", "test", "bench", "setup"):
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = sys.argv[1], sys.argv[2:]
    setup("runtime" if command in ("demo", "stack") else "dev")
    if command == "demo":
        return demo()
    if command == "stack":
        return stack(rest)
    if command == "check":
        return check(rest)
    if command == "test":
        return test(rest)
    if command == "bench":
        return bench(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
