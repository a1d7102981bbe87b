"""Verification plans and the execution boundary (dispatchq.findings.evidence.boundary)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import fakeredis
import pytest

from dispatchq.errors import CheckError
from dispatchq.findings.evidence.boundary import (
    Approvals,
    CheckResult,
    PlanResult,
    contain,
    exists_in,
    glob_regex,
    meets,
    plan_rejection,
    run_check,
    run_plan,
)
from dispatchq.findings.grammar.plans import (
    Check,
    Expectation,
    format_plan,
    parse_git_args,
    parse_plan,
    plan_digest,
    quote,
    split_tokens,
)
from dispatchq.storage.findings import FindingsStore
from tests.support.repos import git


# --- the quoting rule -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("token", "written"),
    [
        ("plain", "plain"),
        ("docs/a.md:3", "docs/a.md:3"),
        ("two words", "'two words'"),
        ("", "''"),
        ("it's", "'it''s'"),
        ("a;b", "'a;b'"),
        ("x→y", "'x→y'"),
        ("(soft)", "'(soft)'"),
        ('say "hi"', "'say \"hi\"'"),
        ("tab\there", "'tab\there'"),
        ("-F", "-F"),
    ],
)
def test_quote_writes_each_token_one_way(token: str, written: str) -> None:
    assert quote(token) == written
    assert split_tokens(written) == [token]


@pytest.mark.parametrize(
    "text",
    ["it's", "a;b", "(soft)", "'unterminated", "'a'b", "x→y"],
)
def test_split_tokens_refuses_what_quote_would_not_write(text: str) -> None:
    with pytest.raises(CheckError):
        split_tokens(text)


# --- canonical forms -------------------------------------------------------------------
CANONICAL = [
    "read docs/a.md:3 → contains here",
    "read docs/a.md:1-2 → equals alpha (soft)",
    "read docs/a.md:2 → contains 'beta gamma' (soft)",
    "grep -F example-tool.sh docs → empty",
    "grep -i -F beta docs src → lines 2",
    "grep ex.*sh docs/a.md → matches ^docs/a.md:3:",
    "glob **/*.md → contains docs/a.md",
    "git log --oneline -n3 → lines 1",
    "git diff --stat HEAD → empty",
    "git blame -L10,20 docs/a.md → contains alpha",
    "git status --porcelain → empty",
    "run pytest -q tests/test_x.py → contains passed",
    "run sh -c 'exit 0' → empty",
    "read docs/a.md:3 → contains '(soft)'",
    "read docs/a.md:3 → equals 'it''s'",
]


@pytest.mark.parametrize("text", CANONICAL)
def test_canonical_check_round_trips(text: str) -> None:
    check = Check.parse(text)
    assert check.text == text
    assert Check.from_json(check.to_json()) == check


def test_soft_marker_is_read_from_the_end_only() -> None:
    assert Check.parse("read docs/a.md:3 → contains here (soft)").soft is True
    quoted = Check.parse("read docs/a.md:3 → contains '(soft)'")
    assert quoted.soft is False
    assert quoted.expect.operand == "(soft)"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("read docs/a.md:3", "no ' → "),
        ("read docs/a.md → empty", "PATH:LINE"),
        ("read docs/a.md:0 → empty", "PATH:LINE"),
        ("read docs/a.md:5-2 → empty", "PATH:LINE"),
        ("read /etc/passwd:1 → empty", "absolute"),
        ("read ../root-evil/secret.txt:1 → empty", ".."),
        ("grep x → empty", "PATTERN PATH"),
        ("grep x /etc → empty", "absolute"),
        ("grep '(' docs → empty", "does not compile"),
        ("grep -F -F x docs → empty", "repeated"),
        ("glob /etc/* → empty", "absolute"),
        ("glob ../* → empty", ".."),
        ("cat docs/a.md → empty", "unknown check kind"),
        ("grep x docs → empty (soft)", "only a `read`"),
        ("read docs/a.md:1 → empty (soft)", "only a `read`"),
        ("read docs/a.md:1 → lines x", "count"),
        ("read docs/a.md:1 → matches '('", "does not compile"),
        ("read docs/a.md:1 → empty extra", "no operand"),
        ("read docs/a.md:1 → contains", "needs an operand"),
        ("read docs/a.md:1 → contains a b", "at most one operand"),
        ("read  docs/a.md:1 → empty", "canonical"),
        ("read docs/a.md:1 → contains 'a → b'", "beyond its own separator"),
        ("git checkout -- docs/a.md → empty", "outside the boundary"),
        ("git restore docs/a.md → empty", "outside the boundary"),
        ("git push → empty", "outside the boundary"),
        ("git log --since → empty", "needs a value"),
        ("git log --oneline=x → empty", "takes no value"),
        ("git log --exec=x → empty", "allow-list"),
        ("git blame -L 'x,y' docs/a.md → empty", "line numbers"),
        ("git status -- /etc → empty", "absolute"),
        ("git log -- 'a b' → empty", "allow-list"),
        ("run → empty", "argv"),
    ],
)
def test_invalid_checks_are_refused_with_a_reason(text: str, why: str) -> None:
    with pytest.raises(CheckError, match=_escape(why)):
        Check.parse(text)


def _escape(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize(
    "option",
    [
        "--output=/tmp/x",
        "--no-index",
        "--ext-diff",
        "--textconv",
        "-c",
        "--git-dir=/tmp",
        "--work-tree=/tmp",
        "--exec-path=/tmp",
        "--contents=/etc/passwd",
        "-O/etc/passwd",
        "--show-signature",
    ],
)
@pytest.mark.parametrize("sub", ["log", "show", "diff", "blame", "status"])
def test_forbidden_git_options_are_refused_for_every_subcommand(sub: str, option: str) -> None:
    with pytest.raises(CheckError, match="not allowed"):
        parse_git_args([sub, option])


def test_git_args_put_paths_after_double_dash_and_harden(checks_repo: Path) -> None:
    parsed = parse_git_args(["blame", "-L", "1,2", "docs/a.md"], exists_in(checks_repo))
    assert parsed.paths == ("docs/a.md",)
    argv = parsed.argv()
    assert argv[argv.index("--") + 1 :] == ["docs/a.md"]
    assert "--no-textconv" in argv
    assert "-L1,2" in argv
    assert argv[argv.index("-c") + 1] == "core.fsmonitor=false"
    log = parse_git_args(["log", "--format", "%H", "HEAD"], exists_in(checks_repo))
    assert log.revisions == ("HEAD",)
    assert "--format=%H" in log.options
    assert {"--no-ext-diff", "--no-textconv"} <= set(log.argv())


def test_separator_inside_a_check_is_rejected_not_escaped() -> None:
    with pytest.raises(CheckError, match="'; '"):
        Check("grep", ("a; b", "docs"), Expectation("empty"))
    with pytest.raises(CheckError, match="one physical line"):
        Check("read", ("docs/a.md:1",), Expectation("contains", "a\nb"))
    with pytest.raises(CheckError, match="one physical line"):
        Check("read", ("docs/a.md:1",), Expectation("contains", "a\u2028b"))


def test_plan_line_round_trips_and_digest_tracks_every_change() -> None:
    line = "grep -F example-tool.sh docs → empty; read docs/a.md:3 → contains here (soft)"
    checks = parse_plan(line)
    assert [c.kind for c in checks] == ["grep", "read"]
    assert format_plan(checks) == line
    changed = parse_plan("grep -F example-tool.sh docs → empty; read docs/a.md:3 → contains there (soft)")
    assert plan_digest(checks) != plan_digest(changed)
    assert plan_digest(checks) == plan_digest(parse_plan(line))
    with pytest.raises(CheckError):
        parse_plan("")
    with pytest.raises(CheckError):
        format_plan([])


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "grep", "args": "x docs", "expect": {"kind": "empty"}},
        {"kind": "grep", "args": ["x", 3], "expect": {"kind": "empty"}},
        {"kind": "grep", "args": ["x", "docs"]},
        {"kind": 1, "args": [], "expect": {"kind": "empty"}},
        {"kind": "read", "args": ["a.md:1"], "expect": {"kind": "contains", "text": "a"}, "soft": "yes"},
    ],
)
def test_malformed_structured_checks_are_refused(data: dict[str, object]) -> None:
    with pytest.raises(CheckError):
        Check.from_json(data)


# --- expectations --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expect", "output", "passes"),
    [
        (Expectation("empty"), "", True),
        (Expectation("empty"), "\n  \n", True),
        (Expectation("empty"), "x\n", False),
        (Expectation("contains", "b c"), "a b c d\n", True),
        (Expectation("contains", "b  c"), "a b c d\n", False),
        (Expectation("equals", "one"), "one\n", True),
        (Expectation("equals", "one"), "one\r\n", True),
        (Expectation("equals", "one"), "one two\n", False),
        (Expectation("equals", "one"), "one\ntwo\n", False),
        (Expectation("matches", "^b"), "a\nb\n", True),
        (Expectation("matches", "^c"), "a\nb\n", False),
        (Expectation("lines", "2"), "a\nb\n", True),
        (Expectation("lines", "2"), "a\nb", True),
        (Expectation("lines", "0"), "", True),
        (Expectation("lines", "1"), "a\nb\n", False),
    ],
)
def test_expectations_decide_on_raw_output(expect: Expectation, output: str, passes: bool) -> None:
    assert meets(expect, output) is passes


# --- containment ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("docs/a.md", None),
        ("docs/new-file.md", None),
        ("./docs/a.md", None),
        ("docs//a.md", None),
        ("docs/inner.md", None),
        ("newdir/deeper/file.md", None),
        ("/etc/passwd", "absolute"),
        ("../root-evil/secret.txt", ".."),
        ("docs/../../root-evil/secret.txt", ".."),
        ("docs/..", ".."),
        ("to-evil/secret.txt", "symlink escape"),
        ("to-evil/new.txt", "symlink escape"),
        ("up/root-evil/secret.txt", "symlink escape"),
        ("docs/evil.md", "symlink escape"),
        ("docs/dangling.md", "symlink escape"),
        (".git/config", "git internals"),
        ("gitcfg", "git internals"),
        (".", "outside the root"),
        ("", "unparseable"),
    ],
)
def test_containment(links: Path, token: str, why: str | None) -> None:
    verdict = contain(links, token)
    assert verdict.why == why
    assert verdict.ok is (why is None)
    if why is None:
        assert verdict.resolved is not None
        assert str(verdict.resolved).startswith(os.path.realpath(links) + os.sep)


def test_sibling_with_the_root_as_prefix_is_outside(checks_repo: Path, tmp_path: Path) -> None:
    # A bare prefix match on "<root>" would admit "<root>-evil".
    (checks_repo / "sib").symlink_to(tmp_path / "root-evil")
    assert str(tmp_path / "root-evil").startswith(str(checks_repo))
    assert contain(checks_repo, "sib/secret.txt").why == "symlink escape"


# --- running checks inside the boundary -------------------------------------------------------
def run(text: str, root: Path, **kw: object) -> CheckResult:
    return run_check(Check.parse(text), root, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "output"),
    [
        ("read docs/a.md:1 → contains alpha", "alpha\n"),
        ("read docs/a.md:2-3 → contains beta", "beta gamma\nexample-tool.sh here\n"),
        ("read docs/a.md:3-9 → contains here", "example-tool.sh here\n"),
        ("read docs/a.md:9 → empty", ""),
    ],
)
def test_read_outputs_the_lines_verbatim(checks_repo: Path, text: str, output: str) -> None:
    result = run(text, checks_repo)
    assert result.ran and result.passed
    assert result.output == output
    assert result.quoted_from is not None and result.quoted_from.startswith("docs/a.md:")


def test_read_keeps_crlf_out_of_the_output_and_reports_missing_files(checks_repo: Path) -> None:
    (checks_repo / "docs" / "crlf.md").write_bytes(b"one\r\ntwo\r\n")
    assert run("read docs/crlf.md:2 → equals two", checks_repo).output == "two\n"
    missing = run("read docs/gone.md:1 → empty", checks_repo)
    assert missing.ran and missing.passed
    assert missing.error is not None and "no such file" in missing.error


def test_grep_output_is_what_grep_rn_prints(checks_repo: Path) -> None:
    (checks_repo / "docs" / "sub").mkdir()
    (checks_repo / "docs" / "sub" / "c.md").write_text("beta in sub\n")
    result = run("grep beta docs → lines 2", checks_repo)
    assert result.ran and result.passed
    if shutil.which("grep"):
        real = subprocess.run(
            ["grep", "-rn", "beta", "docs"], cwd=checks_repo, capture_output=True, check=False
        )
        assert sorted(result.output.splitlines()) == sorted(real.stdout.decode().splitlines())
    assert result.output == "docs/a.md:2:beta gamma\ndocs/sub/c.md:1:beta in sub\n"


@pytest.mark.parametrize(
    ("text", "output"),
    [
        ("grep -i beta docs → lines 2", "docs/a.md:2:beta gamma\ndocs/b.md:2:BETA upper\n"),
        ("grep -F . docs/b.md → empty", ""),
        ("grep . docs/b.md → lines 2", "docs/b.md:1:nothing\ndocs/b.md:2:BETA upper\n"),
        ("grep -F example-tool.sh . → lines 1", "./docs/a.md:3:example-tool.sh here\n"),
        ("grep alpha docs/a.md src → lines 1", "docs/a.md:1:alpha\n"),
    ],
)
def test_grep_flags_and_operands(checks_repo: Path, text: str, output: str) -> None:
    result = run(text, checks_repo)
    assert result.output == output
    assert result.passed


def test_grep_never_reads_outside_the_tree(links: Path) -> None:
    escaped = run("grep stolen to-evil → empty", links)
    assert not escaped.ran and "symlink escape" in (escaped.why_not_run or "")
    # Recursing from the root never follows the symlinks out, nor reads .git.
    whole = run("grep -F stolen . → empty", links)
    assert whole.ran and whole.output == ""
    gitdir = run("grep -F [core] . → empty", links)
    assert gitdir.output == ""


def test_a_missing_grep_operand_is_an_error_not_a_refusal(checks_repo: Path) -> None:
    result = run("grep x docs/gone.md → empty", checks_repo)
    assert result.ran and result.passed
    assert "No such file" in (result.error or "")


def test_catastrophic_regex_is_cut_off(checks_repo: Path) -> None:
    (checks_repo / "docs" / "slow.md").write_text("a" * 40 + "b\n")
    result = run("grep '(a+)+$' docs/slow.md → empty", checks_repo, regex_timeout=0.5)
    assert not result.ran
    assert "timed out" in (result.why_not_run or "")
    expectation = run("read docs/slow.md:1 → matches '(a+)+$'", checks_repo, regex_timeout=0.5)
    assert not expectation.ran


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("*.md", ["a.md"], ["docs/a.md", "a.mdx"]),
        ("docs/*.md", ["docs/a.md"], ["docs/sub/a.md", "a.md"]),
        ("**/*.md", ["a.md", "docs/a.md", "docs/sub/a.md"], ["a.py"]),
        ("docs/**", ["docs/a", "docs/x/y"], ["doc/a"]),
        ("src/?.py", ["src/x.py"], ["src/xy.py"]),
        ("[ab].md", ["a.md", "b.md"], ["c.md"]),
        ("[!ab].md", ["c.md"], ["a.md"]),
    ],
)
def test_glob_translation(pattern: str, matches: list[str], misses: list[str]) -> None:
    rx = glob_regex(pattern)
    assert all(rx.match(m) for m in matches)
    assert not any(rx.match(m) for m in misses)


def test_glob_lists_contained_paths_one_per_line(links: Path) -> None:
    result = run("glob **/*.md → contains docs/a.md", links)
    assert result.passed
    lines = result.output.splitlines()
    assert lines == sorted(lines)
    assert "docs/a.md" in lines and "docs/inner.md" in lines
    assert "docs/evil.md" not in lines and "docs/dangling.md" not in lines
    assert not any(line.startswith((".git/", "to-evil/", "up/")) for line in lines)
    assert run("glob to-evil/* → empty", links).output == ""


def test_glob_lists_directories_too(checks_repo: Path) -> None:
    assert run("glob docs → equals docs", checks_repo).passed
    assert run("glob gone → empty", checks_repo).passed
    assert run("glob docs/** → lines 2", checks_repo).output == "docs/a.md\ndocs/b.md\n"


@pytest.mark.parametrize(
    ("text", "paths"),
    [
        ("read docs/a.md:3 → empty", ["docs/a.md"]),
        ("grep -i x . docs src/x.py → empty", ["docs", "src/x.py"]),
        ("git log --oneline -- docs/a.md → empty", ["docs/a.md"]),
        ("glob **/*.md → empty", []),
        ("run cat docs/a.md → empty", []),
    ],
)
def test_path_operands(checks_repo: Path, text: str, paths: list[str]) -> None:
    assert Check.parse(text).path_operands(exists_in(checks_repo)) == paths


def test_git_checks_print_gits_own_output(checks_repo: Path) -> None:
    result = run("git log --oneline → lines 1", checks_repo)
    assert result.passed
    assert result.output == git(checks_repo, "log", "--oneline")
    (checks_repo / "docs" / "a.md").write_text("changed\n")
    status = run("git status --porcelain → contains docs/a.md", checks_repo)
    assert status.passed and status.output == git(checks_repo, "status", "--porcelain")
    blame = run("git blame -L 1,1 docs/b.md → contains nothing", checks_repo)
    assert blame.passed and "nothing" in blame.output
    bad = run("git show no-such-rev → empty", checks_repo)
    assert bad.ran and bad.error and "exit status" in bad.error
    assert bad.passed  # decided on output, never on the exit status


def _marker_script(tmp_path: Path, name: str) -> tuple[Path, Path]:
    marker = tmp_path / f"{name}.ran"
    script = tmp_path / f"{name}.sh"
    script.write_text(f'#!/bin/sh\ntouch {marker}\ncat "$1" 2>/dev/null\nexit 0\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, marker


def test_repository_config_cannot_turn_a_read_into_a_run(checks_repo: Path, tmp_path: Path) -> None:
    external, external_ran = _marker_script(tmp_path, "external")
    textconv, textconv_ran = _marker_script(tmp_path, "textconv")
    fsmonitor, fsmonitor_ran = _marker_script(tmp_path, "fsmonitor")
    git(checks_repo, "config", "diff.external", str(external))
    git(checks_repo, "config", "diff.evil.textconv", str(textconv))
    (checks_repo / ".gitattributes").write_text("*.md diff=evil\n")
    git(checks_repo, "add", ".gitattributes")
    git(checks_repo, "commit", "-qm", "attrs")
    (checks_repo / "docs" / "a.md").write_text("edited\n")
    # Sanity: plain git does run them, so the assertions below can fail.
    subprocess.run(["git", "diff"], cwd=checks_repo, capture_output=True, check=False)
    subprocess.run(["git", "diff", "--no-ext-diff"], cwd=checks_repo, capture_output=True, check=False)
    assert external_ran.exists() and textconv_ran.exists()
    external_ran.unlink()
    textconv_ran.unlink()
    git(checks_repo, "config", "core.fsmonitor", str(fsmonitor))
    subprocess.run(["git", "status"], cwd=checks_repo, capture_output=True, check=False)
    assert fsmonitor_ran.exists()
    fsmonitor_ran.unlink()
    for text in (
        "git diff → contains edited",
        "git log -p -n1 → contains diff",
        "git show HEAD → contains diff",
        "git status → contains a.md",
    ):
        assert run(text, checks_repo).ran
    assert not external_ran.exists()
    assert not textconv_ran.exists()
    assert not fsmonitor_ran.exists()


def test_git_path_operands_are_contained_at_run_time(links: Path) -> None:
    result = run("git log -- to-evil/secret.txt → empty", links)
    assert not result.ran and "symlink escape" in (result.why_not_run or "")


# --- outside the boundary -------------------------------------------------------------------
def test_run_checks_need_approval_and_scrub_the_environment(
    checks_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-1234567890")
    check = Check.parse("run env → contains PATH=")
    refused = run_check(check, checks_repo)
    assert not refused.ran and "not approved" in (refused.why_not_run or "")
    approved = run_check(check, checks_repo, approved=True)
    assert approved.ran and approved.passed
    assert "tok-1234567890" not in approved.output


def test_run_checks_pass_on_output_not_exit_status(checks_repo: Path) -> None:
    failing_exit = run("run sh -c 'echo ok && exit 3' → contains ok", checks_repo, approved=True)
    assert failing_exit.passed and failing_exit.error == "exit status 3"
    clean_exit = run("run sh -c 'echo nope' → contains ok", checks_repo, approved=True)
    assert not clean_exit.passed and clean_exit.error is None
    missing = run("run no-such-binary-xyz → empty", checks_repo, approved=True)
    assert not missing.ran


def test_run_never_goes_through_a_shell(checks_repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    result = run(f"run echo 'hi && touch {marker}' → contains touch", checks_repo, approved=True)
    assert result.passed
    assert not marker.exists()


def test_run_plan_respects_approvals_and_inside_only(checks_repo: Path) -> None:
    checks = parse_plan("read docs/a.md:1 → equals alpha; run echo yes → contains yes")
    none = run_plan(checks, checks_repo)
    assert [r.ran for r in none.results] == [True, False]
    assert none.passed  # every check that ran passed
    approved = run_plan(checks, checks_repo, approved=lambda c: c.kind == "run")
    assert [r.ran for r in approved.results] == [True, True]
    gate = run_plan(checks, checks_repo, approved=lambda c: True, inside_only=True)
    assert [r.ran for r in gate.results] == [True, False]
    assert not PlanResult(()).passed


# --- the plan-rejection test ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("plan", "marked", "rejected"),
    [
        ("grep -F example-tool.sh docs → empty", (), False),
        ("grep -F removed-long-ago docs → empty", (), True),
        ("grep -F removed-long-ago docs → empty; read docs/a.md:1 → equals alpha", (), True),
        ("grep -F removed-long-ago docs → empty; grep -F example-tool.sh docs → empty", (), False),
        ("read docs/a.md:1 → contains 'new text'", (0,), True),
        ("read docs/a.md:1 → contains 'new text'; grep -F example-tool.sh docs → empty", (0,), False),
        ("run pytest -q → contains passed", (), False),
        ("run pytest -q → contains passed; grep -F removed-long-ago docs → empty", (), False),
        ("run pytest -q → contains passed", (0,), True),
    ],
)
def test_plan_rejection(checks_repo: Path, plan: str, marked: tuple[int, ...], rejected: bool) -> None:
    verdict = plan_rejection(parse_plan(plan), checks_repo, absent_text_only=marked)
    assert verdict.rejected is rejected, verdict.why


def test_plan_rejection_never_runs_outside_the_boundary(checks_repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    plan = parse_plan(f"run touch {marker} → empty")
    assert not plan_rejection(plan, checks_repo).rejected
    assert not marker.exists()


# --- approvals --------------------------------------------------------------------------------
def test_approvals_are_bound_to_finding_plan_and_argv() -> None:
    client = fakeredis.FakeRedis()
    plan = parse_plan("grep -F x docs → empty; run pytest -q → contains passed")
    mine = Approvals(FindingsStore(client), "repo1", "review.md#DOC-1")
    assert not mine.is_approved(plan, ["pytest", "-q"])
    mine.approve(plan, ["pytest", "-q"], who="alice", at="2026-01-01T00:00:00Z")
    assert mine.is_approved(plan, ["pytest", "-q"])
    assert mine.predicate(plan)(plan[1]) is True
    assert mine.predicate(plan)(plan[0]) is False
    assert not mine.is_approved(plan, ["pytest", "-q", "-x"])
    assert not mine.is_approved(plan, ["pytest"])
    other_plan = parse_plan("grep -F y docs → empty; run pytest -q → contains passed")
    assert not mine.is_approved(other_plan, ["pytest", "-q"])
    findings = FindingsStore(client)
    assert not Approvals(findings, "repo1", "review.md#DOC-2").is_approved(plan, ["pytest", "-q"])
    assert not Approvals(findings, "repo2", "review.md#DOC-1").is_approved(plan, ["pytest", "-q"])
    with pytest.raises(CheckError, match="not a `run` check"):
        mine.approve(plan, ["rm", "-rf", "/"], who="alice", at="now")
    mine.revoke_all()
    assert not mine.is_approved(plan, ["pytest", "-q"])


def test_an_approval_for_the_wrong_argv_cannot_be_smuggled_under_a_field(tmp_path: Path) -> None:
    client = fakeredis.FakeRedis()
    plan = parse_plan("run pytest -q → contains passed")
    approvals = Approvals(FindingsStore(client), "r", "f")
    approvals.approve(plan, ["pytest", "-q"], who="a", at="t")
    key = next(iter(client.keys()))
    (field,) = client.hkeys(key)
    client.hset(key, field, '{"argv": ["sh", "-c", "evil"], "plan": "x"}')
    assert not approvals.is_approved(plan, ["pytest", "-q"])
