"""The integer operations of the shape algebra, shared by the generator and generated code.

Invariant: the generator's evaluator and the emitted binders call these same functions, so a
shape evaluates identically at generate time and at bind time.
Traps: ``/`` is *exact* division (a remainder is an error, never a silent floor); ``**`` is
bounded so a hostile exponent cannot allocate a huge integer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from specbind.core.errors import DerivedError, GeometryError

MAX_MAGNITUDE = 1 << 62


def bounded(v: int) -> int:
    """A derived symbol's value, refused past 2**62 so a chain of derived symbols cannot
    grow without bound (``Z1: Z0 * Z0``, ``Z2: Z1 * Z1``, ...)."""
    return _bounded(v)


def _bounded(v: int) -> int:
    if abs(v) > MAX_MAGNITUDE:
        raise GeometryError(f"value {v} is out of range (|v| > 2**62)")
    return v


def derived(
    block: str,
    name: str,
    text: str,
    compute: Callable[[], int],
    values: Mapping[str, int],
    sizes: tuple[str, ...],
) -> int:
    """A block's derived symbol ``name = text``, bounded; one that cannot be computed (an
    inexact ``/``, a zero divisor) is a ``DerivedError`` naming the block, the symbol, its
    expression, the values it read and the tensors it sizes (``sizes``), not the bare
    arithmetic (``96 / 7 is not exact``)."""
    try:
        return _bounded(compute())
    except GeometryError as e:
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        what = f"; it sizes {', '.join(sizes)}" if sizes else ""
        raise DerivedError(
            f"{block}: {name} = {text} cannot be computed for {shown} ({e}){what}",
            tuple(values),
            sizes,
        ) from None


def div(a: int, b: int) -> int:
    """Exact division: ``a / b`` must leave no remainder."""
    if b == 0:
        raise GeometryError(f"division by zero in {a} / {b}")
    if a % b != 0:
        raise GeometryError(f"{a} / {b} is not exact (remainder {a % b})")
    return a // b


def floordiv(a: int, b: int) -> int:
    if b == 0:
        raise GeometryError(f"division by zero in {a} // {b}")
    return a // b


def mod(a: int, b: int) -> int:
    if b == 0:
        raise GeometryError(f"modulo by zero in {a} % {b}")
    return a % b


def power(a: int, b: int) -> int:
    if b < 0:
        raise GeometryError(f"negative exponent in {a} ** {b}")
    if b > 64 and abs(a) > 1:
        raise GeometryError(f"exponent too large in {a} ** {b}")
    return _bounded(a**b)


def maximum(*args: int) -> int:
    """``max(a, b, ...)`` of the algebra: exact, like every integer operation here."""
    return max(args)


def minimum(*args: int) -> int:
    """``min(a, b, ...)`` of the algebra."""
    return min(args)


def rdiv(a: float, b: float) -> float:
    """Real division for a scale factor."""
    if b == 0:
        raise GeometryError(f"division by zero in {a} / {b}")
    return a / b


def rpow(a: float, b: float) -> float:
    """Real power for a scale factor (``IH ** -0.5``); refuses what would not be a real number."""
    if a == 0 and b < 0:
        raise GeometryError(f"0 ** {b} is infinite")
    if a < 0 and b != int(b):
        raise GeometryError(f"{a} ** {b} is not real")
    if abs(b) > 64:
        raise GeometryError(f"exponent too large in {a} ** {b}")
    return float(a**b)
