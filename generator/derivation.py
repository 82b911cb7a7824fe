"""How every symbol is derived, and the whole-units proof that sees through the derivations.

A geometry symbol is a config field (``config:``), an engine setting (``value`` only), computed
(``expr:``, e.g. a ratio ``v_heads / k_heads``), or a config field with a ``default:`` for
when config.json lacks it; a block symbol is a geometry symbol; a block ``derived:`` symbol is
a product or other expression of block symbols. :func:`block_expansions` rewrites a block's
symbols as sums of terms over the base symbols (config fields and settings), so a ratio is no
longer a symbol independent of the count it divides.

Invariants (the proof, :func:`check_sum_units`):
- a sharded dim that expands to two or more terms, one of which does not hold the shard unit
  as a factor, is refused naming the tensor and the terms: Qwen3-Next's fused conv1d written
  ``k_heads * (2 * k_dim + v_per_k * v_dim)`` is ``2*k_dim*k_heads + v_dim*v_heads``, terms over
  key heads and value heads. Its layout is sections (what the checkpoint holds; a contiguous
  share of the whole has the right shape and the wrong rows) or a per-unit interleave, and
  the spec says which: sections by the model's ``names:`` ``sections:``, each with its own
  unit, or ``interleave: true`` on the shard;
- a sharded axis of several parts over its unit, with no layout declared, is refused too,
  naming the tensor and the axis: one term with a whole multiple (``2 * inter``, written so or
  as ``inter + inter``) or a sum whose every term holds the unit (MLA's ``heads * (nope +
  rope)``). Shapes cannot tell Llama 4's halves ``[gate | up]`` (sections: a contiguous share
  is rank 0 all of gate) from gpt-oss's ``(gate, up)`` pairs or MLA's per-head ``[nope; rope]``
  (per-unit interleave: a contiguous share is right); the spec says which. The unit's own
  coefficient is one part (``inter: 4 * hidden`` on a ``4 * hidden`` axis is one);
- terms over different units are named before several parts over one (in every reading);
- a ``default:`` field is proven both ways: the field present (a base symbol) and absent (its
  default expanded).
Not proven (traps): a multiple hidden in a config field (a checkpoint whose
``intermediate_size`` is itself ``2 * I``) cannot be seen. A symbol computed with ``//``,
``%``, ``max``/``min`` or a power by a symbol does not expand: a sharded sum holding it is
refused (it could hide another unit, ``v_heads // k_heads``), a single term holding it is left
to the scaling check (``evaluate.check_whole_units``). A block's sharded dim holding
``max``/``min`` itself or through a derived symbol never reaches these proofs: the spec checker
refuses it.
"""

from __future__ import annotations

from fractions import Fraction

from specbind.core import algebra
from specbind.core.errors import SpecError
from specbind.core.ir import TensorRule
from specbind.core.polynomial import (
    Monomial,
    NotPolynomial,
    Poly,
    expand,
    over,
    render,
    render_term,
    symbol,
)
from specbind.generator.block_spec import Block
from specbind.generator.model_spec import BlockUse, Model


def geometry_expansions(
    model: Model, defaults: bool, opaque: set[str] | None = None
) -> dict[str, Poly]:
    """Every geometry symbol over the base symbols; ``defaults``: a ``default:`` field read as
    absent from config.json (its default stands in), else as present. A default that is a
    number (Qwen3's head_dim 128) stays the symbol: it is a size per unit like any value the
    field holds, not a count of parts (expanded, 128 * heads would read as 128 parts of a
    heads-sharded axis). A computed symbol whose
    expression does not expand (``//``, ``%``, a power by a symbol) is held as a symbol of its
    own name and added to ``opaque``."""
    fields = {g.name: g for g in model.geometry}
    out: dict[str, Poly] = {}

    def of(name: str) -> Poly:
        if name not in out:  # the spec checks refuse cycles before this runs
            g = fields[name]
            text = g.expr
            if text is None and defaults and g.default is not None:
                text = g.default if algebra.parse(g.default).names else None
            out[name] = symbol(name)
            if text is not None:
                try:
                    out[name] = expand(algebra.parse(text), of)
                except NotPolynomial:  # held as a symbol, yet not a base one
                    if opaque is not None:
                        opaque.add(name)
        return out[name]

    for g in model.geometry:
        of(g.name)
    return out


def block_expansions(
    block: Block, use: BlockUse, geometry: dict[str, Poly], opaque: set[str] | None = None
) -> dict[str, Poly]:
    """Every block symbol and derived symbol over the model's base symbols (a derived symbol
    that does not expand is held as ``block.name`` and added to ``opaque``)."""
    out = {s: geometry[g] for s, g in use.symbols.items()}
    for name, e in block.derived.items():  # in order: a derived symbol reads earlier ones
        try:
            out[name] = expand(e, out.__getitem__)
        except NotPolynomial:
            out[name] = symbol(f"{block.name}.{name}")
            if opaque is not None:
                opaque.add(f"{block.name}.{name}")
    return out


def check_sum_units(model: Model, block: Block, use: BlockUse, ctx: str) -> None:
    """Refuse a sharded dim that is a sum of terms over different units, or several parts over
    its unit, unless its shard declares ``interleave: true`` (see the module's invariants).
    Terms over different units in any reading are named first: they say more."""
    readings = [False] + ([True] if any(g.default for g in model.geometry) else [])
    parts: SpecError | None = None  # the first sharded axis of several parts, refused last
    for defaults in readings:
        opaque: set[str] = set()
        geometry = geometry_expansions(model, defaults, opaque)
        expanded = block_expansions(block, use, geometry, opaque)
        for t in block.tensors:
            if t.shard.unit is None or not t.dims or t.name in block.interleaved:
                continue
            axis = t.shard.resolved(len(t.dims))
            try:
                dim = expand(t.dims[axis], expanded.__getitem__)
            except NotPolynomial:
                continue
            unit = expanded[t.shard.unit]
            if len(unit) != 1:
                continue
            ((unit_term, unit_coef),) = unit.items()
            if len(dim) < 2:
                parts = parts or _multiple(
                    model, block, use, t, axis, dim, unit_term, unit_coef, defaults, ctx
                )
                continue
            hidden = sorted({n for m in dim for n, _ in m} & opaque)
            if hidden:
                _refuse_opaque(model, block, use, t, axis, dim, hidden, defaults, ctx)
            stray = [render_term(m, abs(c)) for m, c in dim.items() if not over(m, unit_term)]
            if not stray:
                parts = parts or _parts(model, block, use, t, axis, dim, defaults, ctx)
                continue
            gunit = use.symbols[t.shard.unit]
            absent = [g.name for g in model.geometry if g.default] if defaults else []
            when = f" where config.json lacks {', '.join(absent)}" if absent else ""
            rel = block.rel(t.name)
            via = derivations(model, block, use, t.dims[axis].names, defaults)
            raise block.located.error(
                ("tensors", rel, "shard"),
                f"{ctx}: {rel} shards {t.shard.kind} on {t.shard.unit}, but dim {axis} "
                f"({t.dims[axis].text}) is {render(dim)} in {model.name}'s base symbols{when}"
                f"{via}: "
                f"a sum of terms over different units ({', '.join(stray)} not over {gunit}), "
                f"so a contiguous share of {t.shard.unit} would cross sections; declare its "
                f"sections (model names: with sections:, each with its own unit), or "
                f"interleave: true on the shard where each {t.shard.unit} unit holds its rows "
                f"of every term together",
            )
    if parts is not None:
        raise parts


def _multiple(
    model: Model, block: Block, use: BlockUse, t: TensorRule, axis: int, dim: Poly,
    unit_term: Monomial, unit_coef: Fraction, defaults: bool, ctx: str,
) -> SpecError | None:  # fmt: skip
    """One term over the unit with a whole multiple in its coefficient (``2 * inter``, or
    ``inter + inter``): k parts of the axis, which shapes cannot tell apart as k sections
    (Llama 4's ``[gate | up]``) or interleaved per unit (gpt-oss's ``(gate, up)`` pairs)."""
    ((m, c),) = dim.items()
    ratio = c / unit_coef  # the unit's own coefficient (``inter: 4 * hidden``) is one part
    if ratio.numerator == 1 or not over(m, unit_term):
        return None
    return _parts(model, block, use, t, axis, dim, defaults, ctx, f"{ratio.numerator} parts")


def _parts(
    model: Model, block: Block, use: BlockUse, t: TensorRule, axis: int, dim: Poly,
    defaults: bool, ctx: str, what: str = "",
) -> SpecError:  # fmt: skip
    """A sharded dim of several parts, each over the unit, whose layout the spec does not say:
    a contiguous share is right for a per-unit interleave and wrong for sections."""
    assert t.shard.unit is not None
    rel = block.rel(t.name)
    via = derivations(model, block, use, t.dims[axis].names, defaults)
    parts = what or f"a sum of {len(dim)} terms"
    return block.located.error(
        ("tensors", rel, "shard"),
        f"{ctx}: {rel} shards axis {axis} on {t.shard.unit}, but that axis "
        f"({t.dims[axis].text}) is {render(dim)} in {model.name}'s base symbols{via}, "
        f"{parts} whose layout shapes cannot tell: say how they lie, as sections of axis "
        f"{axis} (model names: with sections: and axis: {axis}, each split on its own) or "
        f"interleave: true on the shard where each {t.shard.unit} unit holds its share of "
        f"every part together",
    )


def _refuse_opaque(
    model: Model, block: Block, use: BlockUse, t: TensorRule, axis: int, dim: Poly,
    hidden: list[str], defaults: bool, ctx: str,
) -> None:  # fmt: skip
    """A sum whose terms hold a symbol the proof cannot see through: whether each term is over
    the shard unit is unknown (``v_per_k = v_heads // k_heads`` hides value heads)."""
    assert t.shard.unit is not None
    rel = block.rel(t.name)
    via = derivations(model, block, use, t.dims[axis].names, defaults)
    raise block.located.error(
        ("tensors", rel, "shard"),
        f"{ctx}: {rel} shards {t.shard.kind} on {t.shard.unit}, but dim {axis} "
        f"({t.dims[axis].text}) is {render(dim)} in {model.name}'s base symbols{via}, a sum "
        f"over {', '.join(hidden)}, computed with //, %, max/min or a power the whole-units "
        f"proof cannot see through, so whether every term is over {t.shard.unit} is unknown; write "
        f"the ratio with exact division (/), or declare its sections (model names: with "
        f"sections:) or interleave: true on the shard",
    )


def derivations(
    model: Model, block: Block, use: BlockUse, names: frozenset[str], defaults: bool
) -> str:
    """`` (via a = b / c, ...)``: how each of ``names`` that is not a base symbol is derived."""
    fields = {g.name: g for g in model.geometry}
    out = []
    for s in sorted(names):
        if s in block.derived:
            out.append(f"{s} = {block.derived[s].text}")
            continue
        g = fields[use.symbols[s]]
        shown = s if s == g.name else f"{s} ({g.name})"
        if g.expr is not None:
            out.append(f"{shown} = {g.expr}")
        elif defaults and g.default is not None:
            out.append(f"{shown} = {g.default} (its default)")
    return f" (via {', '.join(out)})" if out else ""
