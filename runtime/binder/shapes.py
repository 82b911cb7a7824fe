"""The binder's own ops on shapes alone: what a bound field's shape is, with no bytes.

A reload must know the shape of every field a bind of one rank holds, at any geometry, with
no checkpoint to read. Rather than a second formula per field kind (which could drift from
the binder), the generated ``assemble`` — the one function that makes every field from a
rank's checked arrays — is run on ``Shaped`` placeholders with ``SHAPE_OPS``: each op here
returns the shape (and dtype) the NumPy op in ``runtime.binder.ops`` returns, and refuses what it
refuses, so a field's expected shape is the binder's own result.

Invariants: every method of ``ops.Ops`` is here with the same signature; a result's shape is
exactly NumPy's (concatenate, stack, einsum lowered to matmul, the dequant and swizzle shapes
of ``runtime.binder.quant_numerics``); no array is ever allocated, so a full-geometry rank costs
microseconds. ``Shaped.dtype`` is the spec's dtype name ("BF16"), not NumPy's.
Trap: a new op in ``ops.Ops`` needs its shape rule here too, or reloading a file of a block
that uses it fails with an AttributeError — ``tests/runtime/test_reload_verify.py`` runs every
model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from specbind.core.einsum import lower
from specbind.core.errors import BindError
from specbind.core.planning import BlockPlan
from specbind.core.record import record
from specbind.runtime.binder.ops import matmul_dims
from specbind.runtime.binder.quant_numerics import (
    fp8_block_geometry,
    int_group_geometry,
    nvfp4_geometry,
    padded_shape,
)


@record
class Shaped:
    """An array's shape and dtype, nothing else."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def reshape(self, *shape: Any) -> Shaped:
        dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        dims = tuple(int(d) for d in dims)
        if math.prod(dims) != self.size:
            raise BindError(f"cannot reshape {list(self.shape)} to {list(dims)}")
        return Shaped(dims, self.dtype)


def planned(plan: BlockPlan, leave_out: frozenset[str] = frozenset()) -> dict[str, Shaped]:
    """Each planned tensor as the binder hands it to ``assemble``: this rank's local shape in
    the rule's dtype (a stored dtype is converted before, and a packed companion keeps its
    own); ``leave_out`` names tensors absent from the checkpoint (an optional group)."""
    return {
        n: Shaped(p.local_shape, p.dtype) for n, p in plan.tensors.items() if n not in leave_out
    }


def _axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise BindError(f"axis {axis} is outside a rank-{ndim} array")
    return axis % ndim


def _joined(parts: Sequence[Shaped], axis: int) -> list[int]:
    """np.concatenate's result shape, refusing what it refuses."""
    first = parts[0].shape
    ax = _axis(axis, len(first))
    for p in parts[1:]:
        if len(p.shape) != len(first) or any(
            a != b for i, (a, b) in enumerate(zip(p.shape, first, strict=True)) if i != ax
        ):
            raise BindError(f"cannot join {[list(x.shape) for x in parts]} on axis {axis}")
    out = list(first)
    out[ax] = sum(p.shape[ax] for p in parts)
    return out


def _squeezed(dims: list[int], squeeze: int | None) -> list[int]:
    if squeeze is None:
        return dims
    if dims[squeeze] != 1:
        raise BindError(f"cannot squeeze dim {squeeze} of shape {dims}: it is not 1")
    out = list(dims)
    del out[squeeze]
    return out


class ShapeOps:
    """``ops.Ops`` on ``Shaped`` values (the module docstring says why)."""

    def view(self, a: Shaped, shape: tuple[int, ...], what: str) -> Shaped:
        if math.prod(shape) != a.size:
            raise BindError(
                f"{what}: cannot view {list(a.shape)} ({a.size} elements) as {list(shape)}"
            )
        return Shaped(tuple(shape), a.dtype)

    def permute(self, a: Shaped, axes: tuple[int, ...], what: str, into: Any = None) -> Shaped:
        if sorted(axes) != list(range(a.ndim)):
            raise BindError(f"{what}: cannot permute {list(a.shape)} by {list(axes)}")
        return Shaped(tuple(a.shape[i] for i in axes), a.dtype)

    def take(self, a: Shaped, axis: int, start: int, stop: int, what: str) -> Shaped:
        ax = _axis(axis, a.ndim)
        if not 0 <= start < stop <= a.shape[ax]:
            raise BindError(
                f"{what}: slice [{start}:{stop}] does not fit axis {axis} of {list(a.shape)}"
            )
        dims = list(a.shape)
        dims[ax] = stop - start
        return Shaped(tuple(dims), a.dtype)

    def pairs_to_halves(self, a: Shaped, groups: int, what: str) -> Shaped:
        rows = a.shape[0] if a.ndim else 0
        if groups < 1 or rows % groups or (rows // groups) % 2:
            raise BindError(
                f"{what}: {rows} rows are not {groups} groups of an even number of rows "
                "(rotary pairs to halves)"
            )
        return a  # rows reordered within each group: the shape and dtype are the source's

    def widen(self, a: Shaped) -> Shaped:
        return Shaped(a.shape, "F32")

    def scale(self, a: Shaped, factor: float, dtype: str, into: Any = None) -> Shaped:
        return Shaped(a.shape, dtype)

    def cast(self, a: Shaped, dtype: str, into: Any = None) -> Shaped:
        return Shaped(a.shape, dtype)

    def concat_squeeze(
        self, parts: Sequence[Shaped], axis: int, squeeze: int | None, into: Any = None
    ) -> Shaped:
        return Shaped(tuple(_squeezed(_joined(parts, axis), squeeze)), parts[0].dtype)

    def stack(
        self,
        groups: Sequence[Sequence[Shaped]],
        axis: int,
        squeeze: int | None,
        into: Any = None,
    ) -> Shaped:
        n = len(groups[0])
        if n == 0 or any(len(g) != n for g in groups):
            raise BindError(f"cannot stack {[len(g) for g in groups]} members")
        member = _squeezed(_joined([g[0] for g in groups], axis), squeeze)
        return Shaped((n, *member), groups[0][0].dtype)

    def contract(
        self,
        a: Shaped,
        b: Shaped,
        *,
        einsum: str,
        dtype: str,
        factor: float | None = None,
        into: Any = None,
    ) -> Shaped:
        low = lower(einsum, (a.ndim, b.ndim))
        at = tuple(a.shape[i] for i in low.perm_a)
        bt = tuple(b.shape[i] for i in low.perm_b)
        (bs, ls, cs, rs), _ = matmul_dims(low, at, bt)
        if tuple(bt[: len(bs)]) != bs or tuple(bt[len(bs) : len(bs) + len(cs)]) != cs:
            raise BindError(f"{einsum}: operands {list(a.shape)} and {list(b.shape)} disagree")
        mid = (*bs, *ls, *rs)
        return Shaped(tuple(mid[i] for i in low.perm_out), dtype)

    def dequant_nvfp4(
        self,
        packed: Shaped,
        scale: Shaped,
        global_scale: Any,
        *,
        divide: bool,
        group: int = 16,
        negative_zero: bool | None = None,
    ) -> Shaped:
        lead, rows, cols = nvfp4_geometry(packed.shape, scale.shape, group, "dequant")
        return Shaped((*lead, rows, cols), "BF16")

    def dequant_fp8_block(
        self, weight: Shaped, scale_inv: Shaped, *, block: tuple[int, int] = (128, 128)
    ) -> Shaped:
        lead, rows, cols = fp8_block_geometry(weight.shape, scale_inv.shape, block, "dequant")
        return Shaped((*lead, rows, cols), "BF16")

    def dequant_int_group(
        self, packed: Shaped, scale: Shaped, zero: Shaped | None, *, bits: int
    ) -> Shaped:
        zs = None if zero is None else zero.shape
        lead, rows, cols, _ = int_group_geometry(packed.shape, scale.shape, zs, bits, "dequant")
        return Shaped((*lead, rows, cols), "BF16")

    def dequant_scaled(self, weight: Shaped, scale: Shaped) -> Shaped:
        *lead, rows, _ = weight.shape
        n = math.prod(lead)
        if scale.shape not in ((*lead, rows, 1),) and math.prod(scale.shape) != n:
            raise BindError(f"dequant: weight {list(weight.shape)}, scale {list(scale.shape)}")
        return Shaped(weight.shape, "BF16")

    def dequant_mxfp4(self, blocks: Shaped, scales: Shaped) -> Shaped:
        if blocks.shape[-1:] != (16,) or blocks.shape[:-1] != scales.shape:
            raise BindError(f"dequant: blocks {list(blocks.shape)}, scales {list(scales.shape)}")
        return Shaped((*scales.shape[:-1], scales.shape[-1] * 32), "BF16")

    def swizzle_blockscale(self, scale: Shaped) -> Shaped:
        *lead, m, k = scale.shape
        return Shaped((*lead, *padded_shape(m, k)), scale.dtype)


SHAPE_OPS = ShapeOps()
