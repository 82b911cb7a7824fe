"""Python literals and comments for generated code."""

from __future__ import annotations

import re

from specbind.core.errors import GenerateError

_COMMENT_OK = re.compile(r"^[\x20-\x7e\u00b7\u2014\u2192]*$")


def comment(text: object) -> str:
    """One printable line for a comment or docstring; anything else is refused, not escaped."""
    s = " ".join(str(text).split())
    if not _COMMENT_OK.match(s) or '"""' in s:
        raise GenerateError(f"refusing to put {s!r} in generated code")
    return s


def py_literal(value: object) -> str:
    """``repr``, with double quotes where that needs no escapes (ruff format's style)."""
    r = repr(value)
    if isinstance(value, str) and r.startswith("'") and '"' not in value:
        r = '"' + r[1:-1] + '"'
    return r
