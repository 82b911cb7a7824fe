"""The numerics of quantized checkpoints, in NumPy: NVFP4 and FP8-block dequant, and the
CUTLASS block-scale swizzle. One definition each; the generated CUDA kernels are tested
against these bit for bit, and these against the libraries that wrote the checkpoints.

NVFP4 (``packed`` U8 ``[..., O, I/2]``, ``scale`` F8_E4M3 ``[..., O, I/group]``, an F32
global scale shared, or one per stacked matrix, or one per row segment of each matrix):
- byte ``b`` of a row holds column ``2b`` in its LOW nibble and ``2b + 1`` in its high nibble;
- a nibble is an E2M1 code: bit 3 the sign, bits 0-2 index 0, .5, 1, 1.5, 2, 3, 4, 6;
- ModelOpt (``NVFP4QTensor.dequantize``): ``bf16(E2M1[code] * (f32(scale) * global))``;
  compressed-tensors (``NVFP4PackedCompressor.decompress``):
  ``bf16(E2M1[code] * (f32(scale) / global))``. Both compute in F32 and round once to BF16
  (nearest even); the group scale is formed first, so the product has two roundings in that
  order, never ``(E2M1 * scale) * global``.
- Trap: code 8 (negative zero) is +0.0 in ModelOpt's table and -0.0 in compressed-tensors'
  (it multiplies a magnitude by -1), so a zero weight's sign bit differs between the two
  libraries. ``negative_zero`` picks the table; by default it follows ``divide`` (the
  compressed-tensors convention divides).

FP8 block (``weight`` F8_E4M3 ``[..., O, I]``, ``scale_inv`` F32 or BF16
``[..., ceil(O/bo), ceil(I/bi)]``): ``bf16(f32(weight[r, c]) * f32(scale_inv[r//bo, c//bi]))``,
which is compressed-tensors' block dequant: with an F32 scale (DeepSeek's ``weight_scale_inv``)
it returns F32, here rounded once to BF16; with a BF16 scale (what llmcompressor writes, named
``weight_scale``) it returns BF16, and the F32 product is exact, so one rounding either way.

MXFP4 (OCP Microscaling v1.0; gpt-oss's hub layout: ``blocks`` U8 ``[..., O, I/32, 16]``,
``scales`` U8 ``[..., O, I/32]``): each block of 32 elements shares one E8M0 scale byte ``s``,
the power of two ``2^(s - 127)`` (``s = 255`` is NaN); each of the block's 16 bytes holds two
E2M1 codes, the LOW nibble first (as NVFP4). Value ``bf16(E2M1[code] * 2^(s - 127))``, formed
in F32 (``2^-127`` is an F32 subnormal, every product of a code and a power of two down to
``2^-128`` is exact, and so is its BF16 rounding; ``4 · 2^127`` and up is ±inf). This is
transformers' ``convert_moe_packed_tensors`` (its lookup table has -0.0 at code 8, and
``ldexp`` in F32), bit for bit for scales 0..254; at 255 it gives ±inf or NaN, the OCP spec
NaN, which is what this gives.

Scaled (FP8 per channel or per tensor, int8 per channel: ``weight`` F8_E4M3 or I8
``[..., O, I]``, ``scale`` F32, BF16 or F16, ``[..., O, 1]`` or one value per matrix):
``bf16(f32(weight[r, c]) * f32(scale[r]))``. compressed-tensors' ``dequantize`` casts the codes
to the scale's dtype and multiplies there, then casts to the model dtype: with a BF16 scale the
product of an 8-bit code and a BF16 value is exact in F32, so one rounding either way; with an
F32 scale both round to F32 then to BF16. With an F16 scale it rounds to F16 first; here the
exact product is rounded once to BF16 (the F16 route is not reproduced).

Integer groups (compressed-tensors ``pack-quantized``: ``packed`` I32 ``[..., O, I/pf]``, pf =
32 / bits codes per word, code ``k`` of a word in bits ``k·bits`` up (the low nibble first
on a little-endian host, so the words' bytes are NVFP4's byte order); ``scale`` ``[..., O,
I/g]`` (g-column groups; ``[..., O, 1]``: one per row); ``zero`` I32 ``[..., ceil(O/pf),
I/g]`` packed the same way along O (the last word's spare codes unused), or None: symmetric,
the zero is ``2^(bits-1)``):
``bf16(f32(code - zero[r, c // g]) * f32(scale[r, c // g]))``. compressed-tensors'
``dequantize`` casts codes and zero to the scale's dtype and multiplies there; the difference
of two codes is exact and so is its product with a BF16 scale in F32, so one rounding either
way (checked on every linear llm-compressor writes, tests/quant/test_quant_real.py).

Swizzle: vLLM's ``swizzle_blockscale``: rows zero-padded to a multiple of 128, columns to a
multiple of 4, then ``[B, M/128, 4, 32, K/4, 4]`` permuted ``(0, 1, 4, 3, 2, 5)``; the result
keeps the padded shape ``[..., M_pad, K_pad]``.

Every function checks dtypes and shapes first and raises ``BindError`` naming ``what``; the
dequants work in row chunks (blocks), so no F32 copy of a whole stacked tensor exists.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import ml_dtypes
import numpy as np

from specbind.core.errors import BindError

Array = np.ndarray[Any, Any]
F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
U8 = np.dtype(np.uint8)
T = TypeVar("T")

# E2M1 code -> value; codes 8..15 are the negatives of 0..7.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MODELOPT = np.array([*E2M1_MAGNITUDES, *(-m if m else 0.0 for m in E2M1_MAGNITUDES)], F32)
E2M1_SIGNED_ZERO = np.array([*E2M1_MAGNITUDES, *(-m for m in E2M1_MAGNITUDES)], F32)

CHUNK_ELEMENTS = 1 << 22  # ~16 MiB of F32 per chunk


def e2m1_table(negative_zero: bool) -> Array:
    """The 16 E2M1 values; code 8 is -0.0 if ``negative_zero``, else +0.0."""
    return E2M1_SIGNED_ZERO if negative_zero else E2M1_MODELOPT


def byte_pairs(negative_zero: bool) -> Array:
    """F32 ``[256, 2]``: packed byte b -> (value of its LOW nibble, value of its high nibble),
    i.e. the columns 2j and 2j + 1 that byte j holds. One lookup of a row's bytes lays out the
    row's values in order: half the lookups of unpacking nibbles first, and no code array."""
    b = np.arange(256)
    t = e2m1_table(negative_zero)
    return np.stack([t[b & 0x0F], t[b >> 4]], axis=-1)  # [256, 2]


PAIRS = {False: byte_pairs(False), True: byte_pairs(True)}
# E4M3 byte -> F32: ml_dtypes' own conversion of all 256 bytes (exact; NaN keeps its sign),
# looked up per element rather than re-run per element through ``astype`` (same bits, less work).
E4M3_TO_F32 = np.arange(256, dtype=U8).view(E4M3).astype(F32)


def e4m3_to_f32(a: Array) -> Array:
    """F8_E4M3 -> F32, exactly (a 256-entry lookup of ml_dtypes' conversion)."""
    return np.take(E4M3_TO_F32, a.view(U8))


def as_e4m3(a: Array, what: str, name: str) -> Array:
    """``a`` itself if it is F8_E4M3; any other dtype (U8 bits included) is refused."""
    if a.dtype != E4M3:
        raise BindError(f"{what}: {name} is {a.dtype}, expected F8_E4M3")
    return a


def _row_spans(rows: int, row_elements: int) -> list[tuple[int, int]]:
    step = max(1, CHUNK_ELEMENTS // max(1, row_elements))
    return [(i, min(i + step, rows)) for i in range(0, rows, step)]


def _each(spans: Sequence[T], work: Callable[[T], None], workers: int) -> None:
    """``work`` on every span, on up to ``workers`` threads (NumPy's lookups, products and
    casts release the GIL). Each span writes its own rows of the result, so the bytes do not
    depend on ``workers``."""
    n = min(max(1, workers), len(spans))
    if n <= 1:
        for span in spans:
            work(span)
        return
    from concurrent.futures import ThreadPoolExecutor  # with logging, ~50 ms: not at start

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(work, spans))


def global_segments(
    shape: tuple[int, ...], lead: tuple[int, ...], rows: int, what: str
) -> tuple[int, ...]:
    """The global scale's shape as ``lead + (S,)``: a scalar is shared by every matrix
    (``S = 1``), ``lead`` gives one per matrix, ``lead + (S,)`` one per row segment of
    ``rows / S`` rows (a stacked ``[gate; up]`` carries ``[E, 2]``); anything else is refused."""
    if shape in ((), lead):
        return (*lead, 1)
    segmented = len(shape) == len(lead) + 1 and shape[:-1] == lead
    if segmented and shape[-1] >= 1 and rows % shape[-1] == 0:
        return shape
    raise BindError(
        f"{what}: the global scale has shape {list(shape)}, expected a scalar, {list(lead)} or "
        f"{[*lead, 'S']} with S dividing the {rows} rows"
    )


def row_scales(global_scale: Any, lead: tuple[int, ...], rows: int, what: str) -> Array:
    """The global scale of every row, F32 ``[prod(lead) * rows]``."""
    g = np.asarray(global_scale)
    if g.dtype != F32:
        raise BindError(f"{what}: the global scale is {g.dtype}, expected F32")
    shape = global_segments(g.shape, lead, rows, what)
    per = np.broadcast_to(g, shape) if g.shape == () else g.reshape(shape)  # [.., S]
    return np.repeat(per.reshape(-1), rows // shape[-1])  # [.., S] -> [prod(lead) * rows]


def nvfp4_geometry(
    packed: tuple[int, ...], scale: tuple[int, ...], group: int, what: str
) -> tuple[tuple[int, ...], int, int]:
    """(lead dims, O, I) of a packed ``[..., O, I/2]`` weight whose group scale is
    ``[..., O, I/group]``; refuses anything else, naming ``what``."""
    if len(packed) < 2 or group < 1:
        raise BindError(f"{what}: packed weight {list(packed)}, group {group}")
    *lead_l, rows, half = packed
    lead, cols = tuple(lead_l), 2 * half
    if cols % group:
        raise BindError(f"{what}: {cols} columns are not a multiple of the group size {group}")
    if scale != (*lead, rows, cols // group):
        raise BindError(
            f"{what}: the group scale is {list(scale)}, expected "
            f"{[*lead, rows, cols // group]} for packed {list(packed)} (group {group})"
        )
    return lead, rows, cols


def fp8_block_geometry(
    weight: tuple[int, ...], scale: tuple[int, ...], block: tuple[int, int], what: str
) -> tuple[tuple[int, ...], int, int]:
    """(lead dims, O, I) of an FP8 ``[..., O, I]`` weight whose block scale is
    ``[..., ceil(O/bo), ceil(I/bi)]``; refuses anything else, naming ``what``."""
    bo, bi = block
    if len(weight) < 2 or bo < 1 or bi < 1:
        raise BindError(f"{what}: weight {list(weight)}, block {list(block)}")
    *lead_l, rows, cols = weight
    want = (*lead_l, -(-rows // bo), -(-cols // bi))
    if scale != want:
        raise BindError(
            f"{what}: the block scale is {list(scale)}, expected {list(want)} "
            f"for weight {list(weight)} in {bo}x{bi} blocks"
        )
    return tuple(lead_l), rows, cols


def padded_shape(rows: int, cols: int) -> tuple[int, int]:
    """The swizzled scale's shape: rows up to a multiple of 128, columns of 4."""
    return -(-rows // 128) * 128, -(-cols // 4) * 4


def dequant_nvfp4(
    packed: Array,
    scale: Array,
    global_scale: Any,
    *,
    divide: bool,
    group: int = 16,
    negative_zero: bool | None = None,
    what: str = "NVFP4 dequant",
    workers: int = 1,
) -> Array:
    """BF16 ``[..., O, I]`` from NVFP4 parts (see the module docstring for the formula)."""
    if packed.dtype != U8:
        raise BindError(f"{what}: the packed weight is {packed.dtype}, expected U8")
    scale = as_e4m3(scale, what, "the group scale")
    lead, rows, cols = nvfp4_geometry(packed.shape, scale.shape, group, what)
    half = cols // 2
    gs = row_scales(global_scale, lead, rows, what)  # [prod(lead)·O], one per row
    pairs = PAIRS[divide if negative_zero is None else negative_zero]
    nrows = math.prod(lead) * rows
    p2 = packed.reshape(nrows, half)  # [..., O, I/2] -> [R, I/2]
    s2 = scale.reshape(nrows, cols // group)  # [..., O, I/g] -> [R, I/g]
    out = np.empty((nrows, cols), dtype=BF16)  # [R, I]

    def work(span: tuple[int, int]) -> None:
        lo, hi = span
        with np.errstate(all="ignore"):  # NaN/Inf scales propagate as the libraries' do
            s = e4m3_to_f32(s2[lo:hi])  # exact: every E4M3 value is an F32 value
            g = gs[lo:hi, None]
            eff = s / g if divide else s * g  # [r, I/g], one F32 rounding
            vals = np.take(pairs, p2[lo:hi], axis=0)  # [r, I/2] bytes -> [r, I/2, 2] F32
            prod = vals.reshape(hi - lo, cols // group, group) * eff[..., None]  # [r, I/g, g]
            out[lo:hi] = prod.reshape(hi - lo, cols)  # [r, I/g, g] -> [r, I]; BF16, RNE

    _each(_row_spans(nrows, cols), work, workers)
    return out.reshape(*lead, rows, cols)  # [R, I] -> [..., O, I]


def dequant_mxfp4(blocks: Array, scales: Array, *, what: str = "MXFP4 dequant") -> Array:
    """BF16 ``[..., O, I]`` from MXFP4 ``blocks [..., O, I/32, 16]`` and E8M0 ``scales
    [..., O, I/32]`` (the module docstring has the formula and its reference)."""
    if blocks.dtype != U8 or scales.dtype != U8:
        raise BindError(f"{what}: blocks and scales are {blocks.dtype}, {scales.dtype}, not U8")
    if blocks.ndim < 2 or blocks.shape[-1] != 16 or tuple(blocks.shape[:-1]) != scales.shape:
        raise BindError(
            f"{what}: blocks {list(blocks.shape)} and scales {list(scales.shape)} are not "
            "[..., O, I/32, 16] and [..., O, I/32]"
        )
    with np.errstate(all="ignore"):
        power = np.ldexp(np.float32(1), scales.astype(np.int32) - 127).astype(F32)  # 2^(s-127)
        power[scales == 255] = np.nan  # E8M0 255: NaN (OCP MX v1.0, 5.4.1)
        vals = np.take(PAIRS[True], blocks, axis=0)  # [..., O, G, 16] bytes -> [.., 16, 2] F32
        prod = vals.reshape(*scales.shape, 32) * power[..., None]  # [..., O, G, 32], exact
    out = prod.astype(BF16)  # exact but for overflow to ±inf
    return out.reshape(*scales.shape[:-1], scales.shape[-1] * 32)  # [..., O, G, 32] -> [..., O, I]


def dequant_fp8_block(
    weight: Array,
    scale_inv: Array,
    *,
    block: tuple[int, int] = (128, 128),
    what: str = "FP8 block dequant",
    workers: int = 1,
) -> Array:
    """BF16 ``[..., O, I]``: ``bf16(f32(weight) * f32(scale_inv[r // bo, c // bi]))``."""
    weight = as_e4m3(weight, what, "the weight")
    if scale_inv.dtype not in (F32, BF16):
        raise BindError(f"{what}: the block scale is {scale_inv.dtype}, expected F32 or BF16")
    lead, rows, cols = fp8_block_geometry(weight.shape, scale_inv.shape, block, what)
    bo, bi = block
    n = math.prod(lead)
    w3 = weight.reshape(n, rows, cols)  # [..., O, I] -> [B, O, I]
    s3 = scale_inv.reshape(n, *scale_inv.shape[-2:])  # [..., O/bo, I/bi] -> [B, O/bo, I/bi]
    out = np.empty((n, rows, cols), dtype=BF16)

    def work(span: tuple[int, int]) -> None:  # (matrix, first row of a row block)
        b, r0 = span
        r1 = min(r0 + bo, rows)
        with np.errstate(all="ignore"):
            s_row = np.repeat(s3[b, r0 // bo].astype(F32), bi)[:cols]  # [I/bi] -> [I]
            out[b, r0:r1] = e4m3_to_f32(w3[b, r0:r1]) * s_row  # one F32 rounding, then RNE

    _each([(b, r0) for b in range(n) for r0 in range(0, rows, bo)], work, workers)
    return out.reshape(*lead, rows, cols)  # [B, O, I] -> [..., O, I]


I8 = np.dtype(np.int8)
I32 = np.dtype("<i4")


def unpack_words(words: Array, bits: int) -> Array:
    """I32 ``[..., n]`` -> uint8 ``[..., n · 32/bits]``: code ``k`` of each word from bits
    ``k·bits`` up (little-endian bytes; a 4-bit code's byte holds code 2j low, 2j+1 high)."""
    b = np.ascontiguousarray(words, dtype=I32).view(U8)  # [..., n] -> [..., 4n] bytes
    if bits == 8:
        return b
    out = np.empty((*b.shape[:-1], b.shape[-1] * 2), dtype=U8)
    np.bitwise_and(b, 0xF, out=out[..., 0::2])
    np.right_shift(b, 4, out=out[..., 1::2])
    return out


def int_group_geometry(
    packed: tuple[int, ...], scale: tuple[int, ...], zero: tuple[int, ...] | None, bits: int,
    what: str,
) -> tuple[tuple[int, ...], int, int, int]:  # fmt: skip
    """(lead dims, O, I, group) of packed ``[..., O, I/pf]`` words with scale ``[..., O, I/g]``
    and zero ``[..., ceil(O/pf), I/g]``; refuses anything else, naming ``what``."""
    pf = 32 // bits if bits in (4, 8) else 0
    if not pf or len(packed) < 2 or len(scale) != len(packed):
        raise BindError(f"{what}: packed {list(packed)}, scale {list(scale)}, {bits}-bit codes")
    *lead_l, rows, words = packed
    cols = words * pf
    groups = scale[-1]
    if tuple(scale[:-1]) != (*lead_l, rows) or groups < 1 or cols % groups:
        raise BindError(
            f"{what}: the scale is {list(scale)}, expected [{', '.join(map(str, lead_l))}"
            f"{', ' if lead_l else ''}{rows}, {cols} / group] for {list(packed)} words"
        )
    if zero is not None and tuple(zero) != (*lead_l, -(-rows // pf), groups):
        raise BindError(f"{what}: the zero point is {list(zero)}, expected "
                        f"{[*lead_l, -(-rows // pf), groups]}")  # fmt: skip
    return tuple(lead_l), rows, cols, cols // groups


def dequant_int_group(
    packed: Array, scale: Array, zero: Array | None, *, bits: int, what: str = "int dequant",
    workers: int = 1,
) -> Array:  # fmt: skip
    """BF16 ``[..., O, I]``: ``bf16(f32(code - zero) * f32(scale))`` per ``g``-column group."""
    if packed.dtype != I32 or scale.dtype not in SCALE_DTYPES:
        raise BindError(f"{what}: packed {packed.dtype}, scale {scale.dtype}: expected int32 "
                        "words and an F32, BF16 or F16 scale")  # fmt: skip
    if zero is not None and zero.dtype != I32:
        raise BindError(f"{what}: the zero point is {zero.dtype}, expected int32 words")
    zs = None if zero is None else tuple(zero.shape)
    lead, rows, cols, g = int_group_geometry(packed.shape, scale.shape, zs, bits, what)
    n = math.prod(lead)
    ng = cols // g
    by = np.ascontiguousarray(packed, dtype=I32).view(U8).reshape(n, rows, -1)  # LE bytes
    sf = scale.astype(F32).reshape(n, rows, ng, 1)  # exact widening, [B, O, I/g, 1]
    mid = 1 << (bits - 1)
    zf: Array | None = None
    if zero is not None:  # [B, ceil(O/pf), I/g] words along O -> [B, O, I/g] codes
        zw = np.swapaxes(zero.reshape(n, -1, ng), 1, 2)  # [B, I/g, ceil(O/pf)]
        zc = np.swapaxes(unpack_words(zw, bits), 1, 2)[:, :rows]
        zf = (zc.astype(F32) - mid).reshape(n, rows, ng, 1)  # the table's codes are less mid
    out = np.empty((n, rows, cols), dtype=BF16)
    bits16 = out.view(np.uint16)
    fast = bool(np.isfinite(sf).all())  # finite scales: the products are never NaN
    table = CODE_PAIRS if bits == 4 else CODE_BYTES

    def work(span: tuple[int, int, int]) -> None:  # (matrix, first row, end row)
        b, r0, r1 = span
        v = np.take(table, by[b, r0:r1], axis=0).reshape(r1 - r0, ng, g)  # code - mid, F32
        if zf is not None:
            v -= zf[b, r0:r1]  # (code - mid) - (zero - mid): exact
        v *= sf[b, r0:r1]  # one F32 rounding
        if fast:
            bits16[b, r0:r1] = bf16_bits(v.reshape(r1 - r0, cols))
        else:  # a NaN or Inf scale: ml_dtypes' rounding keeps every NaN a NaN
            with np.errstate(all="ignore"):
                out[b, r0:r1] = v.reshape(r1 - r0, cols)

    spans = [(b, r0, min(r0 + INT_ROWS, rows)) for b in range(n) for r0 in range(0, rows, INT_ROWS)]
    _each(spans, work, workers)
    return out.reshape(*lead, rows, cols)


# Each byte's codes less the midpoint 2^(bits-1), as F32: a 4-bit byte's two codes (low nibble
# first), an 8-bit byte's one. One ``np.take`` per row block unpacks and widens at once.
_B = np.arange(256)
CODE_PAIRS = (np.stack([_B & 15, _B >> 4], axis=-1) - 8).astype(F32)  # [256, 2]
CODE_BYTES = (_B - 128).astype(F32)[:, None]  # [256, 1]
INT_ROWS = 32  # rows per block: ~0.5 MiB of F32 at I = 4096, held in cache between the passes


def bf16_bits(v: Array) -> Array:
    """F32 -> BF16 bits, round to nearest even, in place in ``v``'s memory (``v`` is
    consumed): bit for bit ml_dtypes' conversion for every finite value and ±Inf (overflow goes
    to Inf); NOT for NaN (a payload's carry may reach the sign), which callers rule out.
    Hand-written because ml_dtypes' cast is a third of the int4 dequant's time."""
    u = v.view(np.uint32)
    t = u >> 16
    t &= 1
    t += 0x7FFF
    u += t
    u >>= 16
    return u


SCALE_DTYPES = (F32, BF16, np.dtype(np.float16))


def dequant_scaled(
    weight: Array, scale: Array, *, what: str = "scaled dequant", workers: int = 1
) -> Array:
    """BF16 ``[..., O, I]``: ``bf16(f32(weight[r, c]) * f32(scale[r]))``; ``weight`` F8_E4M3 or
    I8, ``scale`` ``[..., O, 1]`` (a channel) or one value per matrix (``[..., ]``,
    ``[..., 1]``)."""
    if weight.dtype not in (E4M3, I8) or weight.ndim < 2:
        raise BindError(f"{what}: the weight is {weight.dtype} {list(weight.shape)}, "
                        "expected F8_E4M3 or I8 [..., O, I]")  # fmt: skip
    if scale.dtype not in SCALE_DTYPES:
        raise BindError(f"{what}: the scale is {scale.dtype}, expected F32, BF16 or F16")
    *lead_l, rows, cols = weight.shape
    lead = tuple(lead_l)
    n = math.prod(lead)
    per_row = scale.size == n * rows and scale.shape[-1:] == (1,) and rows > 1
    if not per_row and scale.size != n:
        raise BindError(
            f"{what}: the scale is {list(scale.shape)}, expected {[*lead, rows, 1]} or one "
            f"value per matrix for weight {list(weight.shape)}"
        )
    s2 = scale.astype(F32).reshape(n, rows if per_row else 1)  # [B, O or 1]
    w3 = weight.reshape(n, rows, cols)  # [..., O, I] -> [B, O, I]
    out = np.empty((n, rows, cols), dtype=BF16)
    wide = e4m3_to_f32 if weight.dtype == E4M3 else (lambda a: a.astype(F32))

    def work(span: tuple[int, int, int]) -> None:  # (matrix, first row, end row)
        b, r0, r1 = span
        s_col = s2[b, r0:r1, None] if per_row else s2[b, 0]
        with np.errstate(all="ignore"):
            out[b, r0:r1] = wide(w3[b, r0:r1]) * s_col  # one F32 rounding, then RNE

    _each([(b, r0, r1) for b in range(n) for r0, r1 in _row_spans(rows, cols)], work, workers)
    return out.reshape(*lead, rows, cols)  # [B, O, I] -> [..., O, I]


def swizzle_blockscale(scale: Array, *, what: str = "block-scale swizzle") -> Array:
    """``[..., M, K]`` -> ``[..., M_pad, K_pad]`` in the CUTLASS FP4 scale layout (vLLM's
    ``swizzle_blockscale``): within each 128x4 tile, byte ``lane*16 + sub*4 + k`` holds
    ``scale[tile_m*128 + sub*32 + lane, tile_k*4 + k]``; tiles m-major, padding zero."""
    if scale.ndim < 2:
        raise BindError(f"{what}: the scale is {scale.ndim}-D, expected [..., M, K]")
    *lead_l, m, k = scale.shape
    lead = tuple(lead_l)
    mp, kp = padded_shape(m, k)
    b = math.prod(lead)
    padded = np.zeros((b, mp, kp), dtype=scale.dtype)  # [B, M_pad, K_pad]
    padded[:, :m, :k] = scale.reshape(b, m, k)  # [..., M, K] -> [B, M, K]
    tiles = padded.reshape(b, mp // 128, 4, 32, kp // 4, 4)  # [B, M/128, sub, lane, K/4, k]
    out = np.ascontiguousarray(tiles.transpose(0, 1, 4, 3, 2, 5))  # [B, M/128, K/4, lane, sub, k]
    return out.reshape(*lead, mp, kp)  # -> [..., M_pad, K_pad]
