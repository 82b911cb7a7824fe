"""The docs build fails on what it exists to catch: `make docs` itself, on a copy of the site's
sources with faults planted, and the stray-heading hook's rule against what Python-Markdown
renders.

The copy holds what the build reads (mkdocs.yml, docs/, the included BENCHMARKS.md and
benchmarks/LOG.md) with the clone's packages linked in (the hooks and mkdocstrings read them);
`make` runs the repository's Makefile in it, its `.venv` a link to the environment running the
tests, the venv stamp assumed current (``-o``: the target's own recipe runs, nothing is
reinstalled). One build, about 3 s of CPU; it has no deadline (a loaded machine is slower, not
wrong).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import markdown  # type: ignore[import-untyped]  # Python-Markdown ships no types: mkdocs renders with it
import pytest

REPO = Path(__file__).resolve().parents[2]
LINKED = ("specbind", "core", "runtime", "generated", "generator", "specs")


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "stray_headings", REPO / "docs" / "hooks" / "stray_headings.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _site_copy(base: Path) -> Path:
    copy = base / "clone"
    copy.mkdir()
    shutil.copy2(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(REPO / "docs", copy / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "BENCHMARKS.md", copy / "BENCHMARKS.md")
    (copy / "benchmarks").mkdir()
    shutil.copy2(REPO / "benchmarks" / "LOG.md", copy / "benchmarks" / "LOG.md")
    for name in LINKED:
        (copy / name).symlink_to(REPO / name, target_is_directory=True)
    (copy / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return copy


def _make_docs(copy: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(copy), "-f", str(REPO / "Makefile"),
         "-o", ".venv/.installed", "docs", f"DOCS_SITE={site}"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip


def test_make_docs_fails_on_a_planted_broken_anchor_and_a_stray_heading_naming_each(
    tmp_path: Path,
) -> None:
    copy = _site_copy(tmp_path)
    guide = copy / "docs" / "guides" / "bound-files.md"
    guide.write_text(
        guide.read_text(encoding="utf-8")
        + "\nSee [the log](../benchmarks/log.md#no-such-heading-anywhere).\n",
        encoding="utf-8",
    )
    bench = copy / "BENCHMARKS.md"
    lines = bench.read_text(encoding="utf-8").splitlines(keepends=True)
    # A sentence wrapped so that a line begins with an issue number, inside the first paragraph
    # after the title: the fault the issue found on BENCHMARKS.md's line 43.
    at = next(i for i, line in enumerate(lines) if i > 2 and line.strip() and line[0].isalpha())
    lines.insert(at + 1, "#77: a wrapped reference to an issue\n")
    bench.write_text("".join(lines), encoding="utf-8")

    run = _make_docs(copy, tmp_path / "site")
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "#no-such-heading-anywhere" in out and "guides/bound-files.md" in out, out
    assert "benchmarks/index.md" in out and "'#77: a wrapped reference to an issue'" in out, out
    # Nothing else failed the copy: the two planted faults are the only warnings.
    assert "Aborted with 2 warnings in strict mode" in out, out


# (Markdown, the line the hook must flag or None). Each case is also rendered by Python-Markdown
# below, so the rule is held to what mkdocs really renders, not to the hook's own regex.
CASES = [
    ("took 0.11 (issue\n#21: tiny DeepSeek-V3 checkpoints).\n", "#21: tiny DeepSeek-V3 checkpoints)."),
    ("#stray\n", "#stray"),
    ("- #21 in a list item\n", "- #21 in a list item"),
    ("> #21 in a quote\n", "> #21 in a quote"),
    ("# A real heading\n\ntext\n", None),
    ("text with \\#21 escaped\n", None),
    ("```sh\n#!/bin/sh\n#comment\n```\n", None),
    ("- item\n\n    ```python\n    #comment\n    ```\n", None),
    ("````md\n```\n#21 still code\n````\n", None),
]  # fmt: skip


@pytest.mark.parametrize(("source", "flagged"), CASES)
def test_the_hook_flags_exactly_the_lines_python_markdown_makes_headings_without_a_space(
    source: str, flagged: str | None
) -> None:
    hook = _hook()
    html = markdown.markdown(
        source, extensions=["toc", "admonition", "attr_list", "tables", "pymdownx.superfences"]
    )
    headings = re.findall(r"<h[1-6][^>]*>(.*?)</h[1-6]>", html)
    found = [line for _, line in hook.stray_headings(source)]
    if flagged is None:
        assert found == [], (found, html)
        assert all(not h.strip() or source.count("# " + h) for h in headings), html
    else:
        assert found == [flagged], (found, html)
        assert headings, f"Python-Markdown renders no heading from {source!r}: {html}"
