"""git, run one way: `runner` (the one git runner) and `hardening` (the flags every child gets).

`from dispatchq import git; git.run(...)` is the runner's API; the flags live apart so a
pure module can name them without importing the runner.
"""

from dispatchq.git.runner import (
    DEFAULT_GIT_TIMEOUT,
    add_worktree,
    commit_to_branch,
    diff_all,
    fingerprint,
    git_environment,
    hash_objects,
    head,
    remove_worktree,
    run,
    run_git,
    toplevel,
)

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
