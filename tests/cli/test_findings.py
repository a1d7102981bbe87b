"""`dispatchq findings check|pin`: read-only inspection of a findings report."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from dispatchq.cli import main
from tests.support.cli import REPORT

EXPECTED = {
    "DOC-001": (True, "docs/a.md", 1, None, "decided"),
    "DOC-002": (False, "out/secret.md", 1, "symlink escape", "undecided"),
    "DOC-003": (False, None, None, "no location", "fixed"),
    "DOC-004": (False, "../root-evil/secret.md", 1, "..", "auto"),  # Fix: auto is nobody's question
    "DOC-005": (False, "docs/missing.md", 3, "missing", "dispatched-outcome-unknown"),
    "DOC-006": (False, "/etc/hosts", 1, "absolute", "rejected"),
    "DOC-007": (False, None, None, "no location", "undecided"),
}


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_check_json_shape_and_verdicts(findings_repo: Path) -> None:
    before = sorted(p.name for p in findings_repo.iterdir())
    code, out, _ = invoke(
        "findings", "check", str(findings_repo / "review.md"), "--repo", str(findings_repo), "--json"
    )
    assert code == 1  # DOC-003 has violations
    payload = json.loads(out)
    assert payload["problems"] == []
    got = {
        f["id"]: (
            f["location"]["usable"],
            f["location"]["path"],
            f["location"]["line"],
            f["location"]["why"],
            f["state"],
        )
        for f in payload["findings"]
    }
    assert got == EXPECTED
    for item in payload["findings"]:
        assert set(item) >= {"id", "location", "state", "violations"}
        assert set(item["location"]) == {"usable", "path", "line", "why"}
    doc3 = next(f for f in payload["findings"] if f["id"] == "DOC-003")
    lines = {v["line"] for v in doc3["violations"]}
    assert {14, 15} <= lines
    assert any("first non-blank" in v["message"] for v in doc3["violations"])
    clean = [f["id"] for f in payload["findings"] if not f["violations"]]
    assert "DOC-001" in clean and "DOC-003" not in clean
    assert sorted(p.name for p in findings_repo.iterdir()) == before  # read only: not even a lock file


def test_check_text_output(findings_repo: Path) -> None:
    code, out, _ = invoke("findings", "check", str(findings_repo / "review.md"), "--repo", str(findings_repo))
    assert code == 1
    assert "DOC-001  [MEDIUM]  line 3  needs-decision  state: decided" in out
    assert "  location: docs/a.md:1 (usable)" in out
    assert "  location-less (symlink escape) 'out/secret.md:1'" in out
    assert f"{findings_repo / 'review.md'}:15: **Status:** must be the first non-blank line" in out
    # `check` never starts the embedded server, and this test process's default has none
    # running: the summary is followed by the one line saying tamper was not checked.
    *_, summary, tamper = out.rstrip().splitlines()
    assert summary.endswith("violation(s)")
    assert tamper.startswith("tamper evidence not checked: cannot reach Redis")


def test_check_reads_tamper_evidence_when_redis_is_up(
    findings_repo: Path, redis_server: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCHQ_DATA_DIR", str(redis_server.data_dir))  # type: ignore[attr-defined]
    code, out, _ = invoke("findings", "check", str(findings_repo / "review.md"), "--repo", str(findings_repo))
    assert code == 1
    assert "tamper evidence not checked" not in out
    assert out.rstrip().endswith("violation(s)")


def test_a_clean_report_exits_zero(findings_repo: Path) -> None:
    clean = "### [LOW] A-1: fine\n**Location:** `docs/a.md:1`\n**Fix:** auto\n"
    (findings_repo / "clean.md").write_text(clean)
    code, out, _ = invoke(
        "findings", "check", str(findings_repo / "clean.md"), "--repo", str(findings_repo), "--json"
    )
    assert code == 0
    assert json.loads(out)["findings"][0]["violations"] == []


def test_repo_defaults_to_the_toplevel_of_the_current_directory(
    findings_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(findings_repo / "docs")
    code, out, _ = invoke("findings", "check", "../review.md", "--json")
    assert code == 1
    payload = json.loads(out)
    assert payload["repo"] == str(findings_repo.resolve())
    assert payload["findings"][0]["location"]["usable"] is True


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "no such report"),
        ("binary", ":3: not valid UTF-8"),
        ("directory", "is a directory"),
    ],
)
def test_user_errors_are_one_line_exit_two(findings_repo: Path, setup: str, message: str) -> None:
    path = findings_repo / "bad.md"
    if setup == "binary":
        path.write_bytes(b"### [LOW] A: x\n**Fix:** auto\n\xff\xfe\n")
    elif setup == "directory":
        path.mkdir()
    code, out, err = invoke("findings", "check", str(path), "--repo", str(findings_repo))
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert out == ""


def test_outside_a_repository_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "r.md").write_text(REPORT)
    monkeypatch.chdir(lone)
    code, _, err = invoke("findings", "check", "r.md")
    assert code == 2 and "not inside a git repository" in err


def test_report_level_problems_carry_line_numbers(findings_repo: Path) -> None:
    (findings_repo / "dup.md").write_text("### [LOW] A-1: x\n\n### [LOW] A-1: y\n### [LOW]bad: z\n")
    code, out, _ = invoke(
        "findings", "check", str(findings_repo / "dup.md"), "--repo", str(findings_repo), "--json"
    )
    assert code == 1
    problems = json.loads(out)["problems"]
    assert [p["line"] for p in problems] == [3, 4]


def test_plan_paths_escaping_the_tree_are_flagged(findings_repo: Path) -> None:
    plan = "**Verification-plan:** read out/secret.md:1 → empty; grep -F x docs → empty\n"
    text = "### [LOW] P-1: plan\n**Location:** `docs/a.md:1`\n**Decision:** A — x [u, 2026-01-01]\n" + plan
    (findings_repo / "plan.md").write_text(text)
    code, out, _ = invoke(
        "findings", "check", str(findings_repo / "plan.md"), "--repo", str(findings_repo), "--json"
    )
    assert code == 1
    (item,) = json.loads(out)["findings"]
    assert [v["line"] for v in item["violations"]] == [4]
    assert "out/secret.md refused (symlink escape)" in item["violations"][0]["message"]


def blob(repo: Path, path: str) -> str:
    done = subprocess.run(["git", "hash-object", "--", path], cwd=repo, capture_output=True, check=True)
    return done.stdout.decode().strip()


def test_pin_computes_and_never_writes(findings_repo: Path) -> None:
    report = findings_repo / "review.md"
    before = report.read_bytes()
    code, out, err = invoke("findings", "pin", str(report), "DOC-001", "--repo", str(findings_repo))
    assert code == 0
    line = out.strip()
    assert line.startswith("**Decision-pin:** block=")
    assert line.endswith(f" | docs/a.md={blob(findings_repo, 'docs/a.md')}:edit | scripts/tool.sh=absent:ref")
    assert "no pin recorded" in err
    assert report.read_bytes() == before
    assert not any(p.name.endswith("dispatchq-lock") for p in findings_repo.iterdir())


def test_pin_json_and_comparison_with_the_recorded_pin(findings_repo: Path) -> None:
    report = findings_repo / "review.md"
    _, out, _ = invoke("findings", "pin", str(report), "DOC-001", "--repo", str(findings_repo))
    recorded = out.strip()
    report.write_text(
        REPORT.replace(
            "[user, 2026-08-27]\n\n### [LOW] DOC-002",
            f"[user, 2026-08-27]\n{recorded}\n\n### [LOW] DOC-002",
            1,
        )
    )
    code, out, _ = invoke("findings", "pin", str(report), "DOC-001", "--repo", str(findings_repo), "--json")
    assert code == 0
    payload = json.loads(out)
    assert payload["matches"] is True
    assert payload["line"] == recorded
    assert payload["entries"][0] == {
        "path": "docs/a.md",
        "value": blob(findings_repo, "docs/a.md"),
        "role": "edit",
    }
    assert payload["target"] == "docs/a.md:1"
    (findings_repo / "docs" / "a.md").write_text("changed\n")
    _, out, _ = invoke("findings", "pin", str(report), "DOC-001", "--repo", str(findings_repo), "--json")
    assert json.loads(out)["matches"] is False


def test_pin_names_unpinnable_tokens(findings_repo: Path) -> None:
    text = REPORT.replace("at docs/a.md:1 [user", "at docs/a.md:1 and docs/a.md;id [user", 1)
    (findings_repo / "review.md").write_text(text)
    code, out, err = invoke(
        "findings", "pin", str(findings_repo / "review.md"), "DOC-001", "--repo", str(findings_repo)
    )
    assert code == 0
    assert "docs/a.md;id=unpinnable:ref" in out
    assert "unpinnable: docs/a.md;id:" in err


@pytest.mark.parametrize(
    ("finding", "message"), [("DOC-002", "no live decision"), ("NOPE", "no finding NOPE")]
)
def test_pin_without_a_live_decision_is_a_user_error(findings_repo: Path, finding: str, message: str) -> None:
    code, _, err = invoke(
        "findings", "pin", str(findings_repo / "review.md"), finding, "--repo", str(findings_repo)
    )
    assert code == 2 and message in err


def test_the_group_is_registered_on_the_main_cli() -> None:
    code, out, _ = invoke("findings", "--help")
    assert code == 0 and "check" in out and "pin" in out
