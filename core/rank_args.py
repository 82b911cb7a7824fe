"""The tp/ep sizes and ranks a Python caller passes (``runtime.bind.bind.bind_checkpoint``, which
every bind goes through; ``Checkpoint.bind``, ``plan``,
``open_bound``, ``engine.bind_for_engine``), checked before any work.

Invariant: each is a plain integer (an ``int``, or anything with ``__index__`` such as a NumPy
integer, returned as ``int``), never a ``bool`` and never a float, a size >= 1 and a rank in
``[0, size)``; anything else is one ``GeometryError`` line naming the function, the argument
and its value.
Trap: ``True`` is an ``int`` in Python and ``True == 1``: unchecked, ``tp_size=True`` binds as
tp 1 and says nothing; ``2.0`` passes ``>= 1`` and fails much later as a traceback.
"""

from __future__ import annotations

import operator

from specbind.core.errors import GeometryError
from specbind.core.shown import shown


def as_int(where: str, name: str, value: object) -> int:
    """``value`` as an ``int``, or a ``GeometryError`` naming ``where`` and ``name``."""
    if isinstance(value, bool):
        raise GeometryError(f"{where}: {name}={value!r} is a bool; give an integer")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise GeometryError(
            f"{where}: {name}={shown(value)} is a {type(value).__name__}, not an integer"
        ) from None


def check_ranks(where: str, size: object, rank: object, what: str = "tp") -> tuple[int, int]:
    """``(size, rank)`` of ``what`` (``tp`` or ``ep``) as ints: size >= 1, rank in [0, size).
    A rank of None is rank 0 at size 1 and refused above it: a size without a rank is never
    read as rank 0 (the caller would hold rank 0's share believing it its own)."""
    s = as_int(where, f"{what}_size", size)
    if rank is None and s > 1:
        raise GeometryError(
            f"{where}: {what}_size={s} without {what}_rank: name this process's rank "
            f"({what}_rank=0..{s - 1})"
        )
    r = 0 if rank is None else as_int(where, f"{what}_rank", rank)
    if s < 1:
        raise GeometryError(f"{where}: {what}_size={s} must be >= 1")
    if not 0 <= r < s:
        raise GeometryError(f"{where}: {what}_rank={r} is outside [0, {what}_size={s})")
    return s, r


def check_size(where: str, size: object, what: str = "tp") -> int:
    """A ``what`` size alone (``plan``), as an int >= 1."""
    return check_ranks(where, size, 0, what)[0]
