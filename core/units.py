"""Byte counts and rates as people read them: binary gibibytes (2**30 B), two decimals.

Invariant: a printed size is ``<exact bytes> B (<GiB> GiB)`` wherever the bytes matter (plan,
audit, bind), so a reader sees the scale and a script still finds the exact count; a rate is
GiB per second of wall time. Trap: GiB, not GB: ``4015529984 B`` is 3.74 GiB but 4.02 GB.
"""

from __future__ import annotations

GIB = 1 << 30


def gib(n: int) -> str:
    """``n`` bytes in GiB: ``3.74 GiB``."""
    return f"{n / GIB:.2f} GiB"


def size(n: int) -> str:
    """``n`` bytes exactly, then in GiB: ``4015529984 B (3.74 GiB)``."""
    return f"{n} B ({gib(n)})"


def seconds(s: float) -> str:
    """A duration: ``12.3 s``; under a second, to the millisecond (``0.042 s``)."""
    return f"{s:.1f} s" if s >= 1 else f"{s:.3f} s"


def rate(n: int, s: float) -> str:
    """``n`` bytes over ``s`` seconds: ``0.30 GiB/s`` (``-`` when no time passed)."""
    return f"{n / GIB / s:.2f} GiB/s" if s > 0 else "- GiB/s"


def done(verb: str, n: int, s: float) -> str:
    """The last line of a command that moved bytes: ``bound 3.74 GiB in 12.3 s (0.30 GiB/s)``."""
    return f"{verb} {gib(n)} in {seconds(s)} ({rate(n, s)})"
