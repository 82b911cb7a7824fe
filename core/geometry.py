"""Geometry symbols computed from others: ``expr`` (always computed, e.g. value heads per key
head as ``v_heads / k_heads``) and ``default`` (used when config.json lacks the field, e.g.
``head_dim`` as ``hidden / heads`` for a Llama-2-style config). Pure; no I/O.

Invariants:
- an expression uses the shape algebra (``core.algebra``): ``/`` is exact, so a remainder or a
  zero divisor refuses the geometry in one line naming the symbol and its expression;
- expressions are evaluated in dependency order over the symbols already known; a cycle or a
  symbol that is never known is refused by name (the generator refuses both in a spec first);
- a value given explicitly (read from config.json or set by the caller) is never recomputed.
Trap: an ``expr`` symbol is recomputed from the values in hand every time, so a ``--set`` on a
symbol it reads changes it too; a ``--set`` on the ``expr`` symbol itself wins.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from specbind.core import algebra, algebra_ops
from specbind.core.errors import AlgebraError, GeometryError
from specbind.core.ir import GeometryField


def resolve(known: Mapping[str, int], pending: Mapping[str, str]) -> dict[str, int]:
    """``known`` plus every symbol of ``pending`` (name -> expression text), evaluated with
    exact division in dependency order."""
    values = dict(known)
    todo = {n: algebra.parse(t) for n, t in pending.items()}
    while todo:
        ready = [n for n, e in todo.items() if e.names <= values.keys()]
        if not ready:
            n, e = next(iter(todo.items()))
            missing = ", ".join(sorted(e.names - values.keys()))
            raise GeometryError(
                f"geometry {n} = {e.text}: {missing} is not known (no config field, default "
                "or value gives it, or the expressions depend on each other in a cycle)"
            )
        for n in ready:
            e = todo.pop(n)
            try:
                values[n] = algebra_ops.bounded(int(algebra.evaluate(e, values)))
            except (AlgebraError, GeometryError) as exc:
                shown = ", ".join(f"{s}={values[s]}" for s in sorted(e.names))
                raise GeometryError(f"geometry {n} = {e.text} ({shown}): {exc}") from None
    return values


def computed(
    fields: Iterable[GeometryField], values: Mapping[str, int], keep: Collection[str] = ()
) -> dict[str, int]:
    """``values`` with every ``expr`` symbol recomputed from the rest, except those in ``keep``
    (set explicitly by the caller), which stay as given."""
    exprs = {f.name: e for f in fields if (e := f.expr) is not None and f.name not in keep}
    return resolve({k: v for k, v in values.items() if k not in exprs}, exprs)
