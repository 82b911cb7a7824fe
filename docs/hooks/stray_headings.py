"""mkdocs hook: a line the site renders as a heading but GitHub renders as text is a warning.

Python-Markdown (what mkdocs renders with) makes a heading of any line that begins with ``#``:
``#21: tiny checkpoints`` too, even in the middle of a paragraph, in a list item or a quote
(markdown/blockprocessors.py, ``HashHeaderProcessor.RE``: no space after the hashes). CommonMark
(GitHub, where README.md, BENCHMARKS.md and benchmarks/LOG.md are read as well) needs a space or
the line's end after them (CommonMark 0.31, 4.2 ATX headings). So a wrapped sentence whose line
begins with an issue number reads right on GitHub and shows in the site as a stray heading. Each
such line outside fenced code is logged as a warning, which ``mkdocs build --strict``
(``make docs``) counts and fails on; the fix is a re-wrap, or ``\\#`` (text in both).
Invariant: runs after generated_pages.py (mkdocs.yml lists it second; hooks run in that order),
so a file a page includes is checked as the page shows it.
Traps: the warning must go to a logger under ``mkdocs``: mkdocs' strict counter is a handler on
that logger (mkdocs/commands/build.py), and a record of any other logger is never counted. A line
inside a fence is code in both renderers, so fences (``` and ~~~, indented in a list or not) are
skipped. A line that only starts like a container and a ``#`` (``- #21``, ``> #21``) is flagged
too: Python-Markdown renders it a heading inside the item or quote, CommonMark as text.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger("mkdocs.hooks.stray_headings")

# Optional indent and container markers (quote, bullet, ordered item), then hashes and a
# character that is neither a hash nor white space.
_STRAY = re.compile(r"^[ \t]*(?:(?:>|[-*+]|\d+[.)])[ \t]*)*#+[^#\s]")
_FENCE = re.compile(r"^[ \t]*(?:>[ \t]*)*(`{3,}|~{3,})")


def stray_headings(markdown: str) -> list[tuple[int, str]]:
    """The (1-based line, line) of each line outside fenced code that Python-Markdown renders as
    a heading and CommonMark as text."""
    found = []
    fence = ""  # the open fence's run of backticks or tildes; "" outside code
    for number, line in enumerate(markdown.splitlines(), start=1):
        m = _FENCE.match(line)
        if m:
            run = m[1]
            if not fence:
                fence = run
            elif run[0] == fence[0] and len(run) >= len(fence) and not line[m.end() :].strip():
                fence = ""
            continue
        if not fence and _STRAY.match(line):
            found.append((number, line))
    return found


def on_page_markdown(markdown: str, page: object, config: object, files: object) -> str:
    """Each stray heading of the page (its included files' lines among them) warned about."""
    page_path = str(getattr(getattr(page, "file", None), "src_uri", ""))
    for number, line in stray_headings(markdown):
        shown = line if len(line) <= 100 else line[:97] + "..."
        log.warning(
            f"docs: {page_path} line {number} (as built, included files in place) renders as a "
            f"heading here but as text on GitHub (no space after '#'): {shown!r}; re-wrap it, "
            "or write '\\#' for a literal hash"
        )
    return markdown
