"""The files ``specbind generate`` plans, each with the spec that asks for it: two on one path
are refused.

Invariant: a planned path is taken once. Two outputs collide when their paths are equal, equal
but for case (one file on a case-insensitive filesystem: macOS, Windows), or name one Python
module (``x.py`` beside ``x/__init__.py``: the package shadows the module). The refusal is one
line naming the path and both outputs' sources, raised while planning, before anything is
formatted or written.
Trap: a dict assignment would let the second output replace the first without a word (a block
named ``schemes`` under the scheme registry; an engine's variant of block ``mamba2`` under the
layout of model ``mamba2``, whose binder then lacks the variant's fields at bind).
"""

from __future__ import annotations

from specbind.core.errors import GenerateError


def _key(rel: str) -> str:
    """What two paths share when they are one file, or one module, for some filesystem."""
    key = rel.casefold()
    if key.endswith("/__init__.py"):
        return key.removesuffix("/__init__.py") + " (module)"
    if key.endswith(".py"):
        return key.removesuffix(".py") + " (module)"
    return key


class Plan:
    """Relative path -> text, in the order added; ``origin`` says which spec asked for each."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self._taken: dict[str, tuple[str, str]] = {}  # _key(rel) -> (rel, origin)

    def add(self, rel: str, text: str, origin: str) -> None:
        key = _key(rel)
        if key in self._taken:
            first, by = self._taken[key]
            where = f"generated/{rel}"
            if first != rel:
                how = "one module" if first.casefold() != rel.casefold() else "equal but for case"
                where = f"generated/{first} and generated/{rel} ({how})"
            raise GenerateError(f"two outputs on one path, {where}: {by} and {origin}; rename one")
        self._taken[key] = (rel, origin)
        self.files[rel] = text
