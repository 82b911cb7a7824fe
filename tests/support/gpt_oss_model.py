"""A tiny gpt-oss checkpoint, written by transformers' own ``GptOssForCausalLM.save_pretrained``.

Every tensor is seeded N(0, 0.05), BF16 (gpt-oss keeps nothing in F32). Sizes are pairwise
different: hidden 64, vocab 160, heads 8, kv_heads 2, head_dim 12, experts 6, expert
intermediate 128 (whole 32-element MXFP4 groups at tp 1, 2 and 4). Layers alternate sliding and
full attention (config.json ``layer_types``). Only tp 1 and 2 split the 2 KV heads (a tp above
them needs KV replication, which this spec does not declare).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hf_random import load_f64, write_random

CONFIG: dict[str, Any] = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=128,
    head_dim=12,
    num_attention_heads=8,
    num_key_value_heads=2,
    num_local_experts=6,
    num_experts_per_tok=2,
    num_hidden_layers=2,
    tie_word_embeddings=False,
)
_NONE = re.compile(r"(?!)")  # no tensor is kept in F32


def write_gpt_oss_checkpoint(path: Path, seed: int = 0) -> None:
    import transformers

    write_random(
        transformers.GptOssForCausalLM, transformers.GptOssConfig, CONFIG, path, _NONE, seed
    )


def load_gpt_oss_model(path: Path) -> Any:
    import transformers

    return load_f64(transformers.GptOssForCausalLM, path)


# E2M1 magnitudes by code (OCP Microscaling Formats v1.0, table 5); codes 8..15 are negative.
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def quantize_mxfp4(w: Any) -> tuple[Any, Any]:
    """``w [..., O, I]`` (F32 values) as the hub's MXFP4 ``blocks [..., O, I/32, 16]`` and
    E8M0 ``scales [..., O, I/32]``, by the OCP MX v1.0 recipe (section 6.3): per block of 32,
    the shared exponent is ``floor(log2(amax)) - 2`` (2: E2M1's largest exponent), each
    element ``w / 2^exp`` rounded to the nearest E2M1 value (ties to the even code), clamped
    to ±6; byte j holds element 2j in its low nibble. Hand-written: no installed library
    writes this layout on a CPU."""
    import numpy as np

    *lead, o, i = w.shape
    blocks32 = w.reshape(*lead, o, i // 32, 32).astype(np.float64)  # [..., O, I/32, 32]
    amax = np.abs(blocks32).max(axis=-1)
    with np.errstate(divide="ignore"):
        exp = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2, -127)
    exp = np.clip(exp, -127, 127)
    scaled = blocks32 / np.exp2(exp)[..., None]
    mags = np.array(E2M1)
    dist = np.abs(np.abs(scaled)[..., None] - mags)  # nearest magnitude; argmin takes the
    code = dist.argmin(axis=-1)  # lower code on a tie, which is the even one here
    code = np.where(np.abs(scaled) > 6, 7, code) + 8 * (scaled < 0)
    code = code.astype(np.uint8).reshape(*lead, o, i // 32, 16, 2)
    blocks = code[..., 0] | (code[..., 1] << 4)  # [..., O, I/32, 16]
    return blocks.astype(np.uint8), (exp + 127).astype(np.uint8)


def write_mxfp4_checkpoint(bf16: Path, out: Path) -> None:
    """The BF16 checkpoint at ``bf16`` in gpt-oss's hub MXFP4 layout: each layer's
    ``experts.gate_up_proj [E, X, 2I]`` and ``down_proj [E, I, X]`` stored transposed to
    ``[E, O, I]`` as ``<param>_blocks`` and ``<param>_scales``; everything else as it was;
    config.json's ``quantization_config`` as the hub's."""
    import json
    import shutil

    import numpy as np
    from whole_model import read_checkpoint, write_safetensors

    out.mkdir()
    tensors = {}
    for name, a in read_checkpoint(bf16).items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            w = a.astype(np.float32).transpose(0, 2, 1)  # [E, I, O] -> [E, O, I]
            tensors[name + "_blocks"], tensors[name + "_scales"] = quantize_mxfp4(w)
        else:
            tensors[name] = a
    write_safetensors(out / "model.safetensors", tensors)
    config = json.loads((bf16 / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head",
        ],
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    for extra in bf16.glob("generation_config.json"):
        shutil.copy(extra, out / extra.name)
