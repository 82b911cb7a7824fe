"""Shape expressions expanded into sums of terms over base symbols (Laurent polynomials).

A term is a rational coefficient times a product of symbols, each to a non-zero integer power
(``v_heads / k_heads`` is ``v_heads**1 * k_heads**-1``). Expansion is what the whole-units
proofs read: ``k_heads * (2 * k_dim + v_per_k * v_dim)`` with ``v_per_k = v_heads / k_heads``
is ``2*k_heads*k_dim + v_heads*v_dim``, two terms over different units.

Invariants:
- exact: coefficients are ``Fraction``s, never floats; a zero coefficient is dropped, so two
  spellings of one polynomial expand to equal mappings;
- ``+ - *``, ``/`` by a single term and ``**`` by a non-negative integer literal expand; ``//``,
  ``%``, ``max``/``min``, a power by a symbol and a division by a sum do not, and raise
  :class:`NotPolynomial`
  (the caller then proves nothing from the expansion: it is not a proof of absence).
Trap: the algebra's ``/`` is exact at every step; an expansion says what a shape *is* where it
evaluates, not that it evaluates (``a / b * b`` expands to ``a``).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from itertools import product

from specbind.core import algebra
from specbind.core.errors import SpecbindError

Monomial = tuple[tuple[str, int], ...]  # sorted by symbol; every power non-zero
Poly = dict[Monomial, Fraction]

_MAX_TERMS = 256
MAX_POWER = 8
_MAX_TRIES = 128  # assignments of the other symbols tried by can_equal (each solves for one)


class NotPolynomial(Exception):
    """The expression uses ``//``, ``%``, a symbolic power or a division by a sum."""


def const(c: int | Fraction) -> Poly:
    return {(): Fraction(c)} if c else {}


def symbol(name: str) -> Poly:
    return {((name, 1),): Fraction(1)}


def _mono_mul(a: Monomial, b: Monomial, sign: int = 1) -> Monomial:
    powers = dict(a)
    for s, e in b:
        powers[s] = powers.get(s, 0) + sign * e
    return tuple(sorted((s, e) for s, e in powers.items() if e))


def add(a: Poly, b: Poly, sign: int = 1) -> Poly:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, Fraction(0)) + sign * c
    return _checked({m: c for m, c in out.items() if c})


def mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for (ma, ca), (mb, cb) in product(a.items(), b.items()):
        m = _mono_mul(ma, mb)
        out[m] = out.get(m, Fraction(0)) + ca * cb
    return _checked({m: c for m, c in out.items() if c})


def div(a: Poly, b: Poly) -> Poly:
    if len(b) != 1:
        raise NotPolynomial("division by a sum")
    (mb, cb), = b.items()  # fmt: skip
    return {_mono_mul(ma, mb, -1): ca / cb for ma, ca in a.items()}


def _checked(p: Poly) -> Poly:
    if len(p) > _MAX_TERMS:
        raise NotPolynomial(f"more than {_MAX_TERMS} terms")
    return p


def expand(expr: algebra.Expr, subst: Callable[[str], Poly]) -> Poly:
    """``expr`` with every symbol replaced by ``subst(symbol)``, multiplied out."""
    return _expand(expr.node, subst)


def _expand(node: ast.expr, subst: Callable[[str], Poly]) -> Poly:
    if isinstance(node, ast.Constant):
        assert type(node.value) is int  # parse() admits integer literals only
        return const(node.value)
    if isinstance(node, ast.Name):
        return subst(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _expand(node.operand, subst)
        return {m: -c for m, c in inner.items()} if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Pow):
            n = node.right
            if not (isinstance(n, ast.Constant) and type(n.value) is int and n.value >= 0):
                raise NotPolynomial("a power by a symbol")
            if n.value > MAX_POWER:
                raise NotPolynomial(f"a power above {MAX_POWER}")
            base, out = _expand(node.left, subst), const(1)
            for _ in range(n.value):
                out = mul(out, base)
            return out
        a, b = _expand(node.left, subst), _expand(node.right, subst)
        if isinstance(node.op, ast.Add):
            return add(a, b)
        if isinstance(node.op, ast.Sub):
            return add(a, b, -1)
        if isinstance(node.op, ast.Mult):
            return mul(a, b)
        if isinstance(node.op, ast.Div):
            return div(a, b)
    if isinstance(node, ast.Call):
        raise NotPolynomial("max/min does not expand")
    raise NotPolynomial(f"{type(node).__name__} does not expand")


def value(p: Poly, env: Mapping[str, int]) -> Fraction:
    """``p`` at ``env`` (every symbol non-zero where it has a negative power)."""
    total = Fraction(0)
    for m, c in p.items():
        for s, e in m:
            c *= Fraction(env[s]) ** e
        total += c
    return total


def power_of(m: Monomial, name: str) -> int:
    return dict(m).get(name, 0)


def over(m: Monomial, unit: Monomial) -> bool:
    """``m`` holds ``unit`` as a factor: every symbol of ``unit`` at least at its power."""
    return all(power_of(m, s) >= e for s, e in unit if e > 0)


def render_term(m: Monomial, c: Fraction) -> str:
    parts = [] if c == 1 and m else [str(c)]
    num = [s if e == 1 else f"{s}**{e}" for s, e in m if e > 0]
    den = [s if e == -1 else f"{s}**{-e}" for s, e in m if e < 0]
    text = " * ".join(parts + num) or "1"
    return text + "".join(f" / {d}" for d in den)


def monomials(p: Poly) -> list[tuple[Monomial, Fraction]]:
    """The terms in a stable order (by their symbols), for messages."""
    return sorted(p.items(), key=lambda mc: [s for s, _ in mc[0]])


def render(p: Poly) -> str:
    out = ""
    for m, c in monomials(p):
        text = render_term(m, abs(c))
        if out:
            out += f" {'+' if c > 0 else '-'} {text}"
        else:
            out = text if c > 0 else "-" + text
    return out or "0"


def _divisors(n: int, limit: int = 1 << 32) -> list[int]:
    """The positive divisors of ``n`` (none above ``limit`` is searched for: ``[]`` if n is)."""
    n = abs(n)
    if n == 0 or n > limit:
        return []
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small) | {n // d for d in small})


def _roots(p: Poly, x: str, values: Mapping[str, int], target: int) -> list[int]:
    """Positive integers ``x`` with ``p == target`` (the other symbols at ``values``), by the
    rational-root theorem on ``p - target`` cleared of denominators and negative powers."""
    coeff: dict[int, Fraction] = {}
    for m, c in p.items():
        k = c
        for s, e in m:
            if s != x:
                k *= Fraction(values[s]) ** e
        e = power_of(m, x)
        coeff[e] = coeff.get(e, Fraction(0)) + k
    coeff[0] = coeff.get(0, Fraction(0)) - target
    coeff = {e: c for e, c in coeff.items() if c}
    if not coeff:
        return [1]  # p == target whatever x is
    low = min(coeff)
    scale = 1
    for c in coeff.values():
        scale = math.lcm(scale, c.denominator)
    ints = {e - low: int(c * scale) for e, c in coeff.items()}
    return _divisors(ints[0]) if 0 in ints and len(ints) > 1 else []


def can_equal(
    expr: algebra.Expr, target: int, lows: Mapping[str, int], reals: Mapping[str, int]
) -> bool | None:
    """Whether some geometry (each symbol a whole number at least ``lows[s]``) makes ``expr``
    exactly ``target``: True with a witness found, False when none exists, None when this
    cannot tell. The search solves for one symbol at a time (rational-root theorem), the
    others at their real value, their lowest, or a divisor of ``target``. False is a proof
    only where the search is exhaustive: ``expr`` over one symbol, or one product of symbols
    with a whole coefficient (every factor then divides ``target``); elsewhere "none found"
    is None."""
    try:
        p = expand(expr, symbol)
    except NotPolynomial:
        return None
    names = sorted(expr.names)

    def holds(env: Mapping[str, int]) -> bool:
        try:
            return bool(algebra.evaluate(expr, env) == target)
        except SpecbindError:
            return False

    if holds(reals):
        return True
    every = _divisors(target)
    small = every[:64]
    tried = 0
    for x in names:
        others = [s for s in names if s != x]
        choices = [sorted({reals[s], lows[s], *(d for d in small if d >= lows[s])}) for s in others]
        for combo in product(*choices):
            tried += 1
            if tried > _MAX_TRIES:
                return None
            env = dict(zip(others, combo, strict=True))
            for v in _roots(p, x, env, target):
                if v >= lows[x] and holds(env | {x: v}):
                    return True
    product_form = (
        len(p) == 1
        and all(e > 0 for m in p for _, e in m)
        and all(c.denominator == 1 for c in p.values())
    )
    exhaustive = len(names) == 1 or (product_form and len(every) == len(small) and every != [])
    return False if exhaustive else None
