"""git, run one way: `runner` (the one git runner) and `hardening` (the flags every git child gets).

Callers take the runner as `from dispatchq.git import runner as git` and call `git.run(...)`;
the flags live apart so a pure module can name them without importing the runner.
"""

__all__: list[str] = []
