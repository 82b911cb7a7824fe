"""Nothing non-finite binds silently from a quantized checkpoint: a dequantized field is finite
unless its stored values are (``runtime.binder.quant_finite``). Each scheme of ``specs/schemes``: a
non-finite stored scale, a non-finite effective group scale and an overflow past BF16 are
refused in one line naming the tensor, its first offending index and the stored bits; a code
times a scale that stays finite binds, as does a stored NaN code; ``synth --quant`` writes
checkpoints that dequantize finite. The oracle for "overflows" is the reference dequant
(``runtime.binder.quant_numerics``), not a threshold written here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers import TABLE
from test_quant_claims import GEO, SCHEMES, edited, tensors

from specbind.core.errors import BindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.binder.quant_numerics import dequant_mxfp4
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth, tiny_values

GPT_OSS = MODELS["gpt-oss"]
DOWN = "layers.0.mlp.down_proj"  # [hidden 128, intermediate 128], columns split at tp 2
MX = "layers.0.mlp.experts.down_proj"  # gpt-oss's stacked experts [E 6, O 64, I/32 4, 16]
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, scheme in SCHEMES.items():
        d = tmp_path_factory.mktemp("finite") / name
        if scheme.holds(False):
            synth(TABLE, d, GEO, layers=1, seed=5, quant=scheme, mtp=False)
        else:  # companions named from the parameter: stacked experts
            synth(GPT_OSS, d, tiny_values(GPT_OSS), layers=1, seed=5, quant=scheme)
        out[name] = d
    return out


def table_of(name: str) -> Any:
    return TABLE if SCHEMES[name].holds(False) else GPT_OSS


def bind(path: Path, name: str, **kw: Any) -> BindResult:
    return bind_checkpoint(CheckpointDir(path), table_of(name), progress=False, **kw)


def refused(path: Path, name: str, **kw: Any) -> str:
    with pytest.raises(BindError) as e:
        bind(path, name, **kw)
    msg = str(e.value)
    assert "\n" not in msg and "finite unless its stored values are" in msg
    return msg


def with_value(src: Path, dest: Path, tensor: str, index: tuple[int, ...], value: Any) -> Path:
    a = tensors(src)[tensor].copy()
    a[index] = value
    return edited(src, dest, {tensor: a})


def floats(result: BindResult) -> dict[str, Any]:
    """Every bound floating field, as F32, by its ``--out`` name."""
    out = {}
    for name, (_, a) in result.fields().items():
        arr = np.asarray(a)
        if arr.dtype.kind == "f" or arr.dtype == ml_dtypes.bfloat16:
            out[name] = arr.astype(np.float32)
    return out


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_every_synthesized_quantized_checkpoint_dequantizes_finite(
    ckpts: dict[str, Path], name: str
) -> None:
    r = bind(ckpts[name], name, quant_outputs=("dequantized",))
    got = floats(r)
    assert any(k.endswith(("_bf16", ".w2")) for k in got), "a dequantized field is bound"
    assert [k for k, a in got.items() if not np.isfinite(a).all()] == []


def test_an_e8m0_nan_scale_is_refused_naming_the_tensor_index_and_byte(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    src = ckpts["mxfp4"]
    scales = tensors(src)[MX + "_scales"]
    d = edited(src, tmp_path / "c", {MX + "_scales": np.full_like(scales, 0xFF)})
    msg = refused(d, "mxfp4")
    assert "mlp.experts.down_proj_scales element [0, 0, 0] is 0xFF, the E8M0 NaN" in msg


@pytest.mark.parametrize(
    ("scale", "code"),
    [(0xFE, 0x7), (0xFD, 0x7), (0xFD, 0x5), (0xFC, 0xF), (0xFE, 0x3), (0xFE, 0x1)],
)
def test_an_mxfp4_overflow_is_refused_exactly_where_the_dequant_is_not_finite(
    ckpts: dict[str, Path], tmp_path: Path, scale: int, code: int
) -> None:
    """One block of expert 1 gets the E8M0 byte ``scale`` and the code ``code`` in its
    column 3 (byte 1's high nibble); the rest of the checkpoint is finite."""
    src = ckpts["mxfp4"]
    t = tensors(src)
    blocks, scales = t[MX + "_blocks"].copy(), t[MX + "_scales"].copy()
    blocks[1, 2, 0] = 0
    blocks[1, 2, 0, 1] = code << 4
    scales[1, 2, 0] = scale
    finite = bool(np.isfinite(dequant_mxfp4(blocks, scales).astype(np.float32)).all())
    d = edited(src, tmp_path / "c", {MX + "_blocks": blocks, MX + "_scales": scales})
    if finite:
        bind(d, "mxfp4")
        return
    msg = refused(d, "mxfp4")
    assert f"mlp.experts.down_proj_blocks element [1, 2, 0, 1] high nibble 0x{code:X}" in msg
    assert f"times layers.0.mlp.experts.down_proj_scales element [1, 2, 0] = 0x{scale:02X}" in msg
    assert f"(2^{scale - 127}) overflows BF16" in msg


def test_the_boundary_cases_above_include_both_verdicts() -> None:
    """The parametrized overflow cases are not all one verdict (the oracle decides)."""
    verdicts = set()
    for scale, code in ((0xFE, 0x7), (0xFE, 0x1)):
        b = np.zeros((1, 1, 1, 16), np.uint8)
        b[0, 0, 0, 1] = code << 4
        s = np.full((1, 1, 1), scale, np.uint8)
        verdicts.add(bool(np.isfinite(dequant_mxfp4(b, s).astype(np.float32)).all()))
    assert verdicts == {True, False}


NVFP4 = ["nvfp4-compressed-tensors", "nvfp4-modelopt"]


@pytest.mark.parametrize("name", NVFP4)
@pytest.mark.parametrize("rank", [0, 1])
def test_an_e4m3_nan_group_scale_is_refused_by_every_tp_rank_naming_its_whole_index(
    ckpts: dict[str, Path], tmp_path: Path, name: str, rank: int
) -> None:
    """Column group 6 of down_proj (I split at tp 2) is tp rank 1's; both ranks refuse it
    with the same whole-tensor index."""
    n = DOWN + ".weight_scale"
    d = with_value(ckpts[name], tmp_path / "c", n, (5, 6), np.uint8(0x7F).view(E4M3))
    msg = refused(d, name, tp_size=2, tp_rank=rank)
    assert "mlp.down_proj.weight_scale element [5, 6] is nan (0x7F), a non-finite F8_E4M3" in msg


@pytest.mark.parametrize(
    ("name", "suffix", "value", "says"),
    [
        ("nvfp4-compressed-tensors", "weight_global_scale", 0.0, "/ layers.0.mlp.down_proj.weight_global_scale (0.0) is inf"),
        ("nvfp4-compressed-tensors", "weight_global_scale", np.inf, "is inf (0x7F800000), a non-finite F32"),
        ("nvfp4-modelopt", "weight_scale_2", np.nan, "is nan (0x7FC00000), a non-finite F32"),
        ("nvfp4-modelopt", "weight_scale_2", 3e38, "* layers.0.mlp.down_proj.weight_scale_2 (3.0000000054977558e+38) is inf"),
        ("nvfp4-modelopt", "input_scale", np.nan, "mlp.down_proj.input_scale element [] is nan"),
    ],
)  # fmt: skip
def test_a_global_or_input_scale_that_makes_groups_non_finite_is_refused(
    ckpts: dict[str, Path], tmp_path: Path, name: str, suffix: str, value: float, says: str
) -> None:
    n = f"{DOWN}.{suffix}"
    a = tensors(ckpts[name])[n]
    d = edited(ckpts[name], tmp_path / "c", {n: np.full_like(a, value)})
    assert says in refused(d, name)


@pytest.mark.parametrize("name", NVFP4)
def test_an_nvfp4_group_scale_whose_largest_code_overflows_bf16_is_refused(
    ckpts: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """A group scale of 448 with a global scale that keeps it finite in F32 (8.96e37) but
    past BF16 for the code 6.0: refused naming the code; the code 1.0 in that group binds."""
    g = DOWN + (".weight_global_scale" if "compressed" in name else ".weight_scale_2")
    w = DOWN + (".weight_packed" if "compressed" in name else ".weight")
    t = tensors(ckpts[name])
    glob = np.full_like(t[g], 1 / 2e35 if "compressed" in name else 2e35)
    scale = t[DOWN + ".weight_scale"].view(np.uint8).copy()
    scale[...] = 0x30  # 2^-3 · ... small: every other group stays finite
    scale[3, 1] = 0x7E  # 448
    packed = t[w].copy()
    packed[3, 8:16] = 0x22  # group 1 of row 3: code 2 (1.0) in every column
    ok = edited(
        ckpts[name], tmp_path / "ok", {g: glob, w: packed, DOWN + ".weight_scale": scale.view(E4M3)}
    )
    bind(ok, name)
    packed[3, 10] = 0x72  # column 21: code 7 (6.0) in the high nibble
    bad = edited(
        ckpts[name],
        tmp_path / "bad",
        {g: glob, w: packed, DOWN + ".weight_scale": scale.view(E4M3)},
    )
    msg = refused(bad, name)
    assert f"mlp.down_proj.{w.rsplit('.', 1)[1]} element [3, 10] high nibble 0x7 (E2M1 6.0)" in msg
    assert "times layers.0.mlp.down_proj.weight_scale element [3, 1] = 0x7E" in msg
    assert "np.float32" not in msg and "group scale 8.9599" in msg  # a number, not a NumPy repr


FP8 = ["fp8-block", "fp8-block-compressed-tensors"]


def _fp8_scale(name: str) -> str:
    return DOWN + (".weight_scale_inv" if name == "fp8-block" else ".weight_scale")


@pytest.mark.parametrize("name", FP8)
@pytest.mark.parametrize("value", [np.nan, -np.inf])
def test_a_non_finite_fp8_block_scale_is_refused_naming_its_bits(
    ckpts: dict[str, Path], tmp_path: Path, name: str, value: float
) -> None:
    n = _fp8_scale(name)
    a = tensors(ckpts[name])[n]
    d = with_value(ckpts[name], tmp_path / "c", n, (0, 0), value)
    bits = np.array(value, a.dtype).view(f"u{a.dtype.itemsize}")
    dtype = "F32" if a.dtype == np.float32 else "BF16"
    want = f"{n.removeprefix('layers.0.')} element [0, 0] is {float(value)!r} (0x{int(bits):0{2 * a.dtype.itemsize}X}), a non-finite {dtype}"
    assert want in refused(d, name)


@pytest.mark.parametrize("name", FP8)
def test_an_fp8_block_overflow_is_refused_and_a_stored_nan_code_binds_as_nan(
    ckpts: dict[str, Path], tmp_path: Path, name: str
) -> None:
    n, w = _fp8_scale(name), DOWN + ".weight"
    t = tensors(ckpts[name])
    weight = t[w].view(np.uint8).copy()
    weight[...] = 0x38  # 1.0 everywhere
    weight[7, 9] = 0x7F  # a stored NaN code: stays NaN, not refused
    scale = np.full_like(t[n], 1e38)  # 1.0 · 1e38 is finite in BF16
    ok = edited(ckpts[name], tmp_path / "ok", {w: weight.view(E4M3), n: scale})
    r = bind(ok, name, quant_outputs=("dequantized",))
    v = floats(r)["layers.0.mlp.down_bf16"]
    assert (
        np.isnan(v[7, 9])
        and int(np.isnan(v).sum()) == 1
        and bool(np.isfinite(v[~np.isnan(v)]).all())
    )
    weight[11, 4] = 0x48  # 4.0: 4e38 is past BF16
    weight[12, 1] = 0x48
    bad = edited(ckpts[name], tmp_path / "bad", {w: weight.view(E4M3), n: scale})
    msg = refused(bad, name)
    assert "mlp.down_proj.weight element [11, 4] = 0x48 (4.0) times" in msg
    assert "element [0, 0] (" in msg and "overflows BF16" in msg
