"""The one git runner: argv lists, no shell, a scrubbed environment, git's knobs pinned.

Every git child dispatchq starts goes through `run`: the code tier's produce-and-verify
worktrees, the dispatcher's checkout fingerprint, the decision record's pins and
observations, and the execution boundary's read-only checks. One runner means one set of
rules: config that could turn a read into a run is overridden on the command line
(`GIT_HARDENING`), every inherited `GIT_*` variable is dropped (GIT_DIR, GIT_EXTERNAL_DIFF
and friends would redirect or extend what a call does), and the rest of the environment
is `child_environment`'s allowlisted base (PATH, HOME, locale, proxies without a password,
CA bundles): all git needs to run locally, and no credential. The parent environment is
an argument; when a caller gives none it comes from `dispatchq.settings`, the one reader.

Produce-and-verify must never touch a person's working tree, so it works in a
temporary worktree at HEAD; the content key must change when the tree does, so it
fingerprints HEAD plus every changed or untracked file's content.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from dispatchq.errors import GitError, GitUnavailable
from dispatchq.git.hardening import GIT_HARDENING
from dispatchq.launcher.environment import child_environment
from dispatchq.settings import parent_environment

__all__ = [
    "DEFAULT_GIT_TIMEOUT",
    "add_worktree",
    "commit_to_branch",
    "diff_all",
    "fingerprint",
    "git_environment",
    "hash_objects",
    "head",
    "remove_worktree",
    "run",
    "run_git",
    "toplevel",
]

DEFAULT_GIT_TIMEOUT = 60.0


def git_environment(parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for every git child: the allowlisted base, with git's own knobs pinned.

    A produce/verify environment passed as `parent` is reduced to the base as well (git needs
    none of a toolchain's names), and `GIT_*` goes (`GIT_CONFIG_*` can carry a token)."""
    source = parent_environment() if parent is None else parent
    env = {k: v for k, v in child_environment(source).items() if not k.startswith("GIT_")}
    env.update(
        GIT_PAGER="cat",
        PAGER="cat",
        GIT_TERMINAL_PROMPT="0",
        GIT_NO_LAZY_FETCH="1",
        GIT_LITERAL_PATHSPECS="1",
        GIT_OPTIONAL_LOCKS="0",
    )
    return env


def run(
    root: Path | str | None,
    args: Sequence[str],
    *,
    parent: Mapping[str, str] | None = None,
    input: bytes | None = None,
    timeout: float = DEFAULT_GIT_TIMEOUT,
) -> subprocess.CompletedProcess[bytes]:
    """Run `git <hardening> <args>` in `root`; never through a shell.

    Raises what `subprocess.run` raises (FileNotFoundError when git or `root` is missing,
    TimeoutExpired): callers decide what each means for them.
    """
    return subprocess.run(
        ["git", *GIT_HARDENING, *args],
        cwd=root,
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        env=git_environment(parent),
        timeout=timeout,
        check=False,
    )


def run_git(
    repo: Path, *args: str, env: Mapping[str, str] | None = None, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    """`run` with `-C repo`, any failure to run (or, with `check`, a non-zero exit) a GitError.

    `env` is the parent environment the child's is derived from (see `git_environment`).
    """
    try:
        done = run(None, ["-C", str(repo), *args], parent=env, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise GitError(f"git {args[0]}: {error}") from None
    if check and done.returncode != 0:
        raise GitError(f"git {args[0]} failed: {done.stderr.decode(errors='replace').strip()[:500]}")
    return done


def hash_objects(
    root: Path | str, paths: Sequence[str], *, timeout: float = DEFAULT_GIT_TIMEOUT
) -> list[str] | None:
    """`git hash-object --no-filters -- <paths>`: one blob hash per path, or None when git
    failed or timed out (a path changed under us). Raises GitUnavailable with no git.

    `--no-filters` hashes the bytes on disk and never runs a clean filter the repository
    configures.
    """
    try:
        done = run(root, ["hash-object", "--no-filters", "--", *paths], timeout=timeout)
    except FileNotFoundError:
        raise GitUnavailable("git is not installed") from None
    except subprocess.TimeoutExpired:
        return None
    hashes = done.stdout.decode("ascii", "replace").split()
    if done.returncode != 0 or len(hashes) != len(paths):
        return None
    return hashes


def toplevel(path: Path, env: Mapping[str, str] | None = None) -> Path | None:
    done = run_git(path, "rev-parse", "--show-toplevel", env=env, check=False)
    if done.returncode != 0:
        return None
    return Path(done.stdout.decode().strip())


def head(repo: Path, env: Mapping[str, str] | None = None) -> str | None:
    done = run_git(repo, "rev-parse", "--verify", "-q", "HEAD", env=env, check=False)
    return done.stdout.decode().strip() or None if done.returncode == 0 else None


def fingerprint(repo: Path, env: Mapping[str, str] | None = None) -> str:
    """HEAD plus a digest of the content of every changed or untracked file.

    Two enqueues of the same judgement against the same tree get the same key; any
    edit, staged or not, gives a new one.
    """
    digest = hashlib.sha256()
    digest.update((head(repo, env) or "no-head").encode())
    status = run_git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all", env=env).stdout
    entries = [e for e in status.split(b"\0") if e]
    paths: list[bytes] = []
    skip_next = False
    for entry in entries:
        if skip_next:  # the original name of a rename
            skip_next = False
            continue
        code, path = entry[:2], entry[3:]
        if code[:1] in (b"R", b"C"):
            skip_next = True
        paths.append(path)
    for rel in sorted(paths):
        digest.update(b"\0" + rel + b"\0")
        file = repo / rel.decode("utf-8", "surrogateescape")
        try:
            if file.is_symlink():
                digest.update(b"link:" + str(file.readlink()).encode())
            elif file.is_file():
                digest.update(hashlib.sha256(file.read_bytes()).digest())
            else:
                digest.update(b"absent")
        except OSError:
            digest.update(b"unreadable")
    return digest.hexdigest()


def add_worktree(repo: Path, path: Path, env: Mapping[str, str] | None = None) -> None:
    run_git(repo, "worktree", "add", "--detach", "--quiet", str(path), "HEAD", env=env)


def remove_worktree(repo: Path, path: Path, env: Mapping[str, str] | None = None) -> None:
    run_git(repo, "worktree", "remove", "--force", str(path), env=env, check=False)
    run_git(repo, "worktree", "prune", env=env, check=False)


def diff_all(worktree: Path, env: Mapping[str, str] | None = None) -> str:
    """Everything the regenerators changed, untracked files included."""
    run_git(worktree, "add", "--all", env=env)
    return run_git(worktree, "diff", "--cached", "--binary", env=env).stdout.decode(errors="replace")


def commit_to_branch(worktree: Path, branch: str, message: str, env: Mapping[str, str] | None = None) -> str:
    """Commit what is staged in the worktree onto a new local branch; return the commit id."""
    identity = (
        "-c",
        "user.name=dispatchq",
        "-c",
        "user.email=dispatchq@localhost",
        "-c",
        "commit.gpgsign=false",
    )
    run_git(worktree, *identity, "commit", "--quiet", "--no-verify", "-m", message, env=env)
    commit = run_git(worktree, "rev-parse", "HEAD", env=env).stdout.decode().strip()
    run_git(worktree, "branch", "--force", branch, commit, env=env)
    return commit
