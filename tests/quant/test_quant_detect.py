"""A checkpoint's quantization is read from its whole configuration, never one field: a scheme
matches on every field that tells its family's variants apart, a variant no scheme describes is
refused in one line naming the method and the variant (never read as another variant, never
as unquantized), and a quantization announced only in a side file (``quantize_config.json``,
``quant_config.json``, ``hf_quant_config.json``) is seen, as vLLM's ``get_quant_config``
reads them.

The configs below are what the tools write (llm-compressor 0.14, AutoRound and GPTQModel's
GPTQ and AWQ exports, AutoFP8, ModelOpt), cut to the fields that matter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import TABLE
from safetensors.numpy import save_file

from specbind.core.errors import CheckpointError
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.quant.scheme import detect


def ct_group(weights: dict[str, Any], inputs: dict[str, Any] | None, fmt: str) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": inputs}
        },
    }


W4_ACTORDER_GROUP = {
    "num_bits": 4,
    "type": "int",
    "strategy": "group",
    "group_size": 128,
    "symmetric": False,
    "dynamic": False,
    "actorder": "group",
}
FP8_BLOCK_64 = {
    "num_bits": 8,
    "type": "float",
    "strategy": "block",
    "block_structure": [64, 64],
    "symmetric": True,
    "dynamic": False,
}
INT4_GROUP_NVFP4_FORMAT = {
    "num_bits": 4,
    "type": "int",
    "strategy": "group",
    "group_size": 16,
    "symmetric": True,
    "dynamic": False,
}

# (config.json's quantization_config or None, side files, what the refusal must say)
CASES: dict[str, tuple[Any, dict[str, Any], str]] = {
    "compressed-tensors W4A16 asymmetric with actorder group": (
        ct_group(W4_ACTORDER_GROUP, None, "pack-quantized"),
        {},
        "config.json quantization_config: compressed-tensors pack-quantized, 4-bit int group "
        "128 asymmetric actorder group weights, no input quantization: no scheme in "
        "specs/schemes describes it",
    ),
    "compressed-tensors FP8 in 64 x 64 blocks": (
        ct_group(FP8_BLOCK_64, None, "float-quantized"),
        {},
        "compressed-tensors float-quantized, 8-bit float block [64, 64] symmetric weights",
    ),
    "nvfp4-pack-quantized holding int4 groups": (
        ct_group(INT4_GROUP_NVFP4_FORMAT, None, "nvfp4-pack-quantized"),
        {},
        "compressed-tensors nvfp4-pack-quantized, 4-bit int group 16 symmetric weights",
    ),
    "fp8 in 64 x 64 blocks": (
        {"quant_method": "fp8", "weight_block_size": [64, 64], "activation_scheme": "dynamic"},
        {},
        "fp8, [64, 64] blocks, activation_scheme dynamic: no scheme",
    ),
    "AWQ GEMM in config.json": (
        {
            "quant_method": "awq",
            "bits": 4,
            "group_size": 128,
            "zero_point": True,
            "version": "gemm",
        },
        {},
        "awq, 4-bit group 128 zero_point true, version gemm: no scheme",
    ),
    "GPTQ announced only in quantize_config.json": (
        None,
        {"quantize_config.json": {"bits": 4, "group_size": 128, "desc_act": True, "sym": True}},
        "quantize_config.json: gptq, 4-bit group 128 symmetric desc_act true, "
        "checkpoint_format gptq: no scheme",
    ),
    "AWQ announced only in quant_config.json": (
        None,
        {
            "quant_config.json": {
                "w_bit": 4,
                "q_group_size": 128,
                "zero_point": True,
                "version": "GEMM",
            }
        },
        "quant_config.json: awq, 4-bit group 128 zero_point true, version GEMM: no scheme",
    ),
    "ModelOpt INT4 AWQ in hf_quant_config.json": (
        None,
        {
            "hf_quant_config.json": {
                "quantization": {"quant_algo": "W4A16_AWQ", "exclude_modules": ["lm_head"]}
            }
        },
        "hf_quant_config.json: modelopt, quant_algo W4A16_AWQ: no scheme",
    ),
}


def folder(tmp_path: Path, qc: Any, side: dict[str, Any]) -> CheckpointDir:
    cfg: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    if qc is not None:
        cfg["quantization_config"] = qc
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for name, doc in side.items():
        (tmp_path / name).write_text(json.dumps(doc))
    save_file({"lm_head.weight": np.zeros((2, 2), np.float32)}, str(tmp_path / "model.safetensors"))
    return CheckpointDir(tmp_path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_variant_no_scheme_describes_is_refused_naming_the_method_and_the_variant(
    tmp_path: Path, case: str
) -> None:
    qc, side, said = CASES[case]
    with pytest.raises(CheckpointError) as e:
        detect(folder(tmp_path, qc, side), TABLE.schemes)
    msg = str(e.value)
    assert said in msg
    assert "\n" not in msg
    assert "never bound as another variant or as unquantized" in msg


def test_a_checkpoint_that_announces_no_quantization_is_unquantized(tmp_path: Path) -> None:
    assert detect(folder(tmp_path, None, {}), TABLE.schemes) is None


def test_the_block_fp8_schemes_still_match_their_own_variant(tmp_path: Path) -> None:
    block = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    ct = ct_group(FP8_BLOCK_64 | {"block_structure": [128, 128]}, None, "float-quantized")
    for sub, qc, name in (("a", block, "fp8-block"), ("b", ct, "fp8-block-compressed-tensors")):
        (tmp_path / sub).mkdir()
        q = detect(folder(tmp_path / sub, qc, {}), TABLE.schemes)
        assert q is not None and q.scheme.name == name
