"""Quantized checkpoints on synthetic data (``synth --quant``): every tensor bound once, the
packed layouts and their scales split in whole groups and rejoining byte for byte, the config
cross-check, and each corruption refused by name.

The numerics of dequant and swizzle are proven in ``test_quant_numerics``/``test_quant_reference``
(bit for bit against the libraries); here the NumPy backend runs them where a field needs them
(the DSA absorb reads BF16)."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers import TABLE, TINY, copy_with, read_file, rejoin

from specbind.core.errors import BindError, CheckpointError, GeometryError, SpecbindError
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.binder import backends
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth

# Every linear's input width (and its column shard up to tp 4) a multiple of 16, so the whole
# model is NVFP4; tp 8 splits an expert's Im = 64 into 8 columns: not a whole 16-group.
GEO = TINY | {
    "hidden": 128, "intermediate": 128, "moe_intermediate": 64, "v_head_dim": 32,
    "q_lora_rank": 48, "kv_lora_rank": 32,
}  # fmt: skip
SCHEMES = {s.name: s for s in TABLE.schemes}
L = "layers."


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in SCHEMES:
        d = tmp_path_factory.mktemp("quant") / name
        synth(TABLE, d, GEO, layers=5, seed=3, quant=SCHEMES[name])
        out[name] = d
    return out


def bind(path: Path, **kw: Any) -> BindResult:
    return bind_checkpoint(CheckpointDir(path), TABLE, progress=False, **kw)


def refused(path: Path, kind: type[Exception] = BindError, **kw: Any) -> str:
    with pytest.raises(kind) as e:
        bind(path, **kw)
    return str(e.value)


def edited(src: Path, dest: Path, edit: dict[str, Any] | None = None) -> Path:
    """A copy of ``src`` with tensors edited, its quantization config files kept."""
    copy_with(src, dest, edit)
    for f in src.glob("hf_quant_config.json"):
        shutil.copy(f, dest / f.name)
    return dest


def tensors(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in sorted(path.glob("*.safetensors")):
        out |= read_file(f)
    return out


# GLM's linears are [O, I] MODULE.weight; a scheme naming companions from the parameter (mxfp4)
# holds stacked linears only (tests/families/test_family_gpt_oss_mxfp4.py)
GLM_SCHEMES = sorted(n for n, s in SCHEMES.items() if s.holds(False))


@pytest.mark.parametrize("scheme", GLM_SCHEMES)
def test_every_tensor_of_a_quantized_checkpoint_is_bound_exactly_once(
    ckpts: dict[str, Path], scheme: str
) -> None:
    r = bind(ckpts[scheme])
    bound = sum(x.bound for x in r.layers) + (r.globals.report.bound if r.globals else 0)
    assert bound == len(CheckpointDir(ckpts[scheme]).names())
    want = {"U8": np.uint8, "F8_E4M3": ml_dtypes.float8_e4m3fn, "I8": np.int8, "I32": np.int32}[
        SCHEMES[scheme].weight.dtype
    ]
    rule, w13 = r.fields()["layers.3.mlp.w13"]
    assert w13.dtype == want and rule.dtype == SCHEMES[scheme].weight.dtype


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1), (4, 1), (1, 2), (2, 3), (4, 2)])
def test_stacked_nvfp4_experts_have_the_layout_fused_moe_kernels_read(
    ckpts: dict[str, Path], tp: int, ep: int
) -> None:
    x, im, e = GEO["hidden"], GEO["moe_intermediate"], GEO["experts"]
    for rank in range(ep):
        f = {k: a for k, (_, a) in bind(ckpts["nvfp4-modelopt"], tp_size=tp, tp_rank=tp - 1,
                                           ep_size=ep, ep_rank=rank).fields().items()}  # fmt: skip
        er = e // ep + (1 if rank < e % ep else 0)
        assert f["layers.3.mlp.w13"].shape == (er, 2 * im // tp, x // 2)
        assert f["layers.3.mlp.w13"].dtype == np.uint8
        assert f["layers.3.mlp.w13_weight_scale"].shape == (er, 2 * im // tp, x // 16)
        assert f["layers.3.mlp.w13_weight_scale"].dtype == ml_dtypes.float8_e4m3fn
        assert f["layers.3.mlp.w13_weight_scale_2"].shape == (er, 2)
        assert f["layers.3.mlp.w13_input_scale"].shape == (er, 2)
        assert f["layers.3.mlp.w2"].shape == (er, x, im // tp // 2)
        assert f["layers.3.mlp.w2_weight_scale"].shape == (er, x, im // tp // 16)
        assert f["layers.3.mlp.w2_weight_scale_2"].shape == (er,)


@pytest.mark.parametrize("scheme", ["nvfp4-modelopt", "nvfp4-compressed-tensors"])
@pytest.mark.parametrize(("tp", "ep"), [(2, 1), (4, 3)])
def test_rank_shares_of_packed_weights_and_scales_rejoin_to_the_whole_byte_for_byte(
    ckpts: dict[str, Path], scheme: str, tp: int, ep: int
) -> None:
    whole = bind(ckpts[scheme]).fields()
    shares: dict[str, dict[tuple[int, int], Any]] = {}
    rules = {}
    for t in range(tp):
        for e in range(ep):
            for k, (rule, a) in (
                bind(ckpts[scheme], tp_size=tp, tp_rank=t, ep_size=ep, ep_rank=e).fields().items()
            ):
                shares.setdefault(k, {})[(t, e)] = a
                rules[k] = rule
    quant = [k for k in whole if k.endswith(("_weight_scale", "_scale_2", "_global_scale"))]
    assert len(quant) > 40  # the rejoin below covers the companions, not only BF16 fields
    for k, (_, a) in whole.items():
        got = rejoin(rules[k], shares[k], tp, ep)
        assert got.tobytes() == a.tobytes(), k


def test_a_rank_that_would_split_a_16_element_scale_group_is_refused_naming_the_constraint(
    ckpts: dict[str, Path],
) -> None:
    msg = refused(ckpts["nvfp4-modelopt"], GeometryError, tp_size=8, tp_rank=0)
    assert "(I / tp) % 16 == 0 fails" in msg and "a rank holds whole groups" in msg


def test_the_dequantized_output_of_a_rank_is_its_rows_of_the_whole_dequantized_field(
    ckpts: dict[str, Path],
) -> None:
    out = ["dequantized", "swizzled"]
    whole = bind(ckpts["nvfp4-modelopt"], quant_outputs=out).fields()
    half = bind(ckpts["nvfp4-modelopt"], quant_outputs=out, tp_size=2, tp_rank=1).fields()
    w, h = whole["layers.0.mlp.gate_up_bf16"][1], half["layers.0.mlp.gate_up_bf16"][1]
    f = GEO["intermediate"]
    rows = np.concatenate([w[f // 2 : f], w[f + f // 2 :]])  # [gate_1; up_1]
    assert h.dtype == ml_dtypes.bfloat16 and h.tobytes() == rows.tobytes()
    sw = half["layers.3.mlp.w13_weight_scale_swizzled"][1]
    assert sw.shape == (6, 128, 8)  # [E, 2·Im/tp = 64 -> 128 rows, X/16 = 8 cols]


def test_a_block_scale_with_the_wrong_group_count_is_refused_naming_it(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    src = ckpts["nvfp4-modelopt"]
    n = L + "0.mlp.down_proj.weight_scale"
    bad = tensors(src)[n][:, :-1].copy()
    msg = refused(edited(src, tmp_path / "c", {n: bad}))
    assert "mlp.down_proj.weight_scale has shape [128, 7], expected [128, 8] ([O, I / 16])" in msg


def test_a_packed_weight_with_an_odd_column_count_is_refused(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    src = ckpts["nvfp4-modelopt"]
    n = L + "0.mlp.down_proj.weight"
    bad = tensors(src)[n][:, :-1].copy()  # 63 bytes: not a whole number of code pairs
    msg = refused(edited(src, tmp_path / "c", {n: bad}))
    assert "mlp.down_proj.weight has shape [128, 63], expected [128, 64] ([O, I / 2])" in msg


def test_an_f16_block_scale_is_refused_saying_what_the_scheme_stores(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    src = ckpts["nvfp4-modelopt"]
    n = L + "0.mlp.down_proj.weight_scale"
    bad = tensors(src)[n].astype(np.float16)
    msg = refused(edited(src, tmp_path / "c", {n: bad}))
    assert "mlp.down_proj.weight_scale is F16 but a dense block requires F8_E4M3" in msg
    assert "nvfp4-modelopt stores weight_scale as F8_E4M3" in msg


def test_a_missing_global_scale_is_refused_by_name(ckpts: dict[str, Path], tmp_path: Path) -> None:
    src = ckpts["nvfp4-modelopt"]
    msg = refused(edited(src, tmp_path / "c", {L + "0.mlp.down_proj.weight_scale_2": None}))
    assert (
        "layer 0: missing layers.0.mlp.down_proj.weight_scale_2 (a dense block requires it)" in msg
    )


def test_an_excluded_module_that_carries_scales_is_refused_naming_the_module(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    d = edited(ckpts["nvfp4-modelopt"], tmp_path / "c")
    cfg = json.loads((d / "hf_quant_config.json").read_text())
    cfg["quantization"]["exclude_modules"] = ["layers.*.mlp.down_proj"]
    (d / "hf_quant_config.json").write_text(json.dumps(cfg))
    msg = refused(d)
    assert "layer 0: mlp.down_proj is excluded from quantization" in msg
    assert "lists 'layers.*.mlp.down_proj'" in msg and "mlp.down_proj.weight_scale" in msg


def test_a_module_the_config_quantizes_but_stored_in_bf16_is_refused(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    src = ckpts["nvfp4-modelopt"]
    m = L + "0.mlp.down_proj."
    x, f = GEO["hidden"], GEO["intermediate"]
    bf = np.zeros((x, f), dtype=ml_dtypes.bfloat16)
    edit: dict[str, Any] = {m + s: None for s in ("weight_scale", "weight_scale_2", "input_scale")}
    msg = refused(edited(src, tmp_path / "c", edit | {m + "weight": bf}))
    assert (
        "layer 0: mlp.down_proj: hf_quant_config.json quantization.exclude_modules leaves it "
        "quantized (nvfp4-modelopt), but none of its ['weight_scale', 'weight_scale_2', "
        "'input_scale'] is stored" in msg
    )


@pytest.mark.parametrize("scheme", ["nvfp4-modelopt", "nvfp4-compressed-tensors"])
def test_qkv_global_scales_that_differ_are_refused_unless_allowed(
    ckpts: dict[str, Path], tmp_path: Path, scheme: str
) -> None:
    src = ckpts[scheme]
    g = SCHEMES[scheme].role("global_scale")
    assert g is not None
    n = f"{L}0.self_attn.k_proj.{g.suffix}"
    other = np.asarray(tensors(src)[n] * 2, dtype=np.float32)
    d = edited(src, tmp_path / "c", {n: other})
    msg = refused(d)
    assert "layer 0: global scales that must be one value differ" in msg
    assert "--allow-unshared-scales" in msg
    bind(d, allow_unshared_scales=True)  # the flag says otherwise: bound


def test_expert_input_scales_that_differ_across_a_layer_are_refused(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    src = ckpts["nvfp4-modelopt"]
    n = L + "3.mlp.experts.4.down_proj.input_scale"
    msg = refused(edited(src, tmp_path / "c", {n: np.array(0.5, dtype=np.float32)}))
    assert "layer 3: input scales that must be one value differ" in msg
    assert "mlp.experts.4.down_proj.input_scale" in msg


def test_a_quantization_config_no_scheme_describes_is_refused(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    d = copy_with(ckpts["fp8-block"], tmp_path / "c")
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                  "bnb_4bit_quant_type": "nf4"}  # fmt: skip
    (d / "config.json").write_text(json.dumps(cfg))
    msg = refused(d, CheckpointError)
    assert "quantization_config: bitsandbytes, 4-bit, nf4: no scheme in specs/schemes" in msg


def test_compressed_tensors_writes_the_packed_weight_as_weight_packed_and_it_binds_as_the_linear(
    ckpts: dict[str, Path],
) -> None:
    names = CheckpointDir(ckpts["nvfp4-compressed-tensors"]).names()
    assert L + "0.mlp.gate_proj.weight_packed" in names
    assert L + "0.mlp.gate_proj.weight" not in names
    f = bind(ckpts["nvfp4-compressed-tensors"]).fields()
    assert f["layers.0.mlp.gate_up"][1].shape == (2 * GEO["intermediate"], GEO["hidden"] // 2)
    assert f["layers.0.mlp.gate_up_weight_global_scale"][1].shape == (2,)


def _internal(name: str) -> str:
    """The name transformers' own modules give a hub-named tensor (as ModelOpt exports)."""
    for hub, internal in (
        (".self_attn.A_log", ".self_attn.forget_gate.A_log"),
        (".self_attn.dt_bias", ".self_attn.forget_gate.dt_bias"),
        (".self_attn.f_a_proj.", ".self_attn.forget_gate.f_a_proj."),
        (".self_attn.f_b_proj.", ".self_attn.forget_gate.f_b_proj."),
        (".hc_attn_", ".attn_hc."),
        (".hc_ffn_", ".ffn_hc."),
    ):
        if hub in name:
            return name.replace(hub, internal)
    return name


def test_transformers_internal_names_bind_to_the_same_fields_as_the_hub_names(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    src = ckpts["nvfp4-modelopt"]
    hub = tensors(src)
    edit: dict[str, Any] = {n: None for n in hub}
    for n, a in hub.items():
        if n.endswith("self_attn.q_conv1d.weight"):
            fused = [hub[n.replace("q_conv1d", c)] for c in ("q_conv1d", "k_conv1d", "v_conv1d")]
            edit[n.replace("q_conv1d", "conv1d")] = np.concatenate(fused)  # [3Q, 1, K]
        elif not n.endswith(("k_conv1d.weight", "v_conv1d.weight", "q_conv1d.weight")):
            edit[_internal(n)] = a
    d = edited(src, tmp_path / "internal", edit)
    names = CheckpointDir(d).names()
    assert L + "0.self_attn.conv1d.weight" in names and L + "0.attn_hc.fn" in names
    for rank in range(2):
        want = bind(src, tp_size=2, tp_rank=rank).fields()
        got = bind(d, tp_size=2, tp_rank=rank).fields()
        assert want.keys() == got.keys()
        for k, (_, a) in want.items():
            assert got[k][1].tobytes() == a.tobytes(), k


def test_a_name_map_that_would_give_two_tensors_one_name_is_refused(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    src = ckpts["nvfp4-modelopt"]
    a = tensors(src)[L + "0.self_attn.A_log"]
    d = edited(src, tmp_path / "c", {L + "0.self_attn.forget_gate.A_log": a})
    msg = refused(d, CheckpointError)
    assert "self_attn.forget_gate.A_log and layers.0.self_attn.A_log would both be read as" in msg


@pytest.fixture
def fake_cupy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import fake_cupy

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    cp = fake_cupy.install(str(tmp_path))
    to_device = cp.asarray

    def strict(a: Any) -> Any:  # as CuPy: no ml_dtypes extension type (BF16, FP8) on a device
        if np.asarray(a).dtype.kind == "V":
            raise TypeError(f"Unsupported dtype {np.asarray(a).dtype}")
        return to_device(a)

    monkeypatch.setattr(cp, "asarray", strict)
    import specbind.generated.kernels as k

    k.module.cache_clear()
    yield cp
    sys.modules.pop("cupy", None)
    k.module.cache_clear()


def test_packed_weights_and_fp8_scales_reach_the_device_and_come_back_byte_for_byte(
    fake_cupy: Any, ckpts: dict[str, Path]
) -> None:
    path = ckpts["nvfp4-modelopt"]
    kinds = {"moe", "dense"}  # the MLPs: no transform reads a quantized linear there
    host = bind_checkpoint(CheckpointDir(path), TABLE, tp_size=2, progress=False, kinds=kinds)
    backend = backends.get("cupy", importlib.import_module("specbind.generated.kernels"))
    dev = bind_checkpoint(
        CheckpointDir(path), TABLE, tp_size=2, progress=False, kinds=kinds, backend=backend
    )
    on_device = dev.fields()
    assert on_device.keys() == host.fields().keys()
    assert "layers.3.mlp.w13_weight_scale" in on_device
    for name, (rule, want) in host.fields().items():
        got = backend.to_host(on_device[name][1], rule.dtype)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 3), (4, 2)])
def test_plan_of_a_quantized_checkpoint_counts_the_packed_bytes_each_rank_reads(
    ckpts: dict[str, Path], capsys: pytest.CaptureFixture[str], tp: int, ep: int
) -> None:
    from specbind.cli import main

    path = ckpts["nvfp4-modelopt"]
    assert main(["plan", str(path), "--tp-size", str(tp), "--ep-size", str(ep), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["totals"]["sum_rank_bytes"] == rep["totals"]["expected_sum"]
    for row in rep["ranks"]:
        r = bind(path, tp_size=tp, tp_rank=row["tp_rank"], ep_size=ep, ep_rank=row["ep_rank"])
        assert row["bytes"] == r.as_dict()["bytes"], row["tp_rank"]


def test_the_nvfp4_moe_bench_times_only_a_baseline_equal_to_specbind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import quant as bench_quant
    from benchmarks.baselines import nvfp4_moe

    small = {"experts": 6, "hidden": 256, "moe_intermediate": 128}
    scheme = SCHEMES["nvfp4-modelopt"]
    r = bench_quant.run(TABLE, scheme, [1, 2], [3], 1, tmp_path, small)
    by = {(x["tp"], x["ep"]): x for x in r["rows"]}
    assert set(by) == {(1, 1), (2, 1), (1, 3)}
    assert by[(2, 1)]["rank_bytes"] < by[(1, 1)]["rank_bytes"]
    honest = nvfp4_moe.baseline

    def wrong(*a: Any) -> Any:  # down's packed columns in the wrong order
        out = honest(*a)
        out["w2"] = np.ascontiguousarray(out["w2"][:, ::-1])
        return out

    monkeypatch.setattr(nvfp4_moe, "baseline", wrong)
    with pytest.raises(SpecbindError, match="the baseline's w2 differs from specbind's"):
        bench_quant.run(TABLE, scheme, [2], [], 1, tmp_path, small)


def test_compressed_tensors_targets_match_the_module_not_its_packed_weight_name(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    """compressed-tensors stores ``X.weight_packed``; its config names module ``X``. A regex
    target anchored at the module (``re:.*proj$``) must match it, else every packed linear
    would read as excluded and be refused for carrying scales."""
    src = ckpts["nvfp4-compressed-tensors"]
    dest = tmp_path / "anchored"
    shutil.copytree(src, dest)
    config = json.loads((dest / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["targets"] = [
        r"re:.*(proj|mqa|wq_b|wk)$"
    ]
    (dest / "config.json").write_text(json.dumps(config))
    got = bind(dest).fields()
    want = bind(src).fields()
    assert got.keys() == want.keys()
    assert any(rule.dtype == "U8" for rule, _ in got.values()), "packed fields stay packed"


def test_a_stored_weight_shape_that_contradicts_its_packed_weight_is_refused_naming_it(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    """compressed-tensors stores each packed linear's own [O, I] beside it; a shape other
    than the packed words' is refused, on every rank, before a field is made from it."""
    src = ckpts["int-group-compressed-tensors"]
    names = CheckpointDir(src).names()
    n = next(x for x in names if x.endswith("q_proj.weight_shape"))
    good = tensors(src)[n]
    bad = edited(src, tmp_path / "c", {n: np.array([good[0], good[1] + 8], dtype=np.int64)})
    for tp, rank in ((1, 0), (2, 1)):
        msg = refused(bad, tp_size=tp, tp_rank=rank)
        assert f"q_proj.weight_shape is [{good[0]}, {good[1] + 8}]" in msg
        assert f"the linear is [{good[0]}, {good[1]}]" in msg


@pytest.mark.parametrize(
    ("value", "said"),
    [(float("nan"), "a non-finite BF16 scale"), (3e38, "overflows BF16")],
)
def test_an_int_group_scale_that_makes_the_dequant_non_finite_is_refused_naming_it(
    ckpts: dict[str, Path], tmp_path: Path, value: float, said: str
) -> None:
    src = ckpts["int-group-compressed-tensors"]
    n = next(x for x in CheckpointDir(src).names() if x.endswith("o_proj.weight_scale"))
    scale = tensors(src)[n].copy()
    scale[3, 1] = value
    msg = refused(edited(src, tmp_path / "c", {n: scale}))
    assert "o_proj.weight_scale" in msg and said in msg
    assert "[3, 1]" in msg or "element [3, 1]" in msg or "row 3" in msg


@pytest.mark.parametrize(
    "name", ["fp8-channel-compressed-tensors", "int8-channel-compressed-tensors"]
)
def test_a_channel_scale_whose_row_overflows_bf16_is_refused_naming_the_row_and_its_code(
    ckpts: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """One row's scale of 3e38: every code of magnitude 2 or more there times it is past
    BF16's largest (3.39e38), so the dequant is not finite and the bind refuses."""
    src = ckpts[name]
    n = next(x for x in CheckpointDir(src).names() if x.endswith("o_proj.weight_scale"))
    scale = tensors(src)[n].copy()  # [O, 1]
    scale[5, 0] = 3e38
    msg = refused(edited(src, tmp_path / "c", {n: scale}))
    assert "o_proj.weight element [5, " in msg and "overflows BF16" in msg
