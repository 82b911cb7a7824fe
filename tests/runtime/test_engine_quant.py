"""Quantized checkpoints bound for an engine (``bind_for_engine``, what ``load_format="specbind"``
binds on each vLLM rank), on real llm-compressor checkpoints
(tests/support/vllm_quant_checkpoints.py), without vLLM.

Claims:
- each quantized linear's field fills ``<module>.weight`` with its codes as stored (F8_E4M3,
  I8) and ``<module>.weight_scale`` with this rank's F32 channel scales, the stored BF16 rows
  widened exactly: a fused q/k/v or gate/up rank holds each partner's rows of its share, a
  row-parallel rank the whole; the rank's codes times its scales are the rows and columns of
  the dequantized linear that rank computes with;
- a scheme vLLM-CPU cannot load (static per-tensor FP8) is refused before any read, by the bind
  and by the check before vLLM builds the model, with the measured reason;
- a companion the engine's scheme layout refuses (a static ``input_scale``), a scheme with no
  scheme layout for the engine, and a tp its proof does not cover are refused in one line; a
  model the proof does not cover binds with a warning;
- the KV-cache scale parameters vLLM makes for a quantized model are the ones ``fill`` may
  leave as made; any other unfilled parameter is still refused.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specbind.core.errors import BindError
from specbind.engine import bind_for_engine

pytestmark = pytest.mark.interop

LINEARS = {  # vLLM module -> (checkpoint partners, column-parallel)
    "self_attn.qkv_proj": (("q_proj", "k_proj", "v_proj"), True, "self_attn"),
    "self_attn.o_proj": (("o_proj",), False, "self_attn"),
    "mlp.gate_up_proj": (("gate_proj", "up_proj"), True, "mlp"),
    "mlp.down_proj": (("down_proj",), False, "mlp"),
}


@pytest.fixture(scope="module")
def ckpts() -> dict[str, Path]:
    if importlib.util.find_spec("llmcompressor") is None:
        pytest.skip("llm-compressor is not installed (it writes the checkpoints)")
    import vllm_quant_checkpoints

    return vllm_quant_checkpoints.written(("qwen3_fp8_dynamic", "qwen3_w8a8", "qwen3_fp8"))


@pytest.mark.parametrize("recipe", ["qwen3_fp8_dynamic", "qwen3_w8a8"])
@pytest.mark.parametrize(("tp", "rank"), [(1, 0), (2, 0), (2, 1)])
def test_each_quantized_linear_binds_as_its_codes_and_this_ranks_f32_channel_scales(
    ckpts: dict[str, Path], recipe: str, tp: int, rank: int
) -> None:
    torch = pytest.importorskip("torch")
    from safetensors import safe_open

    path = ckpts[recipe]
    out = bind_for_engine(path, "vllm", tp_size=tp, tp_rank=rank)
    code = "F8_E4M3" if "fp8" in recipe else "I8"
    with safe_open(str(next(path.glob("*.safetensors"))), "pt") as f:
        stored = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118
        for layer in (0, 1):
            for module, (partners, column, parent) in LINEARS.items():
                stem = f"model.layers.{layer}.{module}"
                w, s = out[f"{stem}.weight"], out[f"{stem}.weight_scale"]
                assert (w.dtype, s.dtype) == (code, "F32"), (stem, w.dtype, s.dtype)
                scales, codes = [], []
                for p in partners:
                    src = f"model.layers.{layer}.{parent}.{p}"
                    full_s = stored[f"{src}.weight_scale"].float().numpy()  # BF16 -> F32
                    full_w = stored[f"{src}.weight"]
                    if column:  # each partner's rows split (2 KV heads: one per rank)
                        n = full_s.shape[0] // tp
                        scales.append(full_s[rank * n : (rank + 1) * n])
                        codes.append(full_w[rank * n : (rank + 1) * n])
                    else:
                        n = full_w.shape[1] // tp
                        scales.append(full_s)
                        codes.append(full_w[:, rank * n : (rank + 1) * n])
                want_s = np.concatenate(scales)
                got_s = np.asarray(s.array)
                assert got_s.dtype == np.float32 and got_s.tobytes() == want_s.tobytes(), stem
                want_w = torch.cat(codes)
                got_w = np.asarray(w.array)
                assert got_w.tobytes() == want_w.view(torch.uint8).numpy().tobytes(), stem


def test_a_static_fp8_checkpoint_is_refused_before_any_read_with_vllms_measured_reason(
    ckpts: dict[str, Path],
) -> None:
    from specbind.engine_check import check_before_build

    for refuse in (
        lambda: bind_for_engine(ckpts["qwen3_fp8"], "vllm"),
        lambda: check_before_build(ckpts["qwen3_fp8"], "vllm"),
    ):
        with pytest.raises(BindError) as e:
            refuse()
        msg = str(e.value)
        assert "\n" not in msg and "vllm cannot load fp8-tensor-compressed-tensors" in msg, msg
        assert "_C::static_scaled_fp8_quant()" in msg, msg


def test_an_fp8_channel_checkpoint_with_static_inputs_is_refused_naming_input_scale(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    src = ckpts["qwen3_fp8_dynamic"]
    dst = tmp_path / "static"
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "config.json":
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    inputs = config["quantization_config"]["config_groups"]["group_0"]["input_activations"]
    inputs.update(dynamic=False, strategy="tensor")
    (dst / "config.json").write_text(json.dumps(config))
    with pytest.raises(BindError) as e:
        bind_for_engine(dst, "vllm")
    msg = str(e.value)
    assert "stores input_scale, which vllm does not serve" in msg and "\n" not in msg, msg


def test_a_scheme_with_no_vllm_scheme_layout_is_refused_in_one_line(
    ckpts: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from specbind.generated import engines

    monkeypatch.delitem(engines.SCHEMES, ("vllm", "int8-channel-compressed-tensors"))
    with pytest.raises(BindError) as e:
        bind_for_engine(ckpts["qwen3_w8a8"], "vllm")
    msg = str(e.value)
    assert "quantized as int8-channel-compressed-tensors, which no vllm scheme layout" in msg
    assert "specs/engines/vllm/schemes/int8-channel-compressed-tensors.yaml" in msg, msg


def test_a_tp_the_scheme_proof_does_not_cover_is_refused_and_a_model_it_does_not_warns(
    ckpts: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from specbind.generated import engines

    key = ("vllm", "fp8-channel-compressed-tensors")
    monkeypatch.setitem(engines.SCHEMES, key, engines.SCHEMES[key] | {"tp": (1,)})
    with pytest.raises(BindError) as e:
        bind_for_engine(ckpts["qwen3_fp8_dynamic"], "vllm", tp_size=2, tp_rank=0)
    assert "proven at tp 1 only" in str(e.value), e.value
    monkeypatch.setitem(engines.SCHEMES, key, engines.SCHEMES[key] | {"models": ("llama",)})
    with caplog.at_level(logging.WARNING, logger="specbind.engine"):
        bind_for_engine(ckpts["qwen3_fp8_dynamic"], "vllm")
    assert any("unproven in vllm" in r.getMessage() for r in caplog.records), caplog.text


def test_only_the_kv_cache_scales_vllm_makes_may_be_left_unfilled(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    from specbind.engine import fill
    from specbind.engine_quant import made_by_engine

    path = ckpts["qwen3_w8a8"]
    fields = bind_for_engine(path, "vllm")
    params = {n: torch.empty(tuple(f.array.shape), dtype=_torch(torch, f.dtype))
              for n, f in fields.items()}  # fmt: skip
    kv = [f"model.layers.{i}.self_attn.attn.{k}" for i in (0, 1)
          for k in ("k_scale", "v_scale", "q_scale", "k_zero_point")]  # fmt: skip
    params |= {n: torch.ones(1) for n in kv}
    stray = "model.layers.0.self_attn.attn.prob_scale"  # not one compressed-tensors makes
    left = made_by_engine("vllm", path, [*params, stray])
    assert left == set(kv)
    assert fill("vllm", params, fields, left=left) > 0
    with pytest.raises(BindError, match="is filled by no bound field"):
        fill("vllm", params | {stray: torch.ones(1)}, fields, left=left)
    plain = tmp_path / "plain"
    shutil.copytree(path, plain)
    config = json.loads((plain / "config.json").read_text())
    del config["quantization_config"]
    (plain / "config.json").write_text(json.dumps(config))
    assert made_by_engine("vllm", plain, params) == frozenset()


def _torch(torch: Any, dtype: str) -> Any:
    from specbind.engine import TORCH_DTYPES

    return getattr(torch, TORCH_DTYPES[dtype])


def test_a_companion_named_as_another_fields_parameter_is_refused_not_filled_twice(
    ckpts: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from specbind import engine_quant

    def one_name(self: Any, param: str) -> dict[str, str]:
        return {c.suffix: param for c in self.companions}  # every companion on the weight

    monkeypatch.setattr(engine_quant.EngineScheme, "engine_names", one_name)
    with pytest.raises(BindError) as e:
        bind_for_engine(ckpts["qwen3_w8a8"], "vllm")
    assert "would be filled by both" in str(e.value) and "qkv_proj_weight_scale" in str(e.value)


def test_the_parameters_vllm_makes_itself_are_never_donated_to_the_bind(
    ckpts: dict[str, Path],
) -> None:
    torch = pytest.importorskip("torch")
    from specbind.engine_quant import made_by_engine
    from specbind.vllm_loader import donors

    params = {"model.layers.0.self_attn.qkv_proj.weight_scale": torch.ones(256, 1)}
    params |= {f"model.layers.0.self_attn.attn.{k}": torch.ones(1) for k in ("k_scale", "v_scale")}
    left = made_by_engine("vllm", ckpts["qwen3_w8a8"], params)
    given = {int(a.ctypes.data) for a in donors(params, keep=left)}
    assert given == {params["model.layers.0.self_attn.qkv_proj.weight_scale"].data_ptr()}


def test_quantized_stacked_experts_are_refused_for_vllm_naming_the_field(tmp_path: Path) -> None:
    """specbind's own synth writes the Qwen3-MoE checkpoint (llm-compressor 0.14 cannot write a
    MoE family here); made weight-only, as FP8_DYNAMIC is, by dropping its static input scales."""
    import subprocess
    import sys

    pytest.importorskip("torch")  # safetensors.torch
    from safetensors.torch import load_file, save_file

    out = tmp_path / "moe"
    subprocess.run(
        [sys.executable, "-m", "specbind", "synth", str(out), "--model", "qwen3-moe",
         "--quant", "fp8-channel-compressed-tensors", "--tiny"],
        check=True, capture_output=True,
    )  # fmt: skip
    index = json.loads((out / "model.safetensors.index.json").read_text())
    for f in sorted(out.glob("*.safetensors")):
        kept = {n: t for n, t in load_file(f).items() if not n.endswith(".input_scale")}
        save_file(kept, f, metadata={"format": "pt"})
    index["weight_map"] = {n: f for n, f in index["weight_map"].items()
                           if not n.endswith(".input_scale")}  # fmt: skip
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    config = json.loads((out / "config.json").read_text())
    for group in config["quantization_config"]["config_groups"].values():
        group["input_activations"] = None
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(BindError) as e:
        bind_for_engine(out, "vllm")
    msg = str(e.value)
    assert "moe.w13 is stored as fp8-channel-compressed-tensors" in msg, msg
    assert "stacks it as experts" in msg and "\n" not in msg, msg
