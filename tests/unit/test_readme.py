"""The docs contract: two commands on top, a short README linking docs/, every setting, no dead link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dispatchq.settings import Settings, env_name

ROOT = Path(__file__).resolve().parents[2]
README_PATH = ROOT / "README.md"
README = README_PATH.read_text(encoding="utf-8")
DOCS = ROOT / "docs"
MAX_README_BYTES = 12 * 1024
#: The pages a newcomer is sent to from the README; a later page adds itself here and there.
PAGES = (
    "concepts",
    "configuration",
    "operations",
    "triage",
    "serve",
    "gate",
    "security",
    "many-hosts",
    "layout",
    "storage",
)

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"(`+).+?\1", re.DOTALL)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _top_block() -> re.Match[str]:
    block = re.search(r"```sh\n(.*?)```", README, re.DOTALL)
    assert block is not None, "the README must open with a shell block"
    assert block.start() < README.index("## "), "the commands come before any section"
    return block


def _top_commands() -> list[str]:
    return [line.split("#", 1)[0].strip() for line in _top_block().group(1).splitlines() if line.strip()]


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", _FENCE.sub("", markdown), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def broken_links(markdown: str, where: Path) -> list[str]:
    """Relative links in `markdown` (a file in `where`) whose file, or heading, does not exist."""
    prose = _INLINE_CODE.sub("", _FENCE.sub("", markdown))
    broken = []
    for target in _LINK.findall(prose):
        if _EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        file = (where / path).resolve() if path else None
        if file is not None and not file.exists():
            broken.append(target)
        elif anchor and (file is None or file.suffix == ".md"):
            text = markdown if file is None else file.read_text(encoding="utf-8")
            if anchor not in _anchors(text):
                broken.append(target)
    return broken


def test_readme_opens_with_exactly_two_commands() -> None:
    commands = _top_commands()
    assert len(commands) == 2
    assert all(command.startswith("python3 ") for command in commands), "they need nothing but python3"


def test_the_fast_loop_is_one_sentence_under_the_commands() -> None:
    after = README[_top_block().end() :].strip()
    sentence = after.split("\n\n", 1)[0]
    assert not sentence.startswith(("```", "#")), "prose, not another command block or a section"
    assert "`python3 ops/dev.py check`" in sentence
    assert "(docs/layout.md)" in sentence


def test_ci_runs_the_readmes_test_command() -> None:
    test_command = _top_commands()[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(rf"^exec {re.escape(test_command)}$", ci, re.MULTILINE), ci


def test_every_setting_is_documented_with_its_variable() -> None:
    configuration = (DOCS / "configuration.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip() for line in configuration.splitlines() if line.startswith("| `")}
    missing = [env_name(name) for name in Settings.model_fields if f"`{env_name(name)}`" not in rows]
    assert missing == []


def test_the_readme_stays_short() -> None:
    size = len(README_PATH.read_bytes())
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes: move the detail into a docs/ page"


def test_the_readme_links_every_docs_page() -> None:
    missing = [page for page in PAGES if f"](docs/{page}.md)" not in README]
    assert missing == []
    unlisted = sorted(p.stem for p in DOCS.glob("*.md") if f"](docs/{p.name})" not in README)
    assert unlisted == [], "every docs page gets its one line in the README's Documentation list"


@pytest.mark.parametrize(
    "path", [README_PATH, *sorted(DOCS.glob("*.md"))], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_relative_link_points_to_something_that_exists(path: Path) -> None:
    assert broken_links(path.read_text(encoding="utf-8"), path.parent) == []


def test_the_link_check_finds_a_dead_link() -> None:
    text = (
        "# Top\n\n[ok](README.md) [gone](docs/nowhere.md) [bad anchor](docs/layout.md#no-such-heading) "
        "[here](#top) [missing here](#nowhere) [web](https://example.com/x) `[code](not-a-link)`\n"
    )
    assert broken_links(text, ROOT) == ["docs/nowhere.md", "docs/layout.md#no-such-heading", "#nowhere"]


def test_every_procfile_process_is_a_real_command() -> None:
    from dispatchq.cli import COMMANDS

    for line in (ROOT / "Procfile").read_text().splitlines():
        _name, command = line.split(":", 1)
        argv = command.split()
        assert argv[0] == "dispatchq", line
        assert argv[1] in COMMANDS, line
