"""A refusal names what the user can find in the checkpoint: a fault inside a fused stored
tensor (a name map's ``sections``/``segments``) by the stored tensor and the stored
coordinates, the section it is read as beside them; a required group a layer lacks by its
tensors, not only the group's name. Tiny synthesized checkpoints, bound in-process.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import copy_with, read_file

from specbind.core.errors import SpecbindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import ReportOnly, bind_checkpoint
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
    assert msg.startswith("layer 1: self_attn.qkv_proj.weight (its rows from 0, read as "
                          "self_attn.q_proj.weight) is F32"), msg  # fmt: skip


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
