"""The NumPy ops that generated transforms call: view, slice, widen, scale, contract, cast,
and the quantized-checkpoint numerics (NVFP4 / FP8-block dequant, the block-scale swizzle),
which live in ``runtime.binder.quant_numerics`` (here they only get ``threads()`` workers).

Invariants:
- ``widen`` turns BF16/F16 into F32 exactly (every BF16 value is an F32 value);
- ``contract`` computes in F32 with one BLAS matmul per batch element (per head), so a head's
  result does not depend on how many heads a rank holds, on ``SPECBIND_THREADS`` or on the
  BLAS thread count: each output element is one fixed-length dot product of the same operands;
- ``cast`` to BF16 rounds to nearest even once (ml_dtypes), and returns a C-contiguous array;
- a view whose element count does not match is a ``BindError`` naming the field, never a
  reshape that silently reinterprets.
- ``contract`` spreads a batch over ``threads()`` Python threads (``SPECBIND_THREADS``, default
  the usable cores) and runs every BLAS call single-threaded (``single_threaded_blas``), only
  while it works: the caller's BLAS setting is back when it returns.
``into``: the ops that make a field (permute, scale, cast, concat, stack, contract) write
their result into the caller's memory when handed an ``Arena`` (``runtime.binder.backends``), else
into a new array; the bytes are the same either way.
``stats`` counts the multiply-adds and operand elements a contraction used, so tests can show
that a rank multiplies only its own heads.
"""

from __future__ import annotations

import _thread
import math
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np

from specbind.core.dtypes import DTYPES
from specbind.core.einsum import Lowering, lower
from specbind.core.errors import BindError, GeometryError
from specbind.core.record import field, record
from specbind.runtime.binder import quant_numerics
from specbind.runtime.binder.checks import Array
from specbind.runtime.binder.quant_numerics import swizzle_blockscale as swizzle_blockscale
from specbind.runtime.binder.tp import MADV_POPULATE_READ, empty_in, stacked_run

F32 = np.dtype(np.float32)


@record(frozen=False)
class OpStats:
    flops: int = 0  # 2 x multiply-adds
    operand_elements: int = 0
    # each contraction's matmul as (batch, left, contract, right), for a like-for-like baseline
    products: list[tuple[int, int, int, int]] = field(default_factory=list)


_stats: OpStats | None = None
_lock = _thread.allocate_lock()  # threading.Lock itself, without importing threading
_blas_lock = _thread.allocate_lock()


@contextmanager
def counting() -> Iterator[OpStats]:
    """Count what contractions multiply while the block runs (for tests and benchmarks)."""
    global _stats
    prev, _stats = _stats, OpStats()
    try:
        yield _stats
    finally:
        _stats = prev


def threads() -> int:
    """``SPECBIND_THREADS``, or the cores this process may run on (its affinity mask, not the
    machine's count: a rank pinned to 4 cores of 64 gets 4)."""
    raw = os.environ.get("SPECBIND_THREADS", "").strip()
    if not raw:
        return usable_cores()
    try:
        n = int(raw)
    except ValueError:
        raise GeometryError(f"SPECBIND_THREADS={raw!r} is not an integer") from None
    if n < 1:
        raise GeometryError(f"SPECBIND_THREADS={n} must be >= 1")
    return n


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity masks (macOS)
        return max(1, os.cpu_count() or 1)


_blas_depth = 0
_blas_ctx: Any = None  # the threadpoolctl limit in force while _blas_depth > 0
_blas_controller: Any = None
_blas_modules = -1  # len(sys.modules) when _blas_controller scanned the loaded libraries


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Every BLAS call inside runs on one thread; specbind spreads work over its own threads.

    Measured (issue #15): two-thread OpenBLAS runs at about half of one thread when the host is
    shared, as it is when several ranks bind on one machine. The limit is threadpoolctl's (it
    finds OpenBLAS, MKL or BLIS whichever NumPy loaded; by hand we would chase each library's
    symbol names) and is restored on exit, so a caller's NumPy outside specbind's work keeps
    its own setting.
    Trap: a BLAS thread count is process-wide, not per thread. Nested or concurrent entries
    share one limit: the first in applies it, the last out restores it (a depth count under a
    lock), so two binds in two threads cannot leave the caller at one thread.
    Trap: the OpenBLAS NumPy wheels ship ignores a thread count set from a non-main thread
    once the main thread has set one (measured, OpenBLAS 0.3.31): a bind started from a worker
    thread of a caller who limited BLAS in its main thread may run BLAS on that caller's count.
    Bytes do not change either way (each output element is one fixed dot product).
    Trap: threadpoolctl is imported, and the loaded libraries scanned, on first use (~30 ms),
    never at CLI start.
    Trap: a BLAS loaded after the scan is not limited by it (SciPy brings an OpenBLAS of its
    own beside NumPy's), so the scan is made again whenever modules were imported since: an
    import is how a library gets loaded, and comparing a count costs nothing.
    """
    global _blas_depth, _blas_ctx, _blas_controller, _blas_modules
    with _blas_lock:
        if _blas_depth == 0:
            if _blas_controller is None or _blas_modules != len(sys.modules):
                from threadpoolctl import ThreadpoolController

                _blas_controller = ThreadpoolController()
                _blas_modules = len(sys.modules)
            _blas_ctx = _blas_controller.limit(limits=1, user_api="blas")
        _blas_depth += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_depth -= 1
            if _blas_depth == 0:
                _blas_ctx.restore_original_limits()
                _blas_ctx = None


def view(a: Array, shape: tuple[int, ...], what: str) -> Array:
    if int(np.prod(shape)) != a.size:
        raise BindError(f"{what}: cannot view {list(a.shape)} ({a.size} elements) as {list(shape)}")
    return a.reshape(shape)


def take(a: Array, axis: int, start: int, stop: int, what: str) -> Array:
    if not 0 <= start < stop <= a.shape[axis]:
        raise BindError(
            f"{what}: slice [{start}:{stop}] does not fit axis {axis} of {list(a.shape)}"
        )
    index = [slice(None)] * a.ndim
    index[axis] = slice(start, stop)
    return a[tuple(index)]


def permute(a: Array, axes: tuple[int, ...], what: str, into: Any = None) -> Array:
    """The axes reordered (``axes[i]`` is the source axis of result axis i), in C order: a
    copy, so the result's bytes are the row-major layout a kernel reads."""
    if sorted(axes) != list(range(a.ndim)):
        raise BindError(f"{what}: cannot permute {list(a.shape)} by {list(axes)}")
    if into is None:
        return np.ascontiguousarray(a.transpose(axes))
    moved = a.transpose(axes)
    out = empty_in(moved.shape, a.dtype, into)
    np.copyto(out, moved)
    return out


def pairs_to_halves(a: Array, groups: int, what: str) -> Array:
    """Each of ``groups`` equal row groups (a head's rows), stored as rotary pairs (x0, x1),
    (x2, x3), ..., reordered into halves [x0, x2, ...; x1, x3, ...]: the group's rows viewed
    [R/2, 2] and transposed, as vLLM's ``Llama4ForCausalLM.permute_qk_weight_for_rotary``
    (vllm/model_executor/models/llama4.py) reorders q and k at load. A copy in C order."""
    rows = a.shape[0] if a.ndim else 0
    if groups < 1 or rows % groups or (rows // groups) % 2:
        raise BindError(
            f"{what}: {rows} rows are not {groups} groups of an even number of rows "
            "(rotary pairs to halves)"
        )
    per = rows // groups
    moved = a.reshape(groups, per // 2, 2, *a.shape[1:]).swapaxes(1, 2)
    return np.ascontiguousarray(moved).reshape(a.shape)


def widen(a: Array) -> Array:
    """An F32 copy (exact from BF16/F16), or the array itself if it is already F32."""
    if a.dtype == F32:
        return a
    if a.dtype.itemsize > 4:
        raise BindError(f"refusing to narrow {a.dtype} to F32 for computation")
    return a.astype(F32)


def scale(a: Array, factor: float, dtype: str, into: Any = None) -> Array:
    """``a`` widened to F32, times ``factor`` in F32, then cast to ``dtype`` (rounded once)."""
    return cast(np.multiply(widen(a), np.float32(factor), dtype=F32), dtype, into)


def concat_squeeze(
    parts: Sequence[Array], axis: int, squeeze: int | None, into: Any = None
) -> Array:
    """Concatenate along ``axis`` (order as given), then drop the singleton dim ``squeeze``.
    Into an arena that keeps file views (``Arena.file_views``), parts the file stores one after
    the other in this order, by rows, are that run of the file's map: no byte copied."""
    if into is None:
        joined = np.concatenate(parts, axis=axis)
    else:
        shape = list(parts[0].shape)
        shape[axis] = sum(p.shape[axis] for p in parts)
        run = _file_run(parts) if axis == 0 and getattr(into, "file_views", False) else None
        run = None if run is None else into.mapped(run)  # stored in order: the file's own bytes
        joined = run if run is not None else empty_in(tuple(shape), np.result_type(*parts), into)
        if run is None and (axis != 0 or not _read_rows(joined, parts)):  # rows: from the file
            for p in parts:
                populate(p)
            np.concatenate(parts, axis=axis, out=joined)
    if squeeze is None:
        return joined
    if joined.shape[squeeze] != 1:
        raise BindError(f"cannot squeeze dim {squeeze} of shape {list(joined.shape)}: it is not 1")
    return joined.squeeze(axis=squeeze)  # [.., 1, ..] -> [.., ..]: same row-major bytes


def _file_run(parts: Sequence[Array]) -> Any:
    from specbind.runtime.io.safetensors_file import run_of

    return run_of(parts)


def stack(
    groups: Sequence[Sequence[Array]], axis: int, squeeze: int | None, into: Any = None
) -> Array:
    """One slice per family member on a new axis 0; member i is the concat of ``groups[j][i]``
    over the sources j along ``axis`` (then ``squeeze``), written straight into the result:
    each member's bytes are copied once, with no per-member temporary."""
    n = len(groups[0])
    if n == 0 or any(len(g) != n for g in groups):
        raise BindError(f"cannot stack {[len(g) for g in groups]} members")
    first = [g[0] for g in groups]
    joined = list(first[0].shape)
    joined[axis] = sum(p.shape[axis] for p in first)
    member = list(joined)
    if squeeze is not None:
        if joined[squeeze] != 1:
            raise BindError(f"cannot squeeze dim {squeeze} of shape {joined}: it is not 1")
        del member[squeeze]
    if len(groups) == 1 and squeeze is None:
        run = stacked_run(groups[0])  # the members were gathered into one buffer, in order
        if run is not None and (into is None or into.holds(run)):
            return run
    out = empty_in((n, *member), first[0].dtype, into)  # [n, *member shape]
    for i in range(n):
        dest = out[i] if squeeze is None else np.expand_dims(out[i], squeeze)  # a view
        parts = [g[i] for g in groups]
        if axis == 0 and _read_rows(dest, parts):
            continue
        for p in parts:
            populate(p)
        np.concatenate(parts, axis=axis, out=dest)
    return out


def copy_in(dest: Array, src: Array) -> None:
    """``src`` copied into ``dest`` (same shape and dtype): a contiguous view of a mapped
    checkpoint file read from the file (``read_view``: its pages never mapped in), anything
    else copied, a view of the map populated first (``populate``)."""
    from specbind.runtime.io.safetensors_file import read_view

    if not read_view(dest, src):
        populate(src)
        np.copyto(dest, src)


def _read_rows(dest: Array, parts: Sequence[Array]) -> bool:
    """``parts`` concatenated along axis 0 into ``dest``, each by ``copy_in`` into its rows;
    False, before writing, where the parts do not tile ``dest`` by rows."""
    if (
        not dest.flags.c_contiguous
        or any(p.dtype != dest.dtype or p.shape[1:] != dest.shape[1:] for p in parts)
        or sum(p.shape[0] for p in parts) != dest.shape[0]
    ):
        return False  # np.concatenate copies, or says what does not fit
    at = 0
    for p in parts:
        copy_in(dest[at : at + p.shape[0]], p)  # this part's rows of dest: contiguous
        at += p.shape[0]
    return True


_POPULATE_MIN = 1 << 20  # bytes: below this the one call costs more than the faults it saves
_madvise: Any = None  # libc's madvise, looked up on first use (ctypes costs ~5 ms to import)


def populate(a: Array) -> None:
    """Map every page of a read-only, contiguous array (a view of the memory-mapped checkpoint)
    in one ``madvise(MADV_POPULATE_READ)`` call before it is copied, instead of one page fault
    per 64 KiB (fault-around) during the copy: in one profile of a tp 8 MoE bind the stacks
    took 0.56 s where they took 0.87 s. Only a hint: an array that owns writable memory is
    skipped, and a kernel without the advice (before 5.14) or any other refusal leaves the
    copy to fault as before.
    ``mmap.madvise`` cannot be used here: the array does not say which map it views."""
    if a.flags.writeable or not a.flags.c_contiguous or a.nbytes < _POPULATE_MIN:
        return
    advise(a.ctypes.data, a.nbytes, MADV_POPULATE_READ)


def advise(address: int, length: int, advice: int) -> bool:
    """``madvise`` over the pages holding ``[address, address + length)``; False (and never
    asked again) where libc has no madvise or the kernel refuses the advice (before 5.14 for
    the populate ones). Through ctypes, which releases the GIL for the call, so a thread that
    populates pages runs beside one that copies."""
    global _madvise
    if _madvise is None:
        import ctypes

        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
        except (OSError, AttributeError):  # no libc madvise: never try again
            _madvise = False
            return False
        fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        fn.restype = ctypes.c_int
        _madvise = fn
    if _madvise is False:
        return False
    page = 4096
    start = address // page * page
    if _madvise(start, address + length - start, advice) != 0:
        _madvise = False  # refused (EINVAL on an old kernel): stop asking
        return False
    return True


class Ops(Protocol):
    """What generated transforms call; ``runtime.binder.ops`` (NumPy) and
    ``runtime.binder.ops_cupy`` agree.

    Results are typed as NumPy arrays; on the CuPy backend they are CuPy arrays of the same
    shape, and the ``Weights`` fields hold those.
    """

    def view(self, a: Any, shape: tuple[int, ...], what: str) -> Array: ...
    def take(self, a: Any, axis: int, start: int, stop: int, what: str) -> Array: ...
    def permute(self, a: Any, axes: tuple[int, ...], what: str, into: Any = None) -> Array: ...
    def pairs_to_halves(self, a: Any, groups: int, what: str) -> Array: ...
    def widen(self, a: Any) -> Array: ...
    def scale(self, a: Any, factor: float, dtype: str, into: Any = None) -> Array: ...
    def cast(self, a: Any, dtype: str, into: Any = None) -> Array: ...
    def concat_squeeze(
        self, parts: Sequence[Any], axis: int, squeeze: int | None, into: Any = None
    ) -> Array: ...
    def stack(
        self, groups: Sequence[Sequence[Any]], axis: int, squeeze: int | None, into: Any = None
    ) -> Array: ...
    def contract(
        self,
        a: Any,
        b: Any,
        *,
        einsum: str,
        dtype: str,
        factor: float | None = None,
        into: Any = None,
    ) -> Array: ...
    # Quantized checkpoints (formulas and traps in runtime/binder/quant_numerics.py), BF16 results.
    # NVFP4: ``divide`` picks compressed-tensors' scale / global (else ModelOpt's scale *
    # global); ``negative_zero`` (code 8 is -0.0) follows ``divide`` unless given, as each
    # library's own table does; ``global_scale`` is a scalar, one per stacked matrix, or
    # ``[..., S]``: one per row segment (``[E, 2]`` for a stacked ``[gate; up]``).
    def dequant_nvfp4(
        self,
        packed: Any,
        scale: Any,
        global_scale: Any,
        *,
        divide: bool,
        group: int = 16,
        negative_zero: bool | None = None,
    ) -> Array: ...
    def dequant_fp8_block(
        self, weight: Any, scale_inv: Any, *, block: tuple[int, int] = (128, 128)
    ) -> Array: ...
    def dequant_scaled(self, weight: Any, scale: Any) -> Array: ...
    def dequant_int_group(self, packed: Any, scale: Any, zero: Any, *, bits: int) -> Array: ...
    def swizzle_blockscale(self, scale: Any) -> Array: ...


def cast(a: Array, dtype: str, into: Any = None) -> Array:
    """To ``dtype`` in C order; BF16 rounds to nearest even (ml_dtypes), NaN stays NaN."""
    np_dtype = DTYPES[dtype].numpy
    assert np_dtype is not None
    if into is None:
        return a.astype(np_dtype, order="C")
    out = empty_in(a.shape, np_dtype, into)
    np.copyto(out, a, casting="unsafe")  # the same conversion loop as astype
    return out


Dims = tuple[int, ...]


def matmul_dims(
    low: Lowering, a_shape: Dims, b_shape: Dims
) -> tuple[tuple[Dims, Dims, Dims, Dims], tuple[int, int, int, int]]:
    """Split permuted operand shapes into (batch, left, contract, right) dims and their sizes."""
    nb, nl, nc = len(low.batch), len(low.left), len(low.contract)
    bs, ls, cs = a_shape[:nb], a_shape[nb : nb + nl], a_shape[nb + nl :]
    rs = b_shape[nb + nc :]
    sizes = (math.prod(bs), math.prod(ls), math.prod(cs), math.prod(rs))
    return (bs, ls, cs, rs), sizes


def contract(
    a: Array,
    b: Array,
    *,
    einsum: str,
    dtype: str,
    factor: float | None = None,
    into: Any = None,
) -> Array:
    """``einsum`` lowered to ``matmul`` of [B, L, C] by [B, C, R], then scale and cast.

    ``einsum`` is the spec's own text (``"hrc,hrk->hck"``); :func:`core.einsum.lower` gives the
    permutations and each letter's role, as it did when the generator checked the spec, and
    the operands' ranks must match its letters.
    The batch is processed in chunks: each chunk's operands are widened to F32, multiplied,
    scaled, rounded to ``dtype`` and written straight into the C-ordered result in the output
    letter order, so no full-size F32 copy of an operand or of the product exists and the
    transpose costs no extra pass (measured on the full-geometry ``o_absorb`` at TP=1: 1.36 s
    against 1.70 s for matmul then transpose-cast; widening per chunk took the peak RSS of a
    full-geometry DSA bind at TP=1 from 974 MB down, see BENCHMARKS.md).
    """
    low = lower(einsum, (a.ndim, b.ndim))  # "hrc,hrk->hck": batch h, left c, sum r, right k
    perm_out = low.perm_out
    at, bt = a.transpose(low.perm_a), b.transpose(low.perm_b)
    (bs, ls, _, rs), (nbatch, nleft, ncon, nright) = matmul_dims(low, at.shape, bt.shape)
    a3 = at.reshape(nbatch, nleft, ncon)  # [batch.., left.., contract..] -> [B, L, C]
    b3 = bt.reshape(nbatch, ncon, nright)  # [batch.., contract.., right..] -> [B, C, R]
    mid_shape = (*bs, *ls, *rs)
    out_shape = tuple(mid_shape[i] for i in perm_out)
    np_dtype = DTYPES[dtype].numpy
    assert np_dtype is not None
    result = empty_in(out_shape, np_dtype, into)
    inverse = tuple(int(i) for i in np.argsort(perm_out))
    # [out letters] -> [B, L, R]: a view of `result` when each group has at most one letter
    mid = result.transpose(inverse).reshape(nbatch, nleft, nright)
    direct = np.shares_memory(mid, result)
    if not direct:  # several letters per group: fill a [B, L, R] buffer, then permute once
        mid = np.empty((nbatch, nleft, nright), dtype=np_dtype)
    budget = max(1, (32 << 20) // max(1, 4 * nleft * nright))  # ~32 MiB of F32 per chunk
    per_chunk = max(1, min(budget, -(-nbatch // threads())))  # and work for every thread
    spans = [(i, min(i + per_chunk, nbatch)) for i in range(0, nbatch, per_chunk)]

    def work(span: tuple[int, int]) -> None:
        lo, hi = span
        tmp = np.matmul(widen(a3[lo:hi]), widen(b3[lo:hi]))  # [b, L, C] @ [b, C, R] -> [b, L, R]
        if factor is not None:
            tmp *= np.float32(factor)
        mid[lo:hi] = tmp  # one rounding to `dtype` (nearest even for BF16)

    n = min(threads(), len(spans))
    with single_threaded_blas():
        if n <= 1:
            for span in spans:
                work(span)
        else:
            from concurrent.futures import ThreadPoolExecutor  # 6 ms: not at CLI start

            with ThreadPoolExecutor(n) as pool:  # matmul and the cast release the GIL
                list(pool.map(work, spans))
    if not direct:
        result[...] = mid.reshape(mid_shape).transpose(perm_out)  # [B, L, R] -> output order
    if _stats is not None:
        with _lock:
            _stats.flops += 2 * nbatch * nleft * ncon * nright
            _stats.operand_elements += a3.size + b3.size
            _stats.products.append((nbatch, nleft, ncon, nright))
    return result


def dequant_nvfp4(
    packed: Array,
    scale: Array,
    global_scale: Any,
    *,
    divide: bool,
    group: int = 16,
    negative_zero: bool | None = None,
) -> Array:
    """:func:`runtime.binder.quant_numerics.dequant_nvfp4` on ``threads()`` workers (same bytes)."""
    return quant_numerics.dequant_nvfp4(
        packed, scale, global_scale, divide=divide, group=group,
        negative_zero=negative_zero, workers=threads(),
    )  # fmt: skip


def dequant_mxfp4(blocks: Array, scales: Array) -> Array:
    """:func:`runtime.binder.quant_numerics.dequant_mxfp4` (BF16 ``[..., O, I]``)."""
    return quant_numerics.dequant_mxfp4(blocks, scales)


def dequant_int_group(packed: Array, scale: Array, zero: Array | None, *, bits: int) -> Array:
    """:func:`runtime.binder.quant_numerics.dequant_int_group` on ``threads()`` workers (same
    bytes)."""
    return quant_numerics.dequant_int_group(packed, scale, zero, bits=bits, workers=threads())


def dequant_scaled(weight: Array, scale: Array) -> Array:
    """:func:`runtime.binder.quant_numerics.dequant_scaled` on ``threads()`` workers (same
    bytes)."""
    return quant_numerics.dequant_scaled(weight, scale, workers=threads())


def dequant_fp8_block(
    weight: Array, scale_inv: Array, *, block: tuple[int, int] = (128, 128)
) -> Array:
    """:func:`runtime.binder.quant_numerics.dequant_fp8_block` on ``threads()`` workers (same
    bytes)."""
    return quant_numerics.dequant_fp8_block(weight, scale_inv, block=block, workers=threads())
