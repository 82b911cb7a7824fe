"""Python source for declared transforms: one small function per output, plain NumPy via
``runtime.ops``, a shape comment on every view, slice and contraction.

Invariant: the emitted code names symbols only through checked identifiers (``g.X``, a local
unit count, a local derived symbol) and literals only through ``repr``; the einsum lowering is
emitted as integer tuples computed here, at generate time.
"""

from __future__ import annotations

from core import algebra
from generator.literals import comment, py_literal
from generator.spec import Block, Output
from generator.transforms import Operand, Transform, ast_text


def _dims(exprs: tuple[algebra.Expr, ...]) -> str:
    return "[" + ", ".join(ast_text(e) for e in exprs) + "]"


class _Names:
    """Symbol -> Python: this rank's units and derived symbols as locals, the rest as ``g.S``."""

    def __init__(self, block: Block, local_units: set[str]) -> None:
        self.block = block
        self.local_units = local_units
        self.used: set[str] = set()

    def __call__(self, sym: str) -> str:
        if sym in self.local_units or sym in self.block.derived:
            self.used.add(sym)
            return sym
        return f"g.{sym}"


def function(block: Block, out: Output, geo_class: str) -> tuple[str, str]:
    """(function name, source) computing ``out`` on this rank from the checked arrays ``t``."""
    tf = out.transform
    assert tf is not None
    units = {block.tensor(o.tensor).shard.unit for o in tf.operands} - {None}
    names = _Names(block, {u for u in units if u is not None})
    body: list[str] = []
    vars_ = []
    for i, o in enumerate(tf.operands):
        var = "ab"[i] if tf.lowering is not None else "x"
        body += _operand_lines(block, out, o, var, names)
        vars_.append(var)
    if tf.lowering is not None:
        low = tf.lowering
        a, b = low.letters_a, low.letters_b
        mid = _mid(low)
        factor = "None"
        if tf.scale is not None:
            factor = algebra.to_python_real(tf.scale, lambda s: f"g.{s}")
        body.append(
            f"y = ops.contract({vars_[0]}, {vars_[1]}, {low.perm_a!r}, {low.perm_b!r}, "
            f"{low.groups!r}, {low.perm_out!r}, {py_literal(tf.dtype)}, {factor})"
        )
        body.append(
            comment(
                f"# einsum {tf.einsum}: [{', '.join(a)}], [{', '.join(b)}] -> {mid} "
                f"-> [{', '.join(low.letters_out)}]"
            )
        )
        src_var = "y"
    else:
        src_var = vars_[0]
    if tf.lowering is None:
        if tf.scale is not None:
            factor = algebra.to_python_real(tf.scale, lambda s: f"g.{s}")
            body.append(comment(f"# x ({ast_text(tf.scale)}) in F32, then {tf.dtype}, in one pass"))
            body.append(f"{src_var} = ops.scale({src_var}, {factor}, {py_literal(tf.dtype)})")
        else:
            body.append(f"{src_var} = ops.cast({src_var}, {py_literal(tf.dtype)})")
    if tf.view is not None:
        shape = _tuple([algebra.to_python(e, names) for e in tf.view])
        letters = ", ".join(tf.lowering.letters_out if tf.lowering else "")
        body.append(comment(f"# [{letters}] -> {_dims(tf.view)}"))
        body.append(f"{src_var} = ops.view({src_var}, {shape}, {py_literal(out.field)})")
    body.append(f"return {src_var}")
    head = []
    for u in sorted(names.used & units):
        head.append(f"{u} = g.{u} // g.tp  # this rank's {u} units")
    needed = set(names.used & set(block.derived))
    for d in reversed(list(block.derived)):  # derived symbols the needed ones use, transitively
        if d in needed:
            needed |= block.derived[d].names & set(block.derived)
    for d in block.derived:
        if d in needed:
            head.append(f"{d} = algebra_ops.bounded({algebra.to_python(block.derived[d], names)})")
    fn = f"make_{out.field}"
    doc = f'"""``{out.field}``: {comment(describe(tf))}."""'
    lines = [
        f"def {fn}(g: {geo_class}, t: dict[str, Array], ops: Ops = numpy_ops) -> Array:",
        f"    {doc}",
    ]
    lines += [f"    {line}" for line in head + body]
    return fn, "\n".join(lines)


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


def _mid(low: object) -> str:
    from generator.transforms import Lowering

    assert isinstance(low, Lowering)
    a = [low.letters_a[i] for i in low.perm_a]
    b = [low.letters_b[i] for i in low.perm_b]
    return f"[{', '.join(a)}] @ [{', '.join(b)}]"


def _tuple(items: list[str]) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _operand_lines(block: Block, out: Output, o: Operand, var: str, names: _Names) -> list[str]:
    t = block.tensor(o.tensor)
    rel = o.tensor.removeprefix(block.prefix)
    what = f"{out.field}: {rel}"
    lines = [f"{var} = t[{py_literal(o.tensor)}]"]
    cur = _dims(t.dims)
    if o.view is not None:
        shape = _tuple([algebra.to_python(e, names) for e in o.view])
        lines.append(comment(f"# {cur} -> {_dims(o.view)}"))
        lines.append(f"{var} = ops.view({var}, {shape}, {py_literal(what)})")
        cur = _dims(o.view)
    if o.slice is not None:
        s = o.slice
        start = "0" if s.start is None else algebra.to_python(s.start, names)
        stop = f"{var}.shape[{s.axis}]" if s.stop is None else algebra.to_python(s.stop, names)
        lines.append(
            comment(f"# {cur}, axis {s.axis} [{_text(s.start, '0')}:{_text(s.stop, 'end')}]")
        )
        lines.append(f"{var} = ops.take({var}, {s.axis}, {start}, {stop}, {py_literal(what)})")
    return lines


def _text(e: algebra.Expr | None, default: str) -> str:
    return default if e is None else ast_text(e)
