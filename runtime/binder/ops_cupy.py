"""The transform ops on a CUDA device: generated kernels for the elementwise work and gathers,
cuBLAS (``cupy.matmul``) for the contractions — never a hand-written GEMM.

Mirrors :mod:`runtime.binder.ops` call for call, with BF16 carried as ``uint16`` bits. Invariants:
widening is exact, narrowing rounds to nearest even (the kernels are bit-exact with ml_dtypes,
tested on the CPU harness); contractions compute in F32, so an absorbed field may differ from
the NumPy backend's by at most 1 BF16 ulp (cuBLAS may sum in another order), while every
verbatim and elementwise field is byte-identical, the quantized dequants and the block-scale
swizzle included (F8 data travels as its uint8 bits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from specbind.core.einsum import lower
from specbind.core.errors import BindError
from specbind.runtime.binder import quant_numerics as qn
from specbind.runtime.binder.ops import matmul_dims

# The generated kernel wrappers, handed over by ``runtime.binder.backends.cupy_backend`` (the
# runtime never imports ``generated`` itself).
kernels: Any = None


def use(module: Any) -> None:
    global kernels
    kernels = module


def _cp() -> Any:
    return kernels.cupy()


def _bf16(a: Any) -> bool:
    return str(a.dtype) == "uint16"


def view(a: Any, shape: tuple[int, ...], what: str) -> Any:
    if math.prod(shape) != a.size:
        raise BindError(f"{what}: cannot view {list(a.shape)} ({a.size} elements) as {list(shape)}")
    return a.reshape(shape)


def take(a: Any, axis: int, start: int, stop: int, what: str) -> Any:
    """A slice along ``axis``, materialised by the column-gather kernel on the 2-D view
    [prod(leading dims), prod(axis and trailing dims)]."""
    if not 0 <= start < stop <= a.shape[axis]:
        raise BindError(
            f"{what}: slice [{start}:{stop}] does not fit axis {axis} of {list(a.shape)}"
        )
    a = _cp().ascontiguousarray(a)
    lead, inner = math.prod(a.shape[:axis]), math.prod(a.shape[axis + 1 :])
    grid = a.reshape(lead, a.shape[axis] * inner)  # [lead, axis·inner]
    gather = getattr(kernels, f"gather_cols_b{a.dtype.itemsize}")
    out = gather(grid, start * inner, (stop - start) * inner)
    return out.reshape(*a.shape[:axis], stop - start, *a.shape[axis + 1 :])  # back to rank n


def _host_only(into: Any) -> None:
    """``into`` is an ``Arena`` of host memory: a device bind has nowhere in it to write."""
    if into is not None:
        raise BindError("into=Arena holds host memory; the cupy backend binds on the device")


def permute(a: Any, axes: tuple[int, ...], what: str, into: Any = None) -> Any:
    """The axes reordered, materialised in C order on the device."""
    _host_only(into)
    if sorted(axes) != list(range(a.ndim)):
        raise BindError(f"{what}: cannot permute {list(a.shape)} by {list(axes)}")
    return _cp().ascontiguousarray(a.transpose(axes))


def pairs_to_halves(a: Any, groups: int, what: str) -> Any:
    """As the host's ``ops.pairs_to_halves``, materialised in C order on the device."""
    rows = a.shape[0] if a.ndim else 0
    if groups < 1 or rows % groups or (rows // groups) % 2:
        raise BindError(
            f"{what}: {rows} rows are not {groups} groups of an even number of rows "
            "(rotary pairs to halves)"
        )
    per = rows // groups
    moved = a.reshape(groups, per // 2, 2, *a.shape[1:]).swapaxes(1, 2)
    return _cp().ascontiguousarray(moved).reshape(a.shape)


def widen(a: Any) -> Any:
    if _bf16(a):
        return kernels.widen_bf16_f32(_cp().ascontiguousarray(a))
    if str(a.dtype) == "float32":
        return a
    if str(a.dtype) == "float16":
        return a.astype(_cp().float32)  # exact, as on the host
    raise BindError(f"refusing to compute on {a.dtype} on the device")


def cast(a: Any, dtype: str, into: Any = None) -> Any:
    _host_only(into)
    cp = _cp()
    if dtype == "BF16":
        return a.copy() if _bf16(a) else kernels.narrow_f32_bf16(cp.ascontiguousarray(widen(a)))
    if dtype == "F32":
        return cp.ascontiguousarray(widen(a))
    raise BindError(f"the CuPy backend casts to BF16 or F32, not {dtype}")


def scale(a: Any, factor: float, dtype: str, into: Any = None) -> Any:
    _host_only(into)
    cp = _cp()
    if _bf16(a) and dtype == "BF16":
        return kernels.scale_bf16(cp.ascontiguousarray(a), factor)  # widen, scale, narrow: one pass
    return cast(widen(a) * cp.float32(factor), dtype)


def concat_squeeze(parts: Sequence[Any], axis: int, squeeze: int | None, into: Any = None) -> Any:
    _host_only(into)
    cp = _cp()
    fn = getattr(kernels, f"concat_rows_{len(parts)}_b{parts[0].dtype.itemsize}", None)
    joined = (
        fn([cp.ascontiguousarray(p) for p in parts])
        if axis == 0 and fn
        else cp.concatenate(parts, axis=axis)
    )
    if squeeze is None:
        return joined
    if joined.shape[squeeze] != 1:
        raise BindError(f"cannot squeeze dim {squeeze} of shape {list(joined.shape)}: it is not 1")
    return joined.squeeze(axis=squeeze)  # [.., 1, ..] -> [.., ..]: same bytes


def stack(groups: Sequence[Sequence[Any]], axis: int, squeeze: int | None, into: Any = None) -> Any:
    """As :func:`runtime.binder.ops.stack`, on the device: one slice per family member on axis 0; at
    most one member's temporary lives beside the result."""
    _host_only(into)
    cp = _cp()
    n = len(groups[0])
    if n == 0 or any(len(g) != n for g in groups):
        raise BindError(f"cannot stack {[len(g) for g in groups]} members")
    first = concat_squeeze([g[0] for g in groups], axis, squeeze)
    out = cp.empty((n, *first.shape), dtype=first.dtype)  # one result, filled member by member
    out[0] = first
    for i in range(1, n):
        out[i] = concat_squeeze([g[i] for g in groups], axis, squeeze)
    return out


def contract(
    a: Any,
    b: Any,
    *,
    einsum: str,
    dtype: str,
    factor: float | None = None,
    into: Any = None,
) -> Any:
    """``einsum`` as cuBLAS batched GEMM in F32: [B, L, C] @ [B, C, R], then scale and cast."""
    _host_only(into)
    cp = _cp()
    low = lower(einsum, (a.ndim, b.ndim))
    at, bt = widen(a).transpose(low.perm_a), widen(b).transpose(low.perm_b)
    (bs, ls, _, rs), (nbatch, nleft, ncon, nright) = matmul_dims(low, at.shape, bt.shape)
    a3 = at.reshape(nbatch, nleft, ncon)  # [batch.., left.., contract..] -> [B, L, C]
    b3 = bt.reshape(nbatch, ncon, nright)  # [batch.., contract.., right..] -> [B, C, R]
    y = cp.matmul(a3, b3)  # cuBLAS, F32
    if factor is not None:
        y *= cp.float32(factor)
    y = y.reshape(*bs, *ls, *rs).transpose(low.perm_out)  # [batch.., left.., right..] -> output
    y = cp.ascontiguousarray(y)
    return cast(y, dtype)


def _bytes(a: Any, what: str, name: str) -> Any:
    """1-byte data (U8, or F8 carried as its uint8 bits on the device), C-contiguous."""
    if str(a.dtype) != "uint8":
        raise BindError(f"{what}: {name} is {a.dtype} on the device, expected uint8 bits")
    return _cp().ascontiguousarray(a)


def dequant_nvfp4(
    packed: Any,
    scale: Any,
    global_scale: Any,
    *,
    divide: bool,
    group: int = 16,
    negative_zero: bool | None = None,
    what: str = "NVFP4 dequant",
) -> Any:
    """As :func:`runtime.binder.quant_numerics.dequant_nvfp4`, by the generated kernel; BF16
    bits."""
    cp = _cp()
    packed, scale = (
        _bytes(packed, what, "the packed weight"),
        _bytes(scale, what, "the group scale"),
    )
    lead, rows, _ = qn.nvfp4_geometry(packed.shape, scale.shape, group, what)
    g = cp.asarray(global_scale)
    if str(g.dtype) != "float32":
        raise BindError(f"{what}: the global scale is {g.dtype}, expected F32")
    shape = qn.global_segments(g.shape, lead, rows, what)
    per = cp.broadcast_to(g, shape) if g.shape == () else g.reshape(shape)  # -> [.., S]
    per = cp.ascontiguousarray(per).reshape(-1)  # [.., S] -> [prod(lead) * S]
    neg = divide if negative_zero is None else negative_zero
    return kernels.dequant_nvfp4_bf16(packed, scale, per, group, divide, neg)


def dequant_fp8_block(
    weight: Any,
    scale_inv: Any,
    *,
    block: tuple[int, int] = (128, 128),
    what: str = "FP8 block dequant",
) -> Any:
    """As :func:`runtime.binder.quant_numerics.dequant_fp8_block`, by the generated kernel; a BF16
    scale is widened exactly first."""
    weight = _bytes(weight, what, "the weight")
    qn.fp8_block_geometry(weight.shape, scale_inv.shape, block, what)
    if str(scale_inv.dtype) not in ("float32", "uint16"):
        raise BindError(f"{what}: the block scale is {scale_inv.dtype}, expected F32 or BF16")
    return kernels.dequant_fp8_block_bf16(weight, cast(scale_inv, "F32"), block[0], block[1])


def dequant_scaled(weight: Any, scale: Any, *, what: str = "scaled dequant") -> Any:
    """As :func:`runtime.binder.quant_numerics.dequant_scaled`, by the generated block kernels
    with one block per row (a channel scale ``[..., O, 1]``) or per matrix (one value): the
    FP8 kernel for E4M3 bits, the int8 kernel for int8."""
    cp = _cp()
    if weight.ndim < 2:
        raise BindError(f"{what}: the weight is {list(weight.shape)}, expected [..., O, I]")
    *lead, rows, cols = weight.shape
    n = math.prod(lead)
    s = cast(cp.asarray(scale), "F32") if str(scale.dtype) != "float32" else cp.asarray(scale)
    per_row = s.size == n * rows and s.shape[-1:] == (1,) and rows > 1
    if not per_row and s.size != n:
        raise BindError(f"{what}: the scale is {list(s.shape)} for weight {list(weight.shape)}")
    s3 = cp.ascontiguousarray(s.reshape(*lead, rows if per_row else 1, 1))  # [.., O or 1, 1]
    block = (1 if per_row else rows, cols)
    if str(weight.dtype) == "int8":
        w = cp.ascontiguousarray(weight)
        return kernels.dequant_int8_block_bf16(w, s3, block[0], block[1])
    return kernels.dequant_fp8_block_bf16(_bytes(weight, what, "the weight"), s3, *block)


def dequant_int_group(
    packed: Any, scale: Any, zero: Any, *, bits: int, what: str = "int dequant"
) -> Any:
    """As :func:`runtime.binder.quant_numerics.dequant_int_group`, by the generated kernel; a
    BF16 or F16 scale is widened exactly first."""
    cp = _cp()
    zs = None if zero is None else tuple(zero.shape)
    qn.int_group_geometry(tuple(packed.shape), tuple(scale.shape), zs, bits, what)
    if str(scale.dtype) == "uint16":  # BF16 bits on the device: widened exactly
        s = cast(scale, "F32")
    else:  # F32 or F16
        s = cp.ascontiguousarray(scale.astype("float32"))
    z = None if zero is None else cp.ascontiguousarray(zero)
    return kernels.dequant_int_group_bf16(cp.ascontiguousarray(packed), s, z, bits)


def swizzle_blockscale(scale: Any, *, what: str = "block-scale swizzle") -> Any:
    """As :func:`runtime.binder.quant_numerics.swizzle_blockscale`, by the generated kernel."""
    if scale.ndim < 2:
        raise BindError(f"{what}: the scale is {scale.ndim}-D, expected [..., M, K]")
    return kernels.swizzle_blockscale_b1(_bytes(scale, what, "the scale"))


def dequant_mxfp4(blocks: Any, scales: Any, *, what: str = "MXFP4 dequant") -> Any:
    """As :func:`runtime.binder.quant_numerics.dequant_mxfp4`, with CuPy array ops and the narrow
    kernel: each product of an E2M1 value and a power of two is exact in F32, so the one
    rounding is the kernel's nearest-even narrow (overflow to ±inf, E8M0 255 gives NaN)."""
    cp = _cp()
    blocks, scales = _bytes(blocks, what, "the blocks"), _bytes(scales, what, "the scales")
    if blocks.ndim < 2 or blocks.shape[-1] != 16 or tuple(blocks.shape[:-1]) != scales.shape:
        raise BindError(
            f"{what}: blocks {list(blocks.shape)} and scales {list(scales.shape)} are not "
            "[..., O, I/32, 16] and [..., O, I/32]"
        )
    power = cp.ldexp(cp.ones(scales.shape, cp.float32), scales.astype(cp.int32) - 127)
    power[scales == 255] = cp.float32("nan")  # 2^(s-127); E8M0 255: NaN
    vals = cp.take(cp.asarray(qn.PAIRS[True]), blocks, axis=0)  # [.., G, 16] -> [.., 16, 2] F32
    prod = vals.reshape(*scales.shape, 32) * power[..., None]  # [..., O, G, 32], exact
    out = kernels.narrow_f32_bf16(cp.ascontiguousarray(prod))
    return out.reshape(*scales.shape[:-1], scales.shape[-1] * 32)  # [..., O, G, 32] -> [..., O, I]
