"""A value the user gave, as a one-line message shows it: ``shown(value)``.

Every refusal that echoes what a file or a caller gave (a config.json field, a Hub ``refs/main``,
an API argument) goes through ``shown``, so a hostile value of a megabyte costs a line of a few
hundred characters, not a megabyte line.
Invariants: the result is a Python ``repr`` cut to a bound, whatever the value: a string keeps
its first and last characters with ``...`` between and says how long it was (``'aaaa...aaaa'
(1048576 characters)``); a list, tuple, dict or set shows its first few items and ``...``,
nested at most a few levels, and the whole is cut again past ``LIMIT`` characters; a very large
integer is named by its size, not spelled (``str()`` of one past 4,300 digits raises
``ValueError``); never a newline (``repr`` escapes it).
Why ``reprlib``: the standard library's bounded ``repr`` already cuts strings and containers
without building the whole ``repr`` first; only the length note and huge integers are added.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["NAME_LIMIT", "shown"]

_BITS = 10_000  # past this an integer is named by its size (decimal digits: about 0.3 x bits)
NAME_LIMIT = 160  # a long tensor name still whole; a hostile one cut
LIMIT = 300  # characters of the whole: strings nested in a list are cut each, then the whole


class _Shown(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = NAME_LIMIT
        self.maxother = 80
        self.maxlong = 80
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = 8
        self.maxdict = 6

    def repr_str(self, x: str, level: int) -> str:
        s = super().repr_str(x, level)
        return s if len(x) <= self.maxstring else f"{s} ({len(x)} characters)"

    def repr_bytes(self, x: bytes, level: int) -> str:
        s = repr(x[: self.maxstring])
        return s if len(x) <= self.maxstring else f"{s[:-1]}...{s[-1]} ({len(x)} bytes)"

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > _BITS:
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)

    def repr_instance(self, x: Any, level: int) -> str:
        try:
            return super().repr_instance(x, level)
        except Exception:  # a caller's object whose __repr__ fails: still name its type
            return f"<{type(x).__name__} object>"


_REPR = _Shown()


def shown(value: object) -> str:
    """``repr(value)``, cut: at most ``LIMIT`` characters and a length note, one line."""
    s = _REPR.repr(value)
    return s if len(s) <= LIMIT else f"{s[: LIMIT - 3]}... ({type(value).__name__}, cut)"
