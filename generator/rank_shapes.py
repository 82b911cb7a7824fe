"""Shapes as one rank holds them, for the comments of generated code.

A generated binder runs on one (tp rank, ep rank); its arrays are that rank's share, so a
comment that says ``[H * KVL, QL]`` where the array is ``[H/tp * KVL, QL]`` misleads the reader
who debugs it. Every shape comment of a block module is written here, from the shard rules:
- a tensor sharded ``{rows|cols|axis: U}`` holds ``U_r = U/tp`` of its units on the split axis:
  that dim's factor ``U`` becomes ``U_r`` (through a derived symbol: ``Q = H * D`` on ``{rows:
  H}`` reads ``H_r * D``); a dim that is not a product with ``U`` as a factor reads ``(d) / tp``;
- a family split across ep ranks (``{count: E, shard: experts}``) stacks ``E_r`` members;
- a replicated tensor keeps its global shape and says ``replicated``;
- inside a declared transform every unit of a sharded operand is this rank's (the spec's
  trap: a view's ``H`` means this rank's heads), exactly as the generated code computes it.
Each rank-local name used is recorded with one legend line (``H_r = H/tp: this rank's
attention heads``) that the module prints once above its rules.

Invariant: the rank-local name of unit ``U`` is ``U_r`` in comments and in the generated
transform code alike; a block whose own symbol or derived symbol is already called ``U_r`` is
refused, since the generated local would shadow it.
Trap: ep shares are uneven when ``ep`` does not divide the family (vLLM's map gives the first
``E % ep`` ranks one more member), so ``E_r`` is defined in words, not as ``E/ep``.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterable, Mapping

from specbind.core import algebra
from specbind.core.errors import GenerateError
from specbind.core.ir import TensorRule
from specbind.generator.block_spec import Block
from specbind.generator.transforms import Operand


def rank_name(unit: str) -> str:
    """The rank-local name of a shard unit or family count: ``H`` -> ``H_r``."""
    return f"{unit}_r"


class RankShapes:
    """Shape text for one block's comments; ``legend()`` lists the rank-local names used."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self._used: dict[str, str] = {}  # rank-local name -> its legend line
        taken = set(block.symbols) | set(block.derived)
        units = {t.shard.unit for t in block.tensors if t.shard.unit is not None}
        units |= {f.count for f in block.families.values()}
        for u in sorted(units):
            if rank_name(u) in taken:
                raise GenerateError(
                    f"{block.file}: symbol {rank_name(u)!r} clashes with the rank-local name "
                    f"of {u!r} in generated code; rename it"
                )

    # -- legend ---------------------------------------------------------------------------

    def what(self, unit: str) -> str:
        """``H (attention heads)``: the symbol and the spec's words for it."""
        doc = self.block.symbols.get(unit)
        return f"{unit} ({doc})" if doc else unit

    def tp_unit(self, unit: str) -> str:
        """``U_r``, recording its legend line."""
        whole = any(t.shard.unit == unit and t.shard.never_replicated for t in self.block.tensors)
        when = f"a tp > {unit} refused" if whole else f"1 when tp > {unit}"
        self._used[rank_name(unit)] = (
            f"{rank_name(unit)} = {unit}/tp ({when}): this rank's share of {self.what(unit)}"
        )
        return rank_name(unit)

    def ep_count(self, count: str) -> str:
        """``E_r`` for a family of ``count`` members split across ep ranks."""
        self._used[rank_name(count)] = (
            f"{rank_name(count)}: this ep rank's members of {self.what(count)}, {count}/ep "
            f"and one more on the first {count} % ep ranks"
        )
        return rank_name(count)

    def legend(self) -> list[str]:
        return [self._used[k] for k in sorted(self._used)]

    # -- shapes ---------------------------------------------------------------------------

    def tensor_dims(self, t: TensorRule) -> list[str]:
        """The dims of this rank's share of one on-disk tensor (one family member's, for a
        family), global where it is replicated."""
        dims = [_text(e.node) for e in t.dims]
        if t.stacked is not None:  # [E, ...] -> [E_r, ...]: this ep rank's members
            dims[0] = self.ep_count(self.block.families[t.stacked].count)
        if t.shard.kind == "replicated" or t.shard.unit is None or not t.dims:
            return dims
        axis = t.shard.resolved(len(t.dims))
        dims[axis] = self.share(t.dims[axis], t.shard.unit)
        return dims

    def share(self, dim: algebra.Expr, unit: str) -> str:
        """This rank's share of a dim that holds whole ``unit``s."""
        node = _scaled(dim.node, unit, rank_name(unit), self.block.derived, 0)
        if node is None:
            return _text(ast.BinOp(dim.node, ast.Div(), ast.Name("tp")))
        self.tp_unit(unit)
        return _text(node)

    def operand(
        self, o: Operand, units: Iterable[str]
    ) -> tuple[list[str], list[str], list[str], str]:
        """A transform operand on this rank: its dims as read, after its view, after its
        slice, and the slice's ``[start:stop]`` text ("" when it takes no slice)."""
        units = set(units)
        rule = self.block.tensor(o.tensor)
        read = self.tensor_dims(rule)
        counts = self.stacked_counts([o])
        viewed = read if o.view is None else self.local(o.view, units, counts)
        if o.slice is None:
            return read, viewed, viewed, ""
        s = o.slice
        rename = {u: self.tp_unit(u) for u in units if u in _names(s.start) | _names(s.stop)}
        start = None if s.start is None else _renamed(s.start.node, rename)
        stop = None if s.stop is None else _renamed(s.stop.node, rename)
        lo = "0" if start is None else _text(start)
        bounds = f"[{lo}:{'end' if stop is None else _text(stop)}]"
        sliced = list(viewed)
        sliced[s.axis] = _span(start, stop, viewed[s.axis])
        return read, viewed, sliced, bounds

    def stacked_counts(self, operands: Iterable[Operand]) -> set[str]:
        """The family counts of the stacked operands: in their views the count is this ep
        rank's members (``E_r``)."""
        fams = {self.block.tensor(o.tensor).stacked for o in operands}
        return {self.block.families[f].count for f in fams if f is not None}

    def local(
        self, exprs: Iterable[algebra.Expr], units: Iterable[str], counts: Iterable[str] = ()
    ) -> list[str]:
        """Dims written in a transform's terms: each of ``units`` is this rank's share, each of
        ``counts`` (a stacked operand's family) this ep rank's members."""
        exprs = list(exprs)
        present = {n for e in exprs for n in e.names}
        rename = {u: self.tp_unit(u) for u in units if u in present}
        rename |= {c: self.ep_count(c) for c in counts if c in present}
        return [_text(_renamed(e.node, rename)) for e in exprs]


def dims_text(dims: Iterable[str]) -> str:
    return "[" + ", ".join(dims) + "]"


def times(n: int, dim: str) -> str:
    """``n`` copies of ``dim`` joined along it: ``2 * (KVL + R)``, ``2 * S * Im_r``; a dim of
    ``1`` gives ``n``."""
    if dim == "1":
        return str(n)
    return _text(_times(n, ast.parse(dim, mode="eval").body))


def _times(n: int, node: ast.expr) -> ast.expr:
    """``n * node``, associated leftwards through a product so it prints without parentheses."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return ast.BinOp(_times(n, node.left), ast.Mult(), node.right)
    return ast.BinOp(ast.Constant(n), ast.Mult(), node)


def _text(node: ast.expr) -> str:
    return ast.unparse(node)


def _names(e: algebra.Expr | None) -> frozenset[str]:
    return frozenset() if e is None else e.names


def _span(start: ast.expr | None, stop: ast.expr | None, dim: str) -> str:
    """The length of ``[start:stop]`` of a dim: ``stop`` from 0, ``R`` for ``[KVL:KVL + R]``."""
    end = ast.parse(dim, mode="eval").body if stop is None else stop
    if start is None or (isinstance(start, ast.Constant) and start.value == 0):
        return _text(end)
    if (
        isinstance(end, ast.BinOp)
        and isinstance(end.op, ast.Add)
        and ast.dump(end.left) == ast.dump(start)
    ):
        return _text(end.right)
    return _text(ast.BinOp(end, ast.Sub(), start))


def _scaled(
    node: ast.expr, unit: str, local: str, derived: Mapping[str, algebra.Expr], depth: int
) -> ast.expr | None:
    """``node`` with its factor ``unit`` replaced by ``local``, or None when ``unit`` is not a
    factor of the product (a derived symbol is expanded to find it)."""
    if depth > algebra.MAX_DEPTH:
        return None
    if isinstance(node, ast.Name):
        if node.id == unit:
            return ast.Name(local)
        if node.id in derived:
            return _scaled(derived[node.id].node, unit, local, derived, depth + 1)
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left = _scaled(node.left, unit, local, derived, depth + 1)
        if left is not None:
            return ast.BinOp(left, ast.Mult(), node.right)
        right = _scaled(node.right, unit, local, derived, depth + 1)
        if right is not None:
            return ast.BinOp(node.left, ast.Mult(), right)
    return None


class _Rename(ast.NodeTransformer):
    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return ast.Name(self.names.get(node.id, node.id))


def _renamed(node: ast.expr, names: Mapping[str, str]) -> ast.expr:
    out = _Rename(names).visit(copy.deepcopy(node))
    assert isinstance(out, ast.expr)
    return out
