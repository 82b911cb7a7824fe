"""Documents with one thing broken, for the reader fuzzers: hostile JSON values, and an edit of
a parsed document at one path (every path of the document is a candidate).

A hostile value is one a reader does not expect where it lands: the wrong type, out of range,
a float where an integer goes, NaN, a list nested near the recursion limit (``json.loads``
builds it; ``repr`` of it in an error message must not fail). ``LITERALS`` are JSON texts
``json.dumps`` never writes but ``json.loads`` takes, or refuses only with an exception of its
own (a number of 5,000 digits, nesting past the recursion limit).
Trap: strategies are module constants: one built inside a composite is validated again at
every draw, which was most of an example's cost.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

DEEP = json.loads("[" * 600 + "]" * 600)  # deep, yet within reach of repr and json.dumps
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, 0, 1, 2**31, 2**48, 2**62, 2**63, 2**64, 10**4000, 4.0, 1e300]),
    st.sampled_from([float("nan"), float("inf"), -0.0, DEEP, "", "4", "\ud800", "a\nb"]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.lists(st.integers(-3, 3) | st.text(max_size=2) | st.none(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers() | st.none(), max_size=2),
)
LITERALS = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1e400", "-0", "1.0", "9" * 5000, "[" * 3000 + "]" * 3000,
     '"\\ud800"', '"\\u0000"', '"a\\nb"', "{}", "[]", '""']
)  # fmt: skip
HOSTILE = VALUES.map(json.dumps) | LITERALS  # JSON text of a value no reader expects
ANY = st.integers(0, 1 << 16)  # an index into whatever list is at hand, taken modulo its length

DELETE = object()  # ``edited``'s value that removes the path instead of setting it
Path = tuple[str | int, ...]


def paths(doc: Any, depth: int = 4) -> list[Path]:
    """Every path into ``doc`` down to ``depth`` (object keys and list indices), ``()`` first."""
    out: list[Path] = [()]
    if depth == 0:
        return out
    items: list[tuple[str | int, Any]] = []
    if isinstance(doc, dict):
        items = list(doc.items())
    elif isinstance(doc, list):
        items = list(enumerate(doc))
    for k, v in items:
        out += [(k, *p) for p in paths(v, depth - 1)]
    return out


def edited(doc: Any, path: Path, value: Any) -> Any:
    """A copy of ``doc`` with ``path`` set to ``value`` (or removed, for ``DELETE``); a missing
    object on the way is made, a path through a non-container replaces it."""
    if not path:
        return None if value is DELETE else value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict) and isinstance(head, str):
        out = dict(doc)
        if not rest and value is DELETE:
            out.pop(head, None)
        else:
            out[head] = edited(doc.get(head, {}), rest, value)
        return out
    if isinstance(doc, list) and isinstance(head, int) and head < len(doc):
        items = list(doc)
        if not rest and value is DELETE:
            del items[head]
        else:
            items[head] = edited(doc[head], rest, value)
        return items
    return edited({}, (str(head), *rest), value)
