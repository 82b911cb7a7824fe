"""mkdocs hook: the pages made at build time, so they cannot drift from the code.

A page whose Markdown holds a marker line gets it replaced before mkdocs renders it:
- ``<!-- generated: cli -->``: every command's usage and arguments, from ``specbind.cli.parser``
  (``specbind.cli_reference.cli_markdown``);
- ``<!-- generated: models -->``: the supported models, from the generated tables
  (``specbind.cli_reference.models_markdown``, the rows ``specbind models`` prints);
- ``<!-- include: PATH -->``: a file of the repository outside ``docs/`` (``BENCHMARKS.md``,
  ``benchmarks/LOG.md``), its links into ``docs/`` made relative to the page (the same file then
  reads right on its own, at the top of the repository, and in the site).
Invariant: the clone's own ``specbind`` is the one imported (its root goes first on sys.path,
at call time),
whatever else is installed, so the site documents the tree it was built from.
Trap: mkdocs loads a hook by path, as a module without a package; it imports nothing of mkdocs
here, and its arguments are typed as plain objects.
"""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # docs/hooks/x.py -> the repository root

_MARKER = re.compile(r"^<!-- (generated|include): ([\w./-]+) -->$", re.MULTILINE)
# A Markdown link or image target: `](target)` or `](target#anchor)`.
_LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")
# The repository files the site includes, by the docs page that includes them.
INCLUDED = {"BENCHMARKS.md": "benchmarks/index.md", "benchmarks/LOG.md": "benchmarks/log.md"}


def _generated(name: str) -> str:
    # At call time, not at import: a plugin may restore sys.path after the hooks are loaded.
    if sys.path[:1] != [str(ROOT)]:
        sys.path.insert(0, str(ROOT))
    from specbind.cli_reference import cli_markdown, models_markdown

    makers = {"cli": cli_markdown, "models": models_markdown}
    if name not in makers:
        raise ValueError(f"docs: unknown generated page part {name!r} (known: {sorted(makers)})")
    return makers[name]()


def _relink(target: str, source: str, page: str) -> str:
    """``target``, a link of the repository file ``source``, as the docs page ``page`` links it:
    into ``docs/`` relative to the page, to an included file as its page; else unchanged (an
    address, or a path mkdocs --strict then reports)."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return target
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(source), target))
    here = posixpath.dirname(page) or "."
    if resolved.startswith("docs/"):
        return posixpath.relpath(resolved.removeprefix("docs/"), here)
    if resolved in INCLUDED:
        return posixpath.relpath(INCLUDED[resolved], here)
    return target


def _included(path: str, page: str) -> str:
    source = ROOT / path
    if not source.is_file():
        raise ValueError(f"docs: {page} includes {path}, which is not a file of the repository")
    text = source.read_text(encoding="utf-8")
    return _LINK.sub(lambda m: f"]({_relink(m[1], path, page)}{m[2] or ''})", text)


def on_page_markdown(markdown: str, page: object, config: object, files: object) -> str:
    """Each marker of the page replaced by what it names."""
    page_path = str(getattr(getattr(page, "file", None), "src_uri", ""))

    def fill(m: re.Match[str]) -> str:
        kind, name = m[1], m[2]
        return _generated(name) if kind == "generated" else _included(name, page_path)

    return _MARKER.sub(fill, markdown)
