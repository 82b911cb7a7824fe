"""The typed context of a declared transform: one ``make_<field>`` function, as a list of steps
that ``templates/fields/transform.py.j2`` renders, one macro per step kind (read, view, take,
contract, scale, cast). Plain NumPy via ``runtime.binder.ops``; a shape comment, in this rank's
terms (``generator.rank_shapes``), on every view, slice and contraction.

Invariant: every expression in a step names symbols only through checked identifiers
(``g.X``, a rank-local unit count ``H_r``, a local derived symbol) and literals only through
``repr``; a contraction carries the spec's einsum text, checked at generate time and lowered
by ``core.einsum`` at bind time, as it was checked.
Trap: inside a transform a sharded unit means this rank's share (``H_r = max(g.H // g.tp, 1)``:
one unit where tp is a multiple of it, the unit replicated on tp / H ranks); a
scale's symbols are always the full counts (``IH ** -0.5`` does not shrink with tp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specbind.core import algebra
from specbind.core.einsum import Lowering
from specbind.generator.block_spec import Block
from specbind.generator.literals import comment, py_literal
from specbind.generator.output_spec import Output
from specbind.generator.rank_shapes import RankShapes, dims_text, rank_name
from specbind.generator.transforms import Operand, Transform, ast_text

StepKind = Literal["read", "view", "take", "permute", "contract", "scale", "cast"]


@dataclass(frozen=True)
class Step:
    """One line of a transform function: ``var = <kind>(...)``, with a comment above it."""

    kind: StepKind
    var: str
    note: str = ""  # the shape comment, already a checked one-line comment
    args: tuple[str, ...] = ()  # Python expressions, already rendered from checked parts


@dataclass(frozen=True)
class TransformContext:
    name: str  # make_<field>
    field: str
    geo_class: str
    doc: str
    locals: tuple[tuple[str, str, str], ...]  # (name, expression, comment)
    steps: tuple[Step, ...]
    result: str


class _Names:
    """Symbol -> Python: this rank's units as ``U_r``, derived symbols as locals, the rest
    as ``g.S``."""

    def __init__(
        self, block: Block, local_units: set[str], counts: frozenset[str] | set[str] = frozenset()
    ) -> None:
        self.block = block
        self.local_units = local_units
        self.counts = counts  # stacked family counts: this ep rank's members
        self.used: set[str] = set()

    def __call__(self, sym: str) -> str:
        if sym in self.local_units or sym in self.counts:
            self.used.add(sym)
            return rank_name(sym)
        if sym in self.block.derived:
            self.used.add(sym)
            return sym
        return f"g.{sym}"


def context(block: Block, out: Output, geo_class: str, rs: RankShapes) -> TransformContext:
    """The steps computing ``out`` on this rank from the checked arrays ``t``."""
    tf = out.transform
    assert tf is not None
    units = {u for o in tf.operands if (u := block.tensor(o.tensor).shard.unit) is not None}
    counts = rs.stacked_counts(tf.operands)
    names = _Names(block, units, counts)
    steps: list[Step] = []
    vars_ = []
    for i, o in enumerate(tf.operands):
        var = "ab"[i] if tf.lowering is not None else "x"
        steps += _operand_steps(block, out, o, var, names, rs, units)
        vars_.append(var)
    result = vars_[0]
    if tf.permute is not None:
        dims = rs.operand(tf.operands[0], units)[2]
        after = [dims[a] for a in tf.permute]
        note = comment(f"{dims_text(dims)} -> {dims_text(after)}: axes {list(tf.permute)}")
        what = py_literal(f"{out.field}: {block.rel(tf.operands[0].tensor)}")
        steps.append(Step("permute", result, note, (result, repr(tf.permute), what)))
    if tf.lowering is not None:
        steps.append(_contract(tf, tf.lowering, vars_))
        result = "y"
    elif tf.scale is not None:
        factor = algebra.to_python_real(tf.scale, lambda s: f"g.{s}")
        note = comment(f"x ({ast_text(tf.scale)}) in F32, then {tf.dtype}, in one pass")
        steps.append(Step("scale", result, note, (result, factor, py_literal(tf.dtype))))
    else:
        steps.append(Step("cast", result, "", (result, py_literal(tf.dtype))))
    if tf.view is not None:
        shape = _tuple([algebra.to_python(e, names) for e in tf.view])
        if tf.lowering is not None:
            before = f"[{', '.join(tf.lowering.letters_out)}]"
        else:
            op = rs.operand(tf.operands[0], units)[2]
            before = dims_text(op if tf.permute is None else [op[a] for a in tf.permute])
        note = comment(f"{before} -> {dims_text(rs.local(tf.view, units, counts))}")
        steps.append(Step("view", result, note, (result, shape, py_literal(out.field))))
    local: list[tuple[str, str, str]] = []
    for c in sorted(names.used & counts):
        src = next(o.tensor for o in tf.operands if _count_of(block, o) == c)
        note = comment(f"this ep rank's members of {rs.what(c)}")
        local.append((rank_name(c), f"t[{py_literal(src)}].shape[0]", note))
    for u in sorted(names.used & units):
        local.append(
            (rank_name(u), f"max(g.{u} // g.tp, 1)", comment(f"this rank's share of {rs.what(u)}"))
        )
    needed = set(names.used & set(block.derived))
    for d in reversed(list(block.derived)):  # derived symbols the needed ones use, transitively
        if d in needed:
            needed |= block.derived[d].names & set(block.derived)
    for d in block.derived:
        if d in needed:
            expr = algebra.to_python(block.derived[d], names)
            local.append((d, f"algebra_ops.bounded({expr})", ""))
    return TransformContext(
        f"make_{out.field}", out.field, geo_class, comment(f"``{out.field}``: {describe(tf)}."),
        tuple(local), tuple(steps), result,
    )  # fmt: skip


def _count_of(block: Block, o: Operand) -> str | None:
    fam = block.tensor(o.tensor).stacked
    return None if fam is None else block.families[fam].count


def _contract(tf: Transform, low: Lowering, vars_: list[str]) -> Step:
    per = ", ".join(low.batch)
    each = "one matmul" + (f" per {per}" if len(low.batch) == 1 else f" per ({per})" if per else "")
    summed = f"summing {', '.join(low.contract)}" if low.contract else "summing nothing"
    note = comment(
        f"einsum {tf.einsum}: {each}, {summed}: {_mid(low)} -> [{', '.join(low.letters_out)}]"
    )
    args: tuple[str, ...] = (vars_[0], vars_[1], py_literal(tf.einsum), py_literal(tf.dtype))
    if tf.scale is not None:
        args += (algebra.to_python_real(tf.scale, lambda s: f"g.{s}"),)
    return Step("contract", "y", note, args)


def describe(tf: Transform) -> str:
    parts = []
    if tf.einsum:
        parts.append(f"einsum {tf.einsum} over this rank's operands, in F32")
    else:
        parts.append("one tensor")
    if tf.scale is not None:
        parts.append(f"scaled by {ast_text(tf.scale)}")
    parts.append(f"as {tf.dtype}")
    return ", ".join(parts)


def _mid(low: Lowering) -> str:
    a = [low.letters_a[i] for i in low.perm_a]
    b = [low.letters_b[i] for i in low.perm_b]
    return f"[{', '.join(a)}] @ [{', '.join(b)}]"


def _tuple(items: list[str]) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _operand_steps(
    block: Block, out: Output, o: Operand, var: str, names: _Names, rs: RankShapes,
    units: set[str],
) -> list[Step]:  # fmt: skip
    what = py_literal(f"{out.field}: {block.rel(o.tensor)}")
    steps = [Step("read", var, "", (py_literal(o.tensor),))]
    read, viewed, sliced, bounds = rs.operand(o, units)
    if o.view is not None:
        shape = _tuple([algebra.to_python(e, names) for e in o.view])
        note = comment(f"{dims_text(read)} -> {dims_text(viewed)}")
        steps.append(Step("view", var, note, (var, shape, what)))
    if o.slice is not None:
        s = o.slice
        start = "0" if s.start is None else algebra.to_python(s.start, names)
        stop = f"{var}.shape[{s.axis}]" if s.stop is None else algebra.to_python(s.stop, names)
        note = comment(f"{dims_text(viewed)}, axis {s.axis} {bounds} -> {dims_text(sliced)}")
        steps.append(Step("take", var, note, (var, str(s.axis), start, stop, what)))
    return steps
