"""Every file the README, BENCHMARKS.md and the docs name is there.

A path in backticks that starts at a top-level folder of the repository (`runtime/bind/bind.py`,
`tests/tools/test_api.py`, `specs/blocks/`) must exist, so a moved or renamed file shows here, not to
a reader; a path with a placeholder (`*`, `{e}`, `<engine>`) is a pattern and is skipped. The
README's and BENCHMARKS.md's own links (GitHub renders them; `mkdocs build --strict` checks the
docs' links) must point at files too. The dated log (benchmarks/LOG.md) is left out: it records
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
