"""Python literals for generated code."""

from __future__ import annotations


def py_literal(value: object) -> str:
    """``repr``, with double quotes where that needs no escapes (ruff format's style)."""
    r = repr(value)
    if isinstance(value, str) and r.startswith("'") and '"' not in value:
        r = '"' + r[1:-1] + '"'
    return r
