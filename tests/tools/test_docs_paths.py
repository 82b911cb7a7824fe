"""Every file the README, BENCHMARKS.md and the docs name is there.

A path in backticks that starts at a top-level folder of the repository (`runtime/bind/bind.py`,
`tests/tools/test_api.py`, `specs/blocks/`) must exist, so a moved or renamed file shows here, not to
a reader; a path with a placeholder (`*`, `{e}`, `<engine>`) is a pattern and is skipped. The
README's and BENCHMARKS.md's own links (GitHub renders them; `mkdocs build --strict` checks the
docs' links) must point at files too, and their links to a heading at a heading GitHub names
so. The dated log (benchmarks/LOG.md) is left out: it records
paths as they were.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").rglob("*.md"))]
TOP = ("core", "runtime", "generator", "generated", "specbind", "specs", "tests", "examples",
       "docs", "benchmarks", ".ci")  # fmt: skip
_PATH = re.compile(r"`((?:" + "|".join(re.escape(t) for t in TOP) + r")/[^`\s]*)`")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = []
    for page in PAGES:
        for m in _PATH.finditer(page.read_text(encoding="utf-8")):
            path = m[1].rstrip(".,:;")
            if any(c in path for c in "*{<"):
                continue
            if not (REPO / path).exists():
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert not missing, "\n".join(missing)


def test_the_readme_and_benchmarks_md_link_only_to_files_that_exist() -> None:
    missing = []
    for page in (REPO / "README.md", REPO / "BENCHMARKS.md"):
        for m in _LINK.finditer(page.read_text(encoding="utf-8")):
            target = m[1]
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.name}: {target}")
    assert not missing, "\n".join(missing)


def test_the_check_sees_a_missing_path() -> None:
    assert _PATH.findall("see `runtime/nothing_here.py` and `specs/blocks/{x}.yaml`") == [
        "runtime/nothing_here.py",
        "specs/blocks/{x}.yaml",
    ]
    assert not (REPO / "runtime" / "nothing_here.py").exists()


# A link to a heading: `](#anchor)` on the page, `](path.md#anchor)` on another.
_ANCHOR = re.compile(r"\]\(([^)#\s]*\.md|)#([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the page's headings (github-slugger, which README.md and
    BENCHMARKS.md are read with there): lower case, every character but letters, digits, `_`,
    `-` and spaces dropped (code spans' backticks, `#`, `.`, `:` ...), each space a `-`; a repeated
    heading's anchor gets `-1`, `-2` ..."""
    seen: dict[str, int] = {}
    out, fenced = set(), False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_anchors(page: Path, root: Path = REPO) -> list[str]:
    """Each link of ``page`` to a heading of a Markdown file that has no such heading."""
    broken = []
    for m in _ANCHOR.finditer(page.read_text(encoding="utf-8")):
        target = page if not m[1] else page.parent / m[1]
        if target.is_file() and m[2] not in github_anchors(target.read_text(encoding="utf-8")):
            broken.append(f"{page.relative_to(root)}: {m[1]}#{m[2]}")
    return broken


def test_the_readme_and_benchmarks_md_link_only_to_headings_that_exist_as_github_names_them() -> (
    None
):
    """mkdocs --strict checks the site's anchors; README.md (not in the site) and BENCHMARKS.md
    are read on GitHub too, whose anchors this checks."""
    broken = broken_anchors(REPO / "README.md") + broken_anchors(REPO / "BENCHMARKS.md")
    assert not broken, "\n".join(broken)


def test_the_anchor_check_sees_a_heading_that_was_renamed(tmp_path: Path) -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert "](#supported-models)" in text and "\n## Supported models\n" in text
    (tmp_path / "README.md").write_text(
        text.replace("\n## Supported models\n", "\n## Models supported\n"), encoding="utf-8"
    )
    assert broken_anchors(tmp_path / "README.md", tmp_path) == ["README.md: #supported-models"]
    assert "issue-22-reload-digests-python--m-benchmarksdigest" in github_anchors(
        "## Issue #22: reload digests (`python -m benchmarks.digest`)\n"
    )
    assert github_anchors("# A\n```\n# not a heading\n```\n# A\n") == {"a", "a-1"}
