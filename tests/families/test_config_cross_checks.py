"""Config fields that decide a parameter's shape or presence are read and cross-checked.

Falcon (transformers' FalconForCausalLM writes every checkpoint here): ``multi_query: false``,
``new_decoder_architecture: true``, ``parallel_attn: false`` or ``bias: true`` over the
multi-query tensors the spec reads is refused by ``audit`` and ``bind`` in one line naming the
field (transformers and vLLM would build other parameters from it); an ``ffn_hidden_size``
other than 4 x hidden binds in the default layout as transformers' module holds it, and vLLM's
layout refuses it naming vLLM's FalconMLP. GLM-4.5 MoE written with transformers' default
``attention_bias: false`` binds without q/k/v biases, every attention field equal to the
module's; biases the config denies, or a config that promises biases the file lacks, is
refused naming ``attention_bias``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_rows_dense import FALCON
from family_rows_moe import GLM4_MOE
from family_table import Family
from hf_random import write_random

from specbind.api import open as open_checkpoint
from specbind.core.errors import SpecbindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)


def _write(row: Family, path: Path, config: dict[str, Any]) -> Path:
    write_random(
        getattr(transformers, row.hf_class), getattr(transformers, row.config_class), config,
        path, re.compile(row.f32),
    )  # fmt: skip
    return path


def _refused(path: Path, model: str, fragment: str) -> None:
    """audit (its first problem, or its one-line refusal where reading the stored sections
    needs the geometry first) and bind's one-line error both hold ``fragment``."""
    try:
        problems = open_checkpoint(path).audit()["problems"]
    except SpecbindError as e:
        problems = [str(e)]
    assert problems and fragment in problems[0] and "\n" not in problems[0], problems
    with pytest.raises(SpecbindError) as e:
        bind_checkpoint(CheckpointDir(path), MODELS[model], progress=False)
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


def _edit(path: Path, **changes: Any) -> Path:
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg | changes))
    return path


@pytest.fixture(scope="module")
def falcon(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(FALCON, tmp_path_factory.mktemp("falcon") / "ck", FALCON.config)


@pytest.mark.parametrize(
    ("field", "value"),
    [("multi_query", False), ("new_decoder_architecture", True), ("parallel_attn", False),
     ("bias", True)],
)  # fmt: skip
def test_a_falcon_config_value_over_multi_query_tensors_the_spec_cannot_say_is_refused_naming_it(
    falcon: Path, tmp_path: Path, field: str, value: bool
) -> None:
    import shutil

    path = tmp_path / "ck"
    shutil.copytree(falcon, path)
    _edit(path, **{field: value})
    _refused(path, "falcon", f"config.json: {field} is {json.dumps(value)}, but model falcon binds")


def test_a_falcon_its_class_writes_without_multi_query_is_refused_by_the_field_not_a_shape(
    tmp_path: Path,
) -> None:
    path = _write(FALCON, tmp_path / "mha", FALCON.config | {"multi_query": False})
    _refused(path, "falcon", "config.json: multi_query is false, but model falcon binds")


def test_a_falcon_file_without_the_fields_reads_them_as_falcon_configs_defaults(
    falcon: Path, tmp_path: Path
) -> None:
    import shutil

    path = tmp_path / "ck"
    shutil.copytree(falcon, path)
    cfg = json.loads((path / "config.json").read_text())
    for k in ("multi_query", "new_decoder_architecture", "parallel_attn", "bias"):
        cfg.pop(k, None)
    (path / "config.json").write_text(json.dumps(cfg))
    assert open_checkpoint(path).audit()["problems"] == []
    (path / "config.json").write_text(json.dumps(cfg | {"bias": None}))
    assert open_checkpoint(path).audit()["problems"] == []  # null: FalconConfig's default


def test_a_falcon_mlp_wider_than_four_hidden_binds_as_transformers_holds_it_and_vllm_refuses(
    falcon: Path,
) -> None:
    from specbind.engine import bind_for_engine

    cfg = json.loads((falcon / "config.json").read_text())
    assert cfg["ffn_hidden_size"] != 4 * cfg["hidden_size"]
    module = transformers.FalconForCausalLM.from_pretrained(falcon, dtype=torch.float64)
    up = module.transformer.h[0].mlp.dense_h_to_4h.weight.detach().numpy()
    assert up.shape[0] == cfg["ffn_hidden_size"]
    bound = bind_checkpoint(CheckpointDir(falcon), MODELS["falcon"], progress=False).fields()
    assert np.array_equal(np.asarray(bound["layers.0.mlp.up"][1]).astype(np.float64), up)
    with pytest.raises(SpecbindError) as e:
        bind_for_engine(falcon, "vllm")
    msg = str(e.value)
    assert "\n" not in msg and "mlp_four_hidden" in msg, msg
    assert "vllm/model_executor/models/falcon.py" in msg and "FalconMLP" in msg


def test_a_glm4_moe_written_with_the_default_attention_bias_binds_without_biases(
    tmp_path: Path,
) -> None:
    config = {k: v for k, v in GLM4_MOE.config.items() if k != "attention_bias"}
    path = _write(GLM4_MOE, tmp_path / "nobias", config)
    assert json.loads((path / "config.json").read_text())["attention_bias"] is False
    assert open_checkpoint(path).audit()["problems"] == []
    module = transformers.Glm4MoeForCausalLM.from_pretrained(path, dtype=torch.float64)
    attn = module.model.layers[1].self_attn
    heads = config["num_attention_heads"]
    for tp in (1, 2):
        for r in range(tp):
            fields = bind_checkpoint(
                CheckpointDir(path), MODELS["glm4-moe"], tp_size=tp, tp_rank=r, progress=False
            ).fields()
            got = {k: v for k, v in fields.items() if k.startswith("layers.1.attention.")}
            assert not [k for k in got if k.endswith("_bias")], sorted(got)
            q = attn.q_proj.weight.detach().numpy()
            rows = q.shape[0] // tp
            assert q.shape[0] == heads * config["head_dim"]
            want = q[r * rows : (r + 1) * rows]
            assert np.array_equal(np.asarray(got["layers.1.attention.q_proj"][1]), want)


def test_glm4_moe_biases_the_config_denies_or_promises_are_refused_naming_attention_bias(
    tmp_path: Path,
) -> None:
    with_bias = _write(GLM4_MOE, tmp_path / "b", GLM4_MOE.config | {"attention_bias": True})
    _edit(with_bias, attention_bias=False)
    _refused(with_bias, "glm4-moe", "attention_bias is false")
    config = {k: v for k, v in GLM4_MOE.config.items() if k != "attention_bias"}
    without = _edit(_write(GLM4_MOE, tmp_path / "n", config), attention_bias=True)
    _refused(without, "glm4-moe", "attention_bias is true")
