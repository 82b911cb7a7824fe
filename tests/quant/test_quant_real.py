"""Checkpoints written by the real tools bind 100 %, at every tp and ep the geometry allows.

nvidia-modelopt 0.47 (NVFP4 default, experts-only, weight-only W4A16) and llmcompressor 0.14
(NVFP4 with calibration, NVFP4A16, FP8_BLOCK) each write one tiny checkpoint
(``tests/support/quant_writers.py``, in subprocesses, at most one per core), cached outside the clone
keyed by the tools' versions and the writer's source (``tests/support/quant_cache.py``), so a second
run on the same machine reads what the first wrote. ModelOpt writes transformers'
internal names (``forget_gate.*``, ``attn_hc.*``, one fused ``conv1d``), which the model spec's
name map reads; llmcompressor writes the hub names.

Each checkpoint: ``audit`` accounts for every tensor (bound or declared unbound, no problems);
every rank of every (tp, ep) binds, and the ranks' shares rejoin byte for byte into the
single-rank fields (companions included). Plus what each recipe claims: the experts-only config
leaves attention in BF16, weight-only has no input scales, the FP8 scales are 128 x 128 blocks,
and the fused conv's rank r is ``[q_r; k_r; v_r]``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import quant_cache
from helpers import TABLE, read_file, rejoin
from quant_writers import TEXT_CONFIG

from specbind.audit import audit
from specbind.core.errors import BindError, GeometryError
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.binder.quant_numerics import dequant_int_group, dequant_scaled
from specbind.runtime.io.checkpoint import CheckpointDir

TOOL = {
    "mo_nvfp4": "modelopt",
    "mo_nvfp4_experts": "modelopt",
    "mo_w4a16": "modelopt",
    "llmc_nvfp4": "llmcompressor",
    "llmc_nvfp4a16": "llmcompressor",
    "llmc_fp8_block": "llmcompressor",
    "llmc_fp8_dynamic": "llmcompressor",
    "llmc_fp8": "llmcompressor",
    "llmc_w8a8": "llmcompressor",
    "mo_fp8": "modelopt",
    "llmc_w4a16": "llmcompressor",
    "llmc_w4a16_asym": "llmcompressor",
    "llmc_gptq_w4a16": "llmcompressor",
}
# One scale per output channel or per linear: every rank of RANKS holds whole scales, and each
# rank's dequantized fields must rejoin to the whole one's (the scales go with their rows).
SCALED = ("llmc_fp8_dynamic", "llmc_fp8", "llmc_w8a8", "mo_fp8")
INT4 = ("llmc_w4a16", "llmc_w4a16_asym", "llmc_gptq_w4a16")  # groups of 32 columns
# compressed-tensors' own decompression of every quantized linear, written beside these
REFERENCE = ("llmc_fp8_dynamic", "llmc_fp8", "llmc_w8a8", *INT4)
# tp: the KDA scan tiles 256 channels (8 heads of 64: tp <= 4); ep: up to the 6 experts.
RANKS = [(1, 1), (2, 1), (4, 1), (1, 6), (2, 3), (4, 2)]
# FP8 blocks are 128 x 128: no rank of this tiny model can hold whole blocks under tp > 1.
FP8_RANKS = [(1, 1), (1, 2), (1, 3), (1, 6)]
# Groups of 32 columns: at tp 4 an expert's down_proj rank holds 64 / 4 = 16 columns.
INT4_RANKS = [(1, 1), (2, 1), (1, 6), (2, 3)]
# Zero points packed 8 rows a word: at tp 2 a KDA b_proj rank holds 4 of its 8 rows.
ASYM_RANKS = [(1, 1), (1, 2), (1, 6)]


def _has(module: str) -> bool:
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


@pytest.fixture(scope="session")
def written() -> dict[str, Path]:
    """Every recipe whose tool is installed: from the cache, or written now."""
    tools = {t: _has(t) for t in set(TOOL.values())}
    return quant_cache.written(r for r, t in sorted(TOOL.items()) if tools[t])


def ckpt(written: dict[str, Path], recipe: str) -> Path:
    if recipe not in written:
        pytest.skip(f"{TOOL[recipe]} is not installed (make installs the quant extra)")
    return written[recipe]


def bind(path: Path, **kw: Any) -> BindResult:
    # llmcompressor calibrates each expert's down_proj input scale on its own (see below)
    kw.setdefault("allow_unshared_scales", path.name in ("llmc_nvfp4", "llmc_fp8"))
    return bind_checkpoint(CheckpointDir(path), TABLE, progress=False, **kw)


@pytest.mark.parametrize("recipe", sorted(TOOL))
def test_audit_accounts_for_every_tensor_a_real_tool_wrote(
    written: dict[str, Path], recipe: str
) -> None:
    path = ckpt(written, recipe)
    # llmcompressor's per-expert input scales: audit refuses them as bind does, unless allowed
    rep = audit(CheckpointDir(path), TABLE, progress=False, allow_unshared_scales=True)
    assert rep["problems"] == []
    if recipe == "llmc_nvfp4":
        strict = audit(CheckpointDir(path), TABLE, progress=False)
        assert [p for p in strict["problems"] if "--allow-unshared-scales" in p], strict
    cov = rep["coverage"]
    assert cov["unaccounted"] == 0
    assert cov["bound"] + cov["declared_unbound"] == rep["tensors"]
    assert rep["quantization"] is not None


@pytest.mark.parametrize("recipe", sorted(TOOL))
def test_a_real_checkpoint_binds_at_every_tp_and_ep_and_the_shares_rejoin(
    written: dict[str, Path], recipe: str
) -> None:
    path = ckpt(written, recipe)
    outputs = ("dequantized",) if recipe in (*SCALED, *INT4) else ()
    whole = bind(path, quant_outputs=outputs)
    assert sum(x.bound for x in whole.layers) + sum(whole.unbound.values()) + (
        whole.globals.report.bound if whole.globals else 0
    ) == len(CheckpointDir(path).names()) + 2 * sum(  # a fused conv is read as three
        1 for n in CheckpointDir(path).names() if n.endswith("self_attn.conv1d.weight")
    )
    fields = whole.fields()
    ranks = {"llmc_fp8_block": FP8_RANKS} | dict.fromkeys(INT4, INT4_RANKS)
    ranks["llmc_w4a16_asym"] = ASYM_RANKS
    for tp, ep in ranks.get(recipe, RANKS):
        shares: dict[str, dict[tuple[int, int], Any]] = {}
        for t in range(tp):
            for e in range(ep):
                r = bind(path, tp_size=tp, tp_rank=t, ep_size=ep, ep_rank=e, quant_outputs=outputs)
                for k, (_, a) in r.fields().items():
                    shares.setdefault(k, {})[(t, e)] = a
        for k, (rule, a) in fields.items():
            assert rejoin(rule, shares[k], tp, ep).tobytes() == a.tobytes(), (tp, ep, k)


def test_experts_only_quantizes_the_routed_experts_and_nothing_else(
    written: dict[str, Path],
) -> None:
    f = {k: a for k, (_, a) in bind(ckpt(written, "mo_nvfp4_experts")).fields().items()}
    assert f["layers.1.mlp.w13"].dtype == np.uint8
    assert "layers.1.mlp.w13_weight_scale_2" in f
    assert f["layers.0.attention.q_proj"].dtype == ml_dtypes.bfloat16
    assert f["layers.1.mlp.shared_gate_up"].dtype == ml_dtypes.bfloat16
    quant = ("_weight_scale", "_weight_scale_2", "_input_scale")
    assert not any(k.startswith("layers.0.") and k.endswith(quant) for k in f)


@pytest.mark.parametrize("recipe", ["mo_w4a16", "llmc_nvfp4a16"])
def test_weight_only_checkpoints_bind_without_input_scales(
    written: dict[str, Path], recipe: str
) -> None:
    f = bind(ckpt(written, recipe)).fields()
    assert any(k.endswith("w13_weight_scale") for k in f)
    assert not any(k.endswith(("_input_scale", "_input_global_scale")) for k in f)
    stored = CheckpointDir(ckpt(written, recipe)).names()
    assert not any(n.endswith(("input_scale", "input_global_scale")) for n in stored)


def test_fp8_block_scales_are_one_per_128_by_128_block(written: dict[str, Path]) -> None:
    f = {k: a for k, (_, a) in bind(ckpt(written, "llmc_fp8_block")).fields().items()}
    x, im = TEXT_CONFIG["hidden_size"], TEXT_CONFIG["moe_intermediate_size"]
    assert f["layers.1.mlp.w13"].dtype == ml_dtypes.float8_e4m3fn
    assert f["layers.1.mlp.w13"].shape == (6, 2 * im, x)
    # gate and up each [Im, X] -> one [1, 1] block each, joined: [E, 2, 1]
    assert f["layers.1.mlp.w13_weight_scale"].shape == (6, 2, 1)


def test_llmcompressor_per_expert_down_input_scales_are_refused_unless_allowed(
    written: dict[str, Path],
) -> None:
    """ModelOpt writes one down_proj input scale per layer; llmcompressor one per expert, which
    a fused-MoE kernel quantizing the layer's activations once cannot honour. vLLM warns;
    specbind refuses, unless told otherwise."""
    with pytest.raises(BindError) as e:
        bind(ckpt(written, "llmc_nvfp4"), allow_unshared_scales=False)
    assert "input scales that must be one value differ" in str(e.value)
    assert "down_proj.input_global_scale" in str(e.value)
    bind(ckpt(written, "mo_nvfp4"), allow_unshared_scales=False)  # ModelOpt's agree


def test_fp8_blocks_split_by_tp_into_partial_blocks_are_refused(written: dict[str, Path]) -> None:
    with pytest.raises(GeometryError) as e:
        bind(ckpt(written, "llmc_fp8_block"), tp_size=2, tp_rank=0)
    assert "(O / tp) % 128 == 0 fails" in str(e.value)


def test_the_fused_conv_shards_as_q_k_v_segments_never_as_a_contiguous_third(
    written: dict[str, Path],
) -> None:
    path = ckpt(written, "mo_nvfp4")
    stored = read_file(path / "model.safetensors")
    fused = stored["model.language_model.layers.0.self_attn.conv1d.weight"]  # [3Q, 1, K]
    q = fused.shape[0] // 3
    for r in range(2):
        conv = bind(path, tp_size=2, tp_rank=r).fields()["layers.0.attention.conv"][1]
        half = q // 2
        want = np.concatenate([fused[s * q + r * half : s * q + (r + 1) * half] for s in range(3)])
        assert conv.tobytes() == want[:, 0, :].tobytes()  # [q_r; k_r; v_r], squeezed
        third = fused[r * 3 * half : (r + 1) * 3 * half]  # what a plain row shard would read
        assert conv.tobytes() != third[:, 0, :].tobytes()


@pytest.mark.parametrize("recipe", REFERENCE)
def test_the_dequant_equals_compressed_tensors_own_decompression_bit_for_bit(
    written: dict[str, Path], recipe: str
) -> None:
    """Every quantized linear the tool wrote, dequantized by specbind's formula (FP8 or int8
    codes times the channel or tensor scale; int4 codes less their zero, times their group's
    scale; rounded once to BF16), equals compressed-tensors' ``decompress`` of the same
    tensors."""
    path = ckpt(written, recipe)
    stored = read_file(path / "model.safetensors")
    want = read_file(path / "reference" / "decompressed.safetensors")
    packed = [n.removesuffix(".weight_packed") for n in stored if n.endswith(".weight_packed")]
    assert len(want) >= 20
    assert set(packed) - set(want) == {  # compressed-tensors cannot unpack one row of zeros
        m
        for m in packed
        if f"{m}.weight_zero_point" in stored and stored[m + ".weight_zero_point"].shape[0] == 1
    }
    for module, ref in want.items():
        if recipe in INT4:
            got = dequant_int_group(stored[module + ".weight_packed"],
                                    stored[module + ".weight_scale"],
                                    stored.get(module + ".weight_zero_point"), bits=4)  # fmt: skip
        else:
            got = dequant_scaled(stored[module + ".weight"], stored[module + ".weight_scale"])
        assert got.dtype == ref.dtype == ml_dtypes.bfloat16
        assert got.tobytes() == ref.tobytes(), module


@pytest.mark.parametrize(
    ("recipe", "scale"),
    [("llmc_fp8_dynamic", (None, 1)), ("llmc_w8a8", (None, 1)), ("llmc_fp8", (1,)), ("mo_fp8", ())],
)
def test_each_scheme_stores_the_scale_shape_vllm_loads(
    written: dict[str, Path], recipe: str, scale: tuple[int | None, ...]
) -> None:
    """Channel scales ``[O, 1]`` (FP8_DYNAMIC, W8A8), per-tensor ``[1]`` (llm-compressor's
    static FP8) or ``[]`` (ModelOpt), beside every quantized weight, and detected as the
    scheme that says so (never the block-FP8 one)."""
    path = ckpt(written, recipe)
    stored = read_file(path / "model.safetensors")
    weights = [n for n in stored if n.endswith(".weight_scale")]
    assert weights
    for n in weights:
        w = stored[n.removesuffix("_scale")]
        assert stored[n].shape == tuple(w.shape[0] if d is None else d for d in scale), n
    q = bind(path).quant
    assert (
        q is not None
        and json.loads(q)["scheme"]
        == {
            "llmc_fp8_dynamic": "fp8-channel-compressed-tensors",
            "llmc_w8a8": "int8-channel-compressed-tensors",
            "llmc_fp8": "fp8-tensor-compressed-tensors",
            "mo_fp8": "fp8-modelopt",
        }[recipe]
    )


def test_static_fp8_hands_every_fused_partner_its_own_input_and_weight_scale(
    written: dict[str, Path],
) -> None:
    """vLLM's PerTensorScaleParameter keeps one slot per partner of a fused linear and takes
    the max after loading; the bound field carries every partner's scale, in order."""
    path = ckpt(written, "mo_fp8")
    f = {k: a for k, (_, a) in bind(path).fields().items()}
    stored = read_file(path / "model.safetensors")
    for kind in ("weight_scale", "input_scale"):
        w13 = f[f"layers.1.mlp.w13_{kind}"]
        assert w13.shape == (TEXT_CONFIG["n_routed_experts"], 2)
        for e in range(w13.shape[0]):
            pre = f"model.language_model.layers.1.mlp.experts.{e}."
            want = [float(stored[pre + f"{p}_proj.{kind}"]) for p in ("gate", "up")]
            assert w13[e].tolist() == want, (kind, e)


def test_an_int4_row_parallel_rank_that_would_cut_a_group_is_refused(
    written: dict[str, Path],
) -> None:
    """vLLM refuses a row-parallel partition that is not whole groups
    (``verify_group_size_divides_partition``); so does specbind, before reading a byte."""
    with pytest.raises(GeometryError) as e:
        bind(ckpt(written, "llmc_w4a16"), tp_size=4, tp_rank=0)
    assert "% 32 == 0 fails" in str(e.value)


def test_the_asymmetric_int4_zero_point_is_packed_along_o_and_bound_with_its_rows(
    written: dict[str, Path],
) -> None:
    """W4A16_ASYM stores a zero point ``[ceil(O / 8), I / 32]`` beside each weight; a
    symmetric checkpoint stores none, and its fields carry none."""
    asym = {k: a for k, (_, a) in bind(ckpt(written, "llmc_w4a16_asym")).fields().items()}
    sym = {k: a for k, (_, a) in bind(ckpt(written, "llmc_w4a16")).fields().items()}
    zeros = [k for k in asym if k.endswith("_weight_zero_point")]
    assert zeros and not [k for k in sym if k.endswith("_weight_zero_point")]
    for k in zeros:
        field = asym[k.removesuffix("_weight_zero_point")]  # [.., O, I / 8] words
        assert asym[k].dtype == np.int32
        assert asym[k].shape[-2] == -(-field.shape[-2] // 8), k


def test_an_int4_zero_point_a_column_rank_would_cut_inside_a_word_is_refused(
    written: dict[str, Path],
) -> None:
    """A zero point packs 8 rows a word along O; a rank holding 4 of a linear's 8 rows would
    hold half a word (vLLM's PackedvLLMParameter narrow reads past the stored rows there)."""
    with pytest.raises(GeometryError) as e:
        bind(ckpt(written, "llmc_w4a16_asym"), tp_size=2, tp_rank=1)
    assert "b_proj: a rank holds 4 of O = 8, not whole 8-element units of weight_zero_point" in str(
        e.value
    )


@pytest.mark.parametrize(
    ("recipe", "said"),
    [
        ("llmc_w4a16", "4-bit int group 32 symmetric weights, no input quantization"),
        ("llmc_w4a16_asym", "4-bit int group 32 asymmetric weights"),
        ("llmc_fp8_dynamic", "8-bit float channel symmetric weights, dynamic 8-bit float token"),
        ("mo_fp8", "modelopt, quant_algo FP8"),
    ],
)
def test_audit_names_the_scheme_and_the_variant_the_config_declares(
    written: dict[str, Path], recipe: str, said: str
) -> None:
    rep = audit(CheckpointDir(ckpt(written, recipe)), TABLE, progress=False)
    q = rep["quantization"]
    assert said in q["variant"], q
    if recipe in INT4:
        assert q["params"] == {"G": 32}
        assert q["symmetric"] == (recipe != "llmc_w4a16_asym")


def test_plan_names_the_scheme_and_variant_and_each_ranks_packed_shapes(
    written: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from specbind.cli import main

    assert main(["plan", str(ckpt(written, "llmc_w4a16")), "--tp-size", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (
        "quantized: int-group-compressed-tensors (compressed-tensors pack-quantized, 4-bit int"
        in (rep["source"])
    )
    local = {t["name"]: t["local_shape"] for ts in rep["ranks"][0]["tensors"].values() for t in ts}
    scales = [n for n in local if n.endswith(".weight_scale")]
    assert scales
    for n in scales:  # each rank's groups of 32 columns cover its words of 8 codes exactly
        words = local[n.removesuffix("_scale")]
        assert local[n][-1] * 32 == words[-1] * 8, (n, local[n], words)
        assert local[n][:-1] == words[:-1], n
