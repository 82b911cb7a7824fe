"""Declared load-time transforms: parse them, check their shapes, lower einsum to batched matmul.

Two forms, each a small pipeline:
- unary:    ``{tensor, view?, slice?, permute?, scale?, dtype?, reshape?}``
                                    view -> slice -> permute -> scale -> cast -> reshape
- contract: ``{einsum, operands: [A, B], scale?, view?, dtype?}``; each operand is
  ``{tensor, view?, slice?}``;                                  contract -> scale -> cast -> view

Invariants:
- views are checked by element count, slices by bounds, einsum letters by operand rank and by a
  consistent size per letter, at the model's geometry at every tp its units allow;
- the shard unit of a sharded operand must sit where the shard splits it (axis 0 for rows, the
  first axis of the last on-disk dim for columns) and its einsum letter must reach the output:
  an op whose head index follows the shard runs on this rank's heads only, never all heads;
- BF16 operands are widened exactly to F32 and computed in F32; a BF16 result is rounded to
  nearest even once, at the end.
- a unary ``permute`` reorders the axes; the layout axis follows it (the shard unit's axis moves
  to ``permute.index(axis)``), so a field may be split on an axis that is neither first nor
  last; a stacked family's axis 0 must stay first (ep ranks join there).
Trap: in a view of a sharded operand, the unit symbol means *this rank's* units (H / tp); the
same symbol in a scale means the full count (``IH ** -0.5`` does not shrink with tp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specbind.core import algebra, einsum
from specbind.core.einsum import Lowering
from specbind.core.errors import AlgebraError
from specbind.core.ir import TensorRule
from specbind.generator.yamlio import Located, PathKey


@dataclass(frozen=True)
class Slice:
    axis: int
    start: algebra.Expr | None
    stop: algebra.Expr | None


@dataclass(frozen=True)
class Operand:
    tensor: str  # full (prefixed) name
    view: tuple[algebra.Expr, ...] | None
    slice: Slice | None
    path: PathKey


@dataclass(frozen=True)
class Transform:
    operands: tuple[Operand, ...]
    einsum: str | None
    lowering: Lowering | None
    view: tuple[algebra.Expr, ...] | None  # of the contraction's result
    scale: algebra.Expr | None
    dtype: str
    layout_kind: str  # how the result splits across ranks: replicated | rows | cols
    unit_letter: str | None = None  # the einsum letter of the shard unit, when sharded
    permute: tuple[int, ...] | None = None  # a unary op's new axis order, after the slice
    layout_axis: int = 0  # the result axis the layout splits (-1: the last)


def _exprs(
    doc: Located, path: PathKey, raw: list[Any], names: set[str]
) -> tuple[algebra.Expr, ...]:
    out = []
    for i, text in enumerate(raw):
        try:
            e = algebra.parse(text)
        except AlgebraError as exc:
            raise doc.error((*path, i), str(exc)) from None
        unknown = sorted(e.names - names)
        if unknown:
            raise doc.error((*path, i), f"unknown symbol(s) {', '.join(unknown)} in {str(text)!r}")
        out.append(e)
    return tuple(out)


def _slice(
    doc: Located, path: PathKey, raw: dict[str, Any] | None, names: set[str]
) -> Slice | None:
    if raw is None:
        return None
    bounds = [raw.get("start"), raw.get("stop")]
    parsed = [
        None if b is None else _exprs(doc, (*path, k), [b], names)[0]
        for k, b in zip(("start", "stop"), bounds, strict=True)
    ]
    return Slice(int(raw["axis"]), parsed[0], parsed[1])


def _operand(
    doc: Located,
    path: PathKey,
    raw: dict[str, Any],
    prefix: str,
    tensors: dict[str, Any],
    names: set[str],
) -> Operand:
    name = prefix + raw["tensor"]
    if name not in tensors:
        raise doc.error((*path, "tensor"), f"unknown tensor {raw['tensor']!r}")
    view = _exprs(doc, (*path, "view"), raw["view"], names) if "view" in raw else None
    return Operand(name, view, _slice(doc, (*path, "slice"), raw.get("slice"), names), path)


def parse(
    doc: Located,
    path: PathKey,
    raw: dict[str, Any],
    prefix: str,
    tensors: dict[str, Any],
    names: set[str],
) -> Transform:
    """Parse a unary or contract output; shape checks come later, at a geometry."""
    if "einsum" in raw:
        ops = tuple(
            _operand(doc, (*path, "operands", i), o, prefix, tensors, names)
            for i, o in enumerate(raw["operands"])
        )
        lowering = lower(doc, (*path, "einsum"), raw["einsum"], [_rank(o, tensors) for o in ops])
        view = _exprs(doc, (*path, "view"), raw["view"], names) if "view" in raw else None
    else:
        ops = (_operand(doc, path, raw, prefix, tensors, names),)
        lowering = None
        # the result's view, after the slice (the operand's own ``view`` comes before it)
        view = _exprs(doc, (*path, "reshape"), raw["reshape"], names) if "reshape" in raw else None
    scale = None
    if "scale" in raw:
        try:
            scale = algebra.parse_real(raw["scale"])
        except AlgebraError as exc:
            raise doc.error((*path, "scale"), str(exc)) from None
        unknown = sorted(scale.names - names)
        if unknown:
            raise doc.error((*path, "scale"), f"unknown symbol(s) {', '.join(unknown)}")
    first = tensors[ops[0].tensor]
    if len({tensors[o.tensor].group for o in ops}) != 1:
        raise doc.error(path, "operands come from different groups")
    dtype = raw.get("dtype", first.dtype)
    kind = _layout(doc, path, raw.get("shard"), ops, tensors)
    heads = [_unit_axis(doc, o, tensors) for o in ops]
    permute = _permute(doc, path, raw, ops, tensors)
    layout_axis = -1 if kind == "cols" else 0
    if permute is not None and heads[0] is not None and kind != "replicated":
        moved = permute.index(heads[0])  # the shard unit's axis, after the permute
        last = len(permute) - 1
        kind = "rows" if moved == 0 else "cols" if moved == last else "axis"
        layout_axis = -1 if moved == last else moved
        if view is not None and kind == "axis":
            raise doc.error(
                (*path, "reshape"),
                "after a permute that puts the shard axis inside, a reshape is not allowed",
            )
    if lowering is not None:
        letters = [lowering.letters_a, lowering.letters_b]
        head_letters = {letters[i][ax] for i, ax in enumerate(heads) if ax is not None}
        for h in head_letters:
            if h not in lowering.letters_out:
                raise doc.error(
                    (*path, "einsum"),
                    f"einsum sums over the shard unit (letter {h!r}); that needs an "
                    "all-reduce, not a load-time transform",
                )
        if len(head_letters) > 1:
            raise doc.error(
                (*path, "einsum"), "sharded operands put their units on different letters"
            )
        if kind == "rows" and lowering.letters_out[0] not in head_letters:
            raise doc.error(
                (*path, "shard"), "a rows layout needs the unit's letter first in the output"
            )
    unit_letter = None
    if lowering is not None:
        letters = [lowering.letters_a, lowering.letters_b]
        found = {letters[i][ax] for i, ax in enumerate(heads) if ax is not None}
        unit_letter = next(iter(found)) if found else None
    return Transform(
        ops, raw.get("einsum"), lowering, view, scale, dtype, kind, unit_letter, permute,
        layout_axis,
    )  # fmt: skip


def _permute(
    doc: Located, path: PathKey, raw: dict[str, Any], ops: tuple[Operand, ...],
    tensors: dict[str, Any],
) -> tuple[int, ...] | None:  # fmt: skip
    """A unary op's axis order: a permutation of the operand's axes (after its view); a
    stacked family keeps axis 0 first."""
    if "permute" not in raw:
        return None
    perm = tuple(int(a) for a in raw["permute"])
    rank = _rank(ops[0], tensors)
    if sorted(perm) != list(range(rank)):
        raise doc.error((*path, "permute"), f"{list(perm)} is not an order of {rank} axes")
    if tensors[ops[0].tensor].stacked is not None and perm[0] != 0:
        raise doc.error(
            (*path, "permute"), "a stacked family's axis 0 must stay first (ep ranks join there)"
        )
    return perm


def _rank(o: Operand, tensors: dict[str, Any]) -> int:
    return len(o.view) if o.view is not None else len(tensors[o.tensor].dims)


def _layout(
    doc: Located, path: PathKey, raw: Any, ops: tuple[Operand, ...], tensors: dict[str, Any]
) -> str:
    sharded = [tensors[o.tensor].shard for o in ops if tensors[o.tensor].shard.kind != "replicated"]
    if raw is None or raw == "replicated":
        if sharded and raw is None and len(ops) == 1:
            return str(sharded[0].kind)  # a unary op keeps its tensor's layout
        if sharded:
            raise doc.error(
                (*path, "shard"), "a result of sharded operands must declare its shard layout"
            )
        return "replicated"
    if "axis" in raw:
        raise doc.error((*path, "shard"), "a transform's result is laid out by rows or cols")
    kind = "rows" if "rows" in raw else "cols"
    unit = raw[kind]
    if unit not in {s.unit for s in sharded}:
        raise doc.error(
            (*path, "shard"), f"layout unit {unit!r} is not the unit of a sharded operand"
        )
    return kind


def _unit_axis(doc: Located, o: Operand, tensors: dict[str, Any]) -> int | None:
    """The operand axis that holds the shard units (after its view), or None if replicated."""
    t: TensorRule = tensors[o.tensor]
    if t.shard.kind == "replicated":
        return None
    axis = t.shard.resolved(len(t.dims))
    if o.view is None:
        return axis
    texts = [ast_text(e) for e in o.view]
    if axis >= len(texts) or texts[axis] != t.shard.unit:
        raise doc.error(
            (*o.path, "view"),
            f"the view must put the shard unit {t.shard.unit!r} alone at axis {axis}, "
            f"where {o.tensor.split('.', 1)[-1]} is split across ranks",
        )
    lead = [ast_text(e) for e in t.dims[:axis]]
    if texts[:axis] != lead:
        raise doc.error(
            (*o.path, "view"), f"the view must keep the leading dims {lead} before the unit"
        )
    if o.slice is not None and o.slice.axis == axis:
        raise doc.error((*o.path, "slice"), "cannot slice the axis the shard splits")
    return axis


def ast_text(e: algebra.Expr) -> str:
    import ast

    return ast.unparse(e.node)


def lower(doc: Located, path: PathKey, spec: str, ranks: list[int]) -> Lowering:
    """``core.einsum.lower`` at the operands' ranks, its refusal located in the spec."""
    try:
        return einsum.lower(spec, (ranks[0], ranks[1]))
    except AlgebraError as exc:
        raise doc.error(path, str(exc)) from None


def result_shape(
    tf: Transform,
    tensors: dict[str, Any],
    local_env: dict[str, int],
    local_shapes: dict[str, tuple[int, ...]],
    doc: Located,
    path: PathKey,
    context: str,
) -> tuple[int, ...]:
    """The result's shape on one rank; refuses a view, slice or letter size that does not fit."""

    def ev(e: algebra.Expr, where: PathKey) -> int:
        try:
            return int(algebra.evaluate(e, local_env))
        except Exception as exc:  # AlgebraError or GeometryError from the shared ops
            raise doc.error(where, f"{context}: {exc}") from None

    shapes = []
    for o in tf.operands:
        shape = local_shapes[o.tensor]
        if o.view is not None:
            view = tuple(ev(e, (*o.path, "view", i)) for i, e in enumerate(o.view))
            if _numel(view) != _numel(shape):
                raise doc.error(
                    (*o.path, "view"),
                    f"{context}: view {list(view)} has {_numel(view)} elements, "
                    f"{o.tensor} has {_numel(shape)} {list(shape)}",
                )
            shape = view
        if o.slice is not None:
            s = o.slice
            if s.axis >= len(shape):
                raise doc.error(
                    (*o.path, "slice"),
                    f"{context}: axis {s.axis} is out of range for rank {len(shape)}",
                )
            start = 0 if s.start is None else ev(s.start, (*o.path, "slice", "start"))
            stop = shape[s.axis] if s.stop is None else ev(s.stop, (*o.path, "slice", "stop"))
            if not 0 <= start < stop <= shape[s.axis]:
                raise doc.error(
                    (*o.path, "slice"),
                    f"{context}: slice [{start}:{stop}] does not fit dim {shape[s.axis]}",
                )
            shape = (*shape[: s.axis], stop - start, *shape[s.axis + 1 :])
        shapes.append(shape)
    if tf.lowering is None:
        shape = shapes[0]
        if tf.permute is not None:
            shape = tuple(shape[a] for a in tf.permute)
        return _unary_reshape(tf, tensors, shape, ev, doc, path, context)
    low = tf.lowering
    sizes: dict[str, int] = {}
    for letters, shape in zip((low.letters_a, low.letters_b), shapes, strict=True):
        for c, n in zip(letters, shape, strict=True):
            if sizes.setdefault(c, n) != n:
                raise doc.error(
                    (*path, "einsum"),
                    f"{context}: letter {c!r} is {sizes[c]} in one operand and {n} in the other",
                )
    shape = tuple(sizes[c] for c in low.letters_out)
    groups = [c for c in low.letters_out]  # which output letters each result axis holds
    if tf.view is not None:
        view = tuple(ev(e, (*path, "view", i)) for i, e in enumerate(tf.view))
        if _numel(view) != _numel(shape):
            raise doc.error(
                (*path, "view"),
                f"{context}: view {list(view)} has {_numel(view)} elements, "
                f"the einsum gives {_numel(shape)} {list(shape)}",
            )
        groups = _merge(low.letters_out, sizes, view, doc, (*path, "view"), context)
        shape = view
    _check_layout(tf, groups, doc, path)
    return shape


def _unary_reshape(
    tf: Transform,
    tensors: dict[str, Any],
    shape: tuple[int, ...],
    ev: Any,
    doc: Located,
    path: PathKey,
    context: str,
) -> tuple[int, ...]:
    """A unary result's ``reshape``: it merges consecutive axes only, and the shard unit's axis
    must lead the result axis the layout splits (rows: the first, cols: the last)."""
    if tf.view is None:
        return shape
    view = tuple(ev(e, (*path, "reshape", i)) for i, e in enumerate(tf.view))
    letters = "abcdefgh"[: len(shape)]
    if _numel(view) != _numel(shape):
        raise doc.error(
            (*path, "reshape"),
            f"{context}: reshape {list(view)} has {_numel(view)} elements, "
            f"the operand gives {_numel(shape)} {list(shape)}",
        )
    groups = _merge(letters, dict(zip(letters, shape, strict=True)), view, doc,
                    (*path, "reshape"), context)  # fmt: skip
    o = tf.operands[0]
    t: TensorRule = tensors[o.tensor]
    if t.shard.kind != "replicated" and tf.layout_kind != "replicated":
        at = t.shard.resolved(len(t.dims))  # the view keeps it there (_unit_axis)
        unit = letters[at if tf.permute is None else tf.permute.index(at)]
        axis = 0 if tf.layout_kind == "rows" else len(groups) - 1
        if not groups[axis].startswith(unit):
            raise doc.error(
                (*path, "reshape"),
                f"{context}: a {tf.layout_kind} layout needs the shard unit's axis to lead "
                f"result axis {axis}",
            )
    return view


def _merge(
    letters: str,
    sizes: dict[str, int],
    view: tuple[int, ...],
    doc: Located,
    path: PathKey,
    ctx: str,
) -> list[str]:
    """The output letters each view axis merges; a view must merge consecutive axes only."""
    groups: list[str] = []
    i = 0
    for dim in view:
        group, n = "", 1
        while i < len(letters) and (
            n < dim or (n == dim and sizes[letters[i]] == 1 and group == "")
        ):
            n *= sizes[letters[i]]
            group += letters[i]
            i += 1
        if n != dim:
            raise doc.error(
                path,
                f"{ctx}: view {list(view)} does not merge consecutive axes of "
                f"[{', '.join(letters)}]",
            )
        groups.append(group)
    return groups


def _check_layout(tf: Transform, groups: list[str], doc: Located, path: PathKey) -> None:
    """The shard unit's letter must lead the result axis that the layout splits."""
    if tf.unit_letter is None or tf.layout_kind == "replicated":
        return
    axis = 0 if tf.layout_kind == "rows" else len(groups) - 1
    if not groups[axis].startswith(tf.unit_letter):
        raise doc.error(
            (*path, "shard"),
            f"a {tf.layout_kind} layout needs the unit's letter {tf.unit_letter!r} to lead result "
            f"axis {axis}, which holds [{', '.join(groups[axis])}]",
        )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
