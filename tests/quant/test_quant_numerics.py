"""The NumPy quantized numerics (runtime/binder/quant_numerics.py) against definitions written out
element by element from the formats' bit layouts, and vLLM's swizzle transcribed to NumPy.
The libraries themselves are compared in test_quant_reference.py."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from specbind.core.errors import BindError
from specbind.runtime.binder import ops
from specbind.runtime.binder import quant_numerics as qn

F32, U8, U16 = np.float32, np.uint8, np.uint16
E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16


def e2m1_value(code: int, negative_zero: bool) -> float:
    """E2M1 from its bits: S.EE.M; exponent bias 1; EE = 0 is subnormal (M * 0.5)."""
    sign, e, m = code >> 3, (code >> 1) & 3, code & 1
    mag = m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
    if sign and (mag or negative_zero):
        return -mag
    return mag


def e4m3_value(byte: int) -> float:
    """E4M3fn from its bits: S.EEEE.MMM, bias 7, no Inf, S.1111.111 is NaN."""
    sign, e, m = byte >> 7, (byte >> 3) & 15, byte & 7
    if e == 15 and m == 7:
        return math.nan
    mag = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -mag if sign else mag


def bits(a: Any) -> Any:
    return np.asarray(a).view(U16)


def rand_nvfp4(
    rng: np.random.Generator, lead: tuple[int, ...], rows: int, cols: int, group: int
) -> tuple[Any, Any]:
    packed = rng.integers(0, 256, (*lead, rows, cols // 2), dtype=U8)
    scale = rng.integers(0, 256, (*lead, rows, cols // group), dtype=U8)
    scale[(scale & 0x7F) == 0x7F] = 0x38  # no NaN scales here: 1.0 instead
    return packed, scale.view(E4M3)


@pytest.mark.parametrize("divide", [False, True])
def test_nvfp4_dequant_is_the_group_scale_first_then_one_bf16_rounding(divide: bool) -> None:
    rng = np.random.default_rng(1)
    packed, scale = rand_nvfp4(rng, (), 6, 64, 16)
    g = F32(0.0123)
    got = bits(qn.dequant_nvfp4(packed, scale, g, divide=divide))
    for r in range(6):
        for c in range(64):
            byte = int(packed[r, c // 2])
            code = byte & 15 if c % 2 == 0 else byte >> 4  # the even column is the low nibble
            s = F32(e4m3_value(int(scale.view(U8)[r, c // 16])))
            eff = s / g if divide else s * g  # F32 scalars: one rounding each
            want = np.array(F32(e2m1_value(code, divide)) * eff, F32).astype(BF16)
            assert got[r, c] == bits(want), (r, c, code)


def test_negative_zero_follows_the_libraries_tables() -> None:
    """Code 8 is +0 for ModelOpt (multiply) and -0 for compressed-tensors (divide)."""
    packed = np.array([[0x88] * 8], dtype=U8)  # sixteen codes 8
    scale = np.array([[1.0]], dtype=E4M3)
    one = np.array(1.0, F32)
    assert set(bits(qn.dequant_nvfp4(packed, scale, one, divide=False)).ravel()) == {0x0000}
    assert set(bits(qn.dequant_nvfp4(packed, scale, one, divide=True)).ravel()) == {0x8000}
    forced = qn.dequant_nvfp4(packed, scale, one, divide=False, negative_zero=True)
    assert set(bits(forced).ravel()) == {0x8000}


@pytest.mark.parametrize("gshape", ["lead", "lead1", "scalar"])
def test_a_stacked_nvfp4_tensor_is_its_matrices_dequantized_one_by_one(gshape: str) -> None:
    rng = np.random.default_rng(2)
    packed, scale = rand_nvfp4(rng, (2, 3), 5, 32, 16)
    g = rng.uniform(1e-3, 1, (2, 3)).astype(F32)
    if gshape == "lead1":
        g = g[..., None]
    if gshape == "scalar":
        g = g[0, 0].reshape(())
    got = ops.dequant_nvfp4(packed, scale, g, divide=False)
    assert got.shape == (2, 3, 5, 32) and got.dtype == BF16
    for i in range(2):
        for j in range(3):
            gij = g.reshape(()) if gshape == "scalar" else g[i, j].reshape(())
            one = qn.dequant_nvfp4(packed[i, j], scale[i, j], gij, divide=False)
            assert bits(got[i, j]).tobytes() == bits(one).tobytes(), (i, j)


def test_a_stacked_gate_and_up_use_each_halfs_own_global_scale() -> None:
    """w13 [E, 2·Im, H/2] with w13_weight_scale_2 [E, 2]: rows [0, Im) take column 0."""
    rng = np.random.default_rng(6)
    packed, scale = rand_nvfp4(rng, (2,), 8, 32, 16)
    g = rng.uniform(1e-3, 1, (2, 2)).astype(F32)
    got = ops.dequant_nvfp4(packed, scale, g, divide=False)
    for e in range(2):
        for half, rows in enumerate((slice(0, 4), slice(4, 8))):
            one = qn.dequant_nvfp4(packed[e, rows], scale[e, rows], g[e, half], divide=False)
            assert bits(got[e, rows]).tobytes() == bits(one).tobytes(), (e, half)


def test_nvfp4_rows_in_chunks_and_threads_give_the_same_bytes_as_one_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(3)
    packed, scale = rand_nvfp4(rng, (3,), 40, 64, 16)
    g = rng.uniform(1e-3, 1, (3,)).astype(F32)
    whole = qn.dequant_nvfp4(packed, scale, g, divide=True)
    monkeypatch.setattr(qn, "CHUNK_ELEMENTS", 100)  # about one row per chunk
    for workers in (1, 3):
        chunked = qn.dequant_nvfp4(packed, scale, g, divide=True, workers=workers)
        assert np.array_equal(bits(whole), bits(chunked)), workers


def test_fp8_block_dequant_on_several_threads_gives_the_same_bytes() -> None:
    rng = np.random.default_rng(7)
    w = rng.integers(0, 256, (3, 40, 24), dtype=U8).view(E4M3)
    s = rng.uniform(-1, 1, (3, 5, 3)).astype(F32)
    one = qn.dequant_fp8_block(w, s, block=(8, 8))
    assert (
        bits(qn.dequant_fp8_block(w, s, block=(8, 8), workers=4)).tobytes() == bits(one).tobytes()
    )


@pytest.mark.parametrize("sdtype", [np.float32, BF16])
def test_fp8_block_dequant_uses_the_scale_of_each_elements_block(sdtype: Any) -> None:
    rng = np.random.default_rng(4)
    rows, cols, bo, bi = 9, 11, 4, 3  # neither a multiple of its block
    w = rng.integers(0, 256, (rows, cols), dtype=U8)
    s = rng.uniform(-2, 2, (3, 4)).astype(sdtype)
    got = bits(qn.dequant_fp8_block(w.view(E4M3), s, block=(bo, bi)))
    for r in range(rows):
        for c in range(cols):
            prod = F32(e4m3_value(int(w[r, c]))) * F32(s[r // bo, c // bi])
            want = bits(np.array(prod, F32).astype(BF16))
            if np.isnan(prod):
                assert got[r, c] & 0x7FFF == 0x7FC0, (r, c)
            else:
                assert got[r, c] == want, (r, c)


def vllm_swizzle_blockscale(scale: Any) -> Any:
    """NumPy transcription of vLLM's ``swizzle_blockscale``
    (vllm/model_executor/layers/quantization/utils/nvfp4_utils.py; earlier a method of
    ModelOptNvFp4LinearMethod in vllm/model_executor/layers/quantization/modelopt.py):

        scale_ndim = scale.ndim
        if scale_ndim == 2:
            scale = scale.unsqueeze(0)  # (1, M, K)
        B, M, K = scale.shape
        M_padded = round_up(M, 128)
        K_padded = round_up(K, 4)
        padded = torch.zeros((B, M_padded, K_padded), dtype=scale.dtype, device=scale.device)
        padded[:B, :M, :K] = scale
        padded = padded.reshape(B, M_padded // 128, 4, 32, K_padded // 4, 4)
        swizzled = padded.permute(0, 1, 4, 3, 2, 5).contiguous().cuda()
        if scale_ndim == 2:
            return swizzled.reshape(M_padded, K_padded)
        return swizzled.reshape(B, M_padded, K_padded)
    """
    scale_ndim = scale.ndim
    if scale_ndim == 2:
        scale = scale[None]  # (1, M, K)
    b, m, k = scale.shape
    m_padded = (m + 127) // 128 * 128
    k_padded = (k + 3) // 4 * 4
    padded = np.zeros((b, m_padded, k_padded), dtype=scale.dtype)
    padded[:b, :m, :k] = scale
    padded = padded.reshape(b, m_padded // 128, 4, 32, k_padded // 4, 4)  # tiles
    swizzled = np.ascontiguousarray(padded.transpose(0, 1, 4, 3, 2, 5))
    if scale_ndim == 2:
        return swizzled.reshape(m_padded, k_padded)  # [M_pad, K_pad]
    return swizzled.reshape(b, m_padded, k_padded)  # [B, M_pad, K_pad]


@settings(max_examples=examples(0.6), deadline=None)
@given(st.integers(0, 3), st.integers(1, 300), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_swizzle_equals_vllms_swizzle_blockscale(b: int, m: int, k: int, seed: int) -> None:
    shape = (m, k) if b == 0 else (b, m, k)
    rng = np.random.default_rng(seed)
    scale = rng.integers(0, 256, shape, dtype=U8).view(E4M3)
    got = ops.swizzle_blockscale(scale)
    want = vllm_swizzle_blockscale(scale)
    assert got.dtype == E4M3 and got.shape == want.shape
    assert got.view(U8).tobytes() == want.view(U8).tobytes()


def test_swizzle_places_a_scale_at_its_documented_tile_offset() -> None:
    scale = np.zeros((256, 8), dtype=U8)
    scale[128 + 2 * 32 + 5, 4 + 3] = 7  # tile (1, 1), sub 2, lane 5, k 3
    out = qn.swizzle_blockscale(scale).reshape(-1)
    tile = (1 * 2 + 1) * 512  # tiles m-major, then k; 128 x 4 bytes each
    assert np.flatnonzero(out).tolist() == [tile + 5 * 16 + 2 * 4 + 3]


R = np.random.default_rng(5)
PACKED = R.integers(0, 256, (4, 16), dtype=U8)
SCALE = np.ones((4, 2), dtype=E4M3)
G = np.array(1.0, F32)


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (
            lambda: qn.dequant_nvfp4(PACKED, SCALE[:, :1], G, divide=False),
            "[4, 1], expected [4, 2]",
        ),
        (lambda: qn.dequant_nvfp4(PACKED, SCALE.astype(np.float16), G, divide=False), "float16"),
        (lambda: qn.dequant_nvfp4(PACKED, SCALE.view(U8), G, divide=False), "uint8"),
        (lambda: qn.dequant_nvfp4(PACKED.view(np.int8), SCALE, G, divide=False), "int8"),
        (lambda: qn.dequant_nvfp4(PACKED, SCALE, np.float64(1), divide=False), "float64"),
        (lambda: qn.dequant_nvfp4(PACKED, SCALE, np.ones(3, F32), divide=False), "[3]"),
        (lambda: qn.dequant_nvfp4(PACKED, SCALE, np.ones((1, 1), F32), divide=False), "[1, 1]"),
        (lambda: qn.dequant_nvfp4(PACKED[:, :5], SCALE, G, divide=False), "10 columns"),
        (lambda: qn.dequant_fp8_block(PACKED.view(E4M3), np.ones((1, 2), F32)), "[1, 2]"),
        (lambda: qn.dequant_fp8_block(PACKED.view(E4M3), np.ones((1, 1), np.float16)), "float16"),
        (lambda: qn.swizzle_blockscale(SCALE[0]), "1-D"),
    ],
)
def test_bad_quantized_input_is_refused_in_one_line_naming_it(call: Any, says: str) -> None:
    with pytest.raises(BindError) as e:
        call()
    assert says in str(e.value) and "\n" not in str(e.value)
    assert "dequant" in str(e.value) or "swizzle" in str(e.value)


def int_group_by_element(packed: Any, scale: Any, zero: Any, bits: int) -> Any:
    """The integer-group formula element by element from the words' bits: code k of a word in
    bits k·bits up, the zero packed the same way down the rows (2^(bits-1) when absent)."""
    rows, words = packed.shape
    pf, mask = 32 // bits, (1 << bits) - 1
    cols = words * pf
    g = cols // scale.shape[1]
    out = np.empty((rows, cols), dtype=BF16)
    for r in range(rows):
        for c in range(cols):
            code = (int(packed[r, c // pf]) >> ((c % pf) * bits)) & mask
            z = 1 << (bits - 1)
            if zero is not None:
                z = (int(zero[r // pf, c // g]) >> ((r % pf) * bits)) & mask
            with np.errstate(all="ignore"):
                out[r, c] = np.float32(code - z) * np.float32(scale[r, c // g])
    return out


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize("special", [False, True])
def test_int_group_dequant_follows_the_formula_element_by_element(
    bits: int, zero: bool, special: bool
) -> None:
    """Every code of random words, under scales that include (``special``) NaN, ±Inf, zero,
    a subnormal and values whose products overflow or round to a tie."""
    rng = np.random.default_rng(bits + 2 * zero + 4 * special)
    packed = rng.integers(-(2**31), 2**31, (11, 3), dtype=np.int64).astype(np.int32)
    cols = 3 * (32 // bits)
    scale = rng.uniform(-3, 3, (11, cols // 4)).astype(F32)
    if special:
        scale.reshape(-1)[:7] = [np.nan, np.inf, -np.inf, 0.0, 1e-45, 3e38, 1.0 + 2.0**-9]
        scale.reshape(-1)[7] = np.uint32(0x7FFFFFFF).view(F32)  # a NaN whose rounding carries
    z = rng.integers(-(2**31), 2**31, (-(-11 // (32 // bits)), cols // 4), dtype=np.int64)
    zw = z.astype(np.int32) if zero else None
    got = qn.dequant_int_group(packed, scale, zw, bits=bits)
    want = int_group_by_element(packed, scale, zw, bits)
    g, w = got.view(U16), want.view(U16)
    nan = (w & 0x7FFF) > 0x7F80
    assert np.array_equal((g & 0x7FFF) > 0x7F80, nan)
    assert np.array_equal(g[~nan], w[~nan])


def test_the_hand_written_bf16_rounding_equals_ml_dtypes_for_every_non_nan_f32() -> None:
    """``bf16_bits`` on F32 bit patterns spread over every exponent, the ties, ±0, ±Inf and
    the largest finite values (NaN is ruled out by its callers)."""
    rng = np.random.default_rng(5)
    u = rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    u[:8] = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x7F7F8000, 0x3F808000, 1]
    u = u[(u & 0x7FFFFFFF) <= 0x7F800000]
    f = u.view(F32)
    want = f.astype(BF16).view(U16)
    assert np.array_equal(qn.bf16_bits(f.copy()).astype(U16), want)
