"""A refusal names what the user can find in the checkpoint: every tensor by its full stored
name (a renamed one with the specs' name beside it, ``read as``); a fault inside a fused or
stacked stored tensor (a name map's ``sections``/``segments``/``unstack``) by the stored
tensor and the stored coordinates; a missing tensor as this checkpoint would store it; a
required group a layer lacks by its tensors, not only the group's name. Tiny synthesized
checkpoints (some under their writers' names, ``stored_names``), bound in-process. The sweep
over every family is ``test_refusals_name_stored_tensors``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import refusal_cases as rc
from helpers import copy_with, read_file
from stored_names import stored_checkpoint

from specbind.core.errors import SpecbindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import ReportOnly, bind_checkpoint
from specbind.runtime.binder.checks import Stored
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth, tiny_values


def _synth(model: str, out: Path, mtp: bool = True) -> dict[str, np.ndarray]:
    table = MODELS[model]
    synth(table, out, tiny_values(table), layers=2, seed=1, mtp=mtp)
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(out.glob("*.safetensors")):
        tensors |= read_file(f)
    return tensors


def _refusal(model: str, ckpt: Path) -> str:
    with pytest.raises(SpecbindError) as e:
        bind_checkpoint(CheckpointDir(ckpt), MODELS[model], progress=False, sink=ReportOnly())
    return str(e.value)


def test_an_inexact_value_inside_a_fused_conv1d_is_named_at_its_stored_tensor_and_row(
    tmp_path: Path,
) -> None:
    t = _synth("nemotron-h", tmp_path / "ck")
    layer = next(k for k in t if k.endswith("mixer.conv1d_x.weight")).split("mixer.")[0]
    parts = [t[f"{layer}mixer.conv1d_{s}.weight"].astype(np.float32) for s in "xBC"]
    fused = np.concatenate(parts)
    row = parts[0].shape[0] + 5  # row 5 of the B section: no two section sizes make it
    fused[row, 0, 1] = 0.1  # not a BF16 value
    edit: dict[str, object] = {f"{layer}mixer.conv1d_{s}.weight": None for s in "xBC"}
    bad = copy_with(
        tmp_path / "ck", tmp_path / "bad", edit | {f"{layer}mixer.conv1d.weight": fused}
    )
    msg = _refusal("nemotron-h", bad)
    assert "mixer.conv1d.weight (its rows from" in msg, msg
    assert f"would change element [{row}, 0, 1]" in msg, msg
    assert "read as mixer.conv1d_B.weight" in msg, "the section is named beside the stored name"


def test_a_wrong_dtype_inside_phi3s_fused_qkv_proj_names_qkv_proj(tmp_path: Path) -> None:
    t = _synth("phi3", tmp_path / "ck")
    qkv = np.concatenate(
        [t[f"layers.1.self_attn.{p}_proj.weight"].astype(np.float32) for p in "qkv"]
    )
    edit: dict[str, object] = {f"layers.1.self_attn.{p}_proj.weight": None for p in "qkv"}
    edit["layers.1.self_attn.qkv_proj.weight"] = qkv
    msg = _refusal("phi3", copy_with(tmp_path / "ck", tmp_path / "bad", edit))
    assert msg.startswith("layer 1: layers.1.self_attn.qkv_proj.weight (its rows from 0 of "
                          f"{list(qkv.shape)}, read as self_attn.q_proj.weight) is F32"), msg  # fmt: skip


def test_a_missing_router_correction_bias_is_named_by_the_tensor(tmp_path: Path) -> None:
    t = _synth("deepseek-v3", tmp_path / "ck", mtp=False)
    gone = next(k for k in t if k.endswith("e_score_correction_bias"))
    bad = copy_with(tmp_path / "ck", tmp_path / "bad", {gone: None})
    msg = _refusal("deepseek-v3", bad)
    relative = gone.split(".", 2)[2]  # layers.N.<this>
    assert "missing" in msg and relative in msg and "correction" in msg, msg


def test_a_head_dim_that_does_not_divide_names_the_tensors_the_stored_one_and_the_fields(
    tmp_path: Path,
) -> None:
    """Phi-3 with 7 heads of a 96-wide model: ``head_dim = hidden / heads`` has a remainder.
    The refusal names the block's symbol and expression, the tensors it sizes, the stored
    tensor they are sections of, and the config.json fields it read, not ``96 / 7 is not
    exact`` alone."""
    _synth("phi3", tmp_path / "ck")
    config = tmp_path / "ck" / "config.json"
    values = json.loads(config.read_text())
    config.write_text(json.dumps(values | {"num_attention_heads": 7, "num_key_value_heads": 7}))
    msg = _refusal("phi3", tmp_path / "ck")
    assert msg.startswith("gqa_attention: head_dim = hidden / heads cannot be computed for "), msg
    assert "heads=7, hidden=96 (96 / 7 is not exact (remainder 5))" in msg, msg
    assert "it sizes self_attn.q_proj.weight, self_attn.k_proj.weight" in msg, msg
    assert "stored as sections of self_attn.qkv_proj.weight" in msg, msg
    assert "heads is config.json num_attention_heads" in msg, msg
    assert "hidden is config.json hidden_size" in msg, msg


# --- checkpoints under their writers' names (stored_names): every refusal names the stored
# tensor in full, the specs' name only beside it ---------------------------------------------


def _stored(model: str, out: Path) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    tensors = stored_checkpoint(MODELS[model], out)
    return tensors, json.loads((out / "config.json").read_text())


def test_a_wrong_dtype_in_a_mixtral_expert_names_its_w1_not_the_specs_gate_proj(
    tmp_path: Path,
) -> None:
    t, cfg = _stored("mixtral", tmp_path / "ck")
    w1 = "model.layers.1.block_sparse_moe.experts.4.w1.weight"
    rc.write(t | {w1: t[w1].astype(np.float32)}, tmp_path / "bad", cfg)
    msg = _refusal("mixtral", tmp_path / "bad")
    assert msg.startswith(
        f"layer 1: {w1} (read as mlp.experts.4.gate_proj.weight) is F32 but a moe block "
        "requires BF16"
    ), msg


def test_a_missing_mixtral_expert_is_named_as_its_siblings_are_stored(tmp_path: Path) -> None:
    t, cfg = _stored("mixtral", tmp_path / "ck")
    gone = "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    rc.write({k: v for k, v in t.items() if k != gone}, tmp_path / "bad", cfg)
    assert _refusal("mixtral", tmp_path / "bad") == (
        f"layer 1: missing {gone} (a moe block requires it)"
    )


def test_a_hunyuan_layer_without_its_query_layernorm_names_it_and_no_other_family(
    tmp_path: Path,
) -> None:
    """HunYuan reads Qwen3's attention block; the refusal names HunYuan's stored norms and
    quotes no note written for Qwen3."""
    t, cfg = _stored("hunyuan-dense", tmp_path / "ck")
    gone = "model.layers.1.self_attn.query_layernorm.weight"
    rc.write({k: v for k, v in t.items() if k != gone}, tmp_path / "bad", cfg)
    msg = _refusal("hunyuan-dense", tmp_path / "bad")
    assert msg == (
        f"layer 1: partial qk_norm group in a gqa block: missing ['{gone}'] while "
        "['model.layers.1.self_attn.key_layernorm.weight'] is stored — the group's 2 tensors "
        "are stored all together or not at all"
    ), msg
    assert "qwen" not in msg.lower() and "q_norm" not in msg


def test_a_wrong_dtype_in_a_stacked_tensor_is_named_at_its_member_and_rows(
    tmp_path: Path,
) -> None:
    """GraniteMoE's input_linear [E, 2I, X] is read member by member as [gate_i; up_i]: the
    refusal names the stored tensor, the member and rows it reads first, and its shape."""
    t, cfg = _stored("granitemoe", tmp_path / "ck")
    name = "model.layers.1.block_sparse_moe.input_linear.weight"
    a = t[name].astype(np.float32)
    rc.write(t | {name: a}, tmp_path / "bad", cfg)
    msg = _refusal("granitemoe", tmp_path / "bad")
    assert msg.startswith(
        f"layer 1: {name} (member 0, its rows from 0 of {list(a.shape)}, read as "
        "mlp.experts.0.gate_proj.weight) is F32 but a moe block requires BF16"
    ), msg


def test_an_element_of_a_member_is_named_in_the_stored_tensors_coordinates() -> None:
    """Row r, column c of member 2's up section (rows from I of each member) is element
    [2, I + r, c] of the stored [E, 2I, X]; a section's rows add its first row."""
    assert Stored("w", "up", member=2, row=16).index((3, 5)) == [2, 19, 5]
    assert Stored("w", "k", row=64).index((1, 0, 2)) == [65, 0, 2]
    assert Stored("w").index((1, 0)) == [1, 0]


def test_a_missing_fused_tensor_is_named_whole_as_the_checkpoint_stores_it(
    tmp_path: Path,
) -> None:
    t, cfg = _stored("falcon", tmp_path / "ck")
    gone = "transformer.h.1.self_attention.query_key_value.weight"
    rc.write({k: v for k, v in t.items() if k != gone}, tmp_path / "bad", cfg)
    msg = _refusal("falcon", tmp_path / "bad")
    assert msg.startswith("layer 1: no attention block of falcon matches its names; "), msg
    assert f"missing ['{gone}']" in msg, msg


def test_an_audit_of_a_renamed_tensor_names_it_as_stored(tmp_path: Path) -> None:
    from specbind.audit import audit

    t, cfg = _stored("gpt-neox", tmp_path / "ck")
    name = "gpt_neox.layers.1.mlp.dense_4h_to_h.weight"
    rc.write(t | {name: t[name].astype(np.float64)}, tmp_path / "bad", cfg)
    rep = audit(CheckpointDir(tmp_path / "bad"), MODELS["gpt-neox"], progress=False)
    assert rep["problems"] == [
        f"layer 1: mlp (fc_mlp): 1 of a dtype the block refuses: ['{name} (F64)']"
    ], rep["problems"]


def test_a_layer_missing_one_tensor_of_a_variant_is_told_which(tmp_path: Path) -> None:
    """StableLM without one q bias: config.json's use_qkv_bias says the layer is a gqa_bias
    attention, its tensors say gqa; the refusal names the stored tensor that decides it."""
    t, cfg = _stored("stablelm", tmp_path / "ck")
    gone = "model.layers.1.self_attn.q_proj.bias"
    rc.write({k: v for k, v in t.items() if k != gone}, tmp_path / "bad", cfg)
    msg = _refusal("stablelm", tmp_path / "bad")
    assert msg.startswith("layer 1: config.json use_qkv_bias is true (a gqa_bias attention)"), msg
    assert msg.endswith(f"(a gqa_bias attention needs ['{gone}'], absent)"), msg


def test_a_variants_tensors_the_config_turns_off_are_named(tmp_path: Path) -> None:
    """StableLM with use_qkv_bias false over a layer that stores the biases: the refusal
    names the stored biases."""
    t, cfg = _stored("stablelm", tmp_path / "ck")
    rc.write(t, tmp_path / "bad", cfg | {"use_qkv_bias": False})
    msg = _refusal("stablelm", tmp_path / "bad")
    assert "(the layer carries ['model.layers.0.self_attn.k_proj.bias'" in msg, msg
