"""Tiny checkpoints that vLLM's CPU build runs, written by transformers' own classes.

DeepSeek-V3: the CPU MLA kernel takes only kv_lora_rank 512 and qk_rope_head_dim 64; vLLM's
DeepSeek loader reads the router's correction bias only with ``topk_method: noaux_tc`` and
``scoring_func: sigmoid`` in config.json, which transformers does not write (added here).
Other sizes are pairwise different where a swap would be silent in shapes. The vocabularies
(216 and 200) are not multiples of 64: vLLM pads them to 256 (DEFAULT_VOCAB_PADDING_SIZE) and
splits the padded rows, so rank 0 of tp 2 holds rows [0, 128), not an unpadded [0, 108), and
the parameter-identity claims cover the layouts' padded splits.

The bad checkpoints are copies with one change: one routed expert's tensor removed, or one
BF16 tensor cast to F32 (a value-preserving cast that a strict binder must still refuse).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from hf_random import write_random

DEEPSEEK_V3: dict[str, Any] = dict(
    vocab_size=216,
    hidden_size=96,
    intermediate_size=80,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    q_lora_rank=48,
    kv_lora_rank=512,
    qk_nope_head_dim=16,
    qk_rope_head_dim=64,
    v_head_dim=28,
    max_position_embeddings=128,
    pad_token_id=0,
    tie_word_embeddings=False,
)
# Llama and Qwen3-MoE: head_dim 32 (the CPU attention backend takes 32, 64, 80, ...), two KV
# heads of four query heads (GQA: at tp 2 each rank holds one KV head).
LLAMA: dict[str, Any] = dict(
    vocab_size=200,
    hidden_size=96,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    pad_token_id=0,
    tie_word_embeddings=False,
)
QWEN3_MOE: dict[str, Any] = LLAMA | dict(
    moe_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    rms_norm_eps=1e-6,
)
_DEEPSEEK_F32 = re.compile(r".*\.gate\.e_score_correction_bias")
_NOTHING = re.compile(r"(?!)")


def write_deepseek_v3(path: Path, seed: int = 0) -> None:
    import transformers

    write_random(
        transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config, DEEPSEEK_V3, path,
        _DEEPSEEK_F32, seed,
    )  # fmt: skip
    config = json.loads((path / "config.json").read_text())
    config.update(topk_method="noaux_tc", scoring_func="sigmoid")
    (path / "config.json").write_text(json.dumps(config, indent=2))


def write_llama(path: Path, seed: int = 0) -> None:
    import transformers

    write_random(
        transformers.LlamaForCausalLM, transformers.LlamaConfig, LLAMA, path, _NOTHING, seed
    )


def write_qwen3_moe(path: Path, seed: int = 0) -> None:
    import transformers

    write_random(
        transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig, QWEN3_MOE, path,
        _NOTHING, seed,
    )  # fmt: skip


WRITERS = {"deepseek-v3": write_deepseek_v3, "llama": write_llama, "qwen3-moe": write_qwen3_moe}


def without_tensor(src: Path, dst: Path, name: str) -> None:
    """A copy of the checkpoint at ``src`` with tensor ``name`` left out."""
    _rewrite(src, dst, lambda n, t: None if n == name else t)


def with_cast(src: Path, dst: Path, name: str, dtype: Any) -> None:
    """A copy with tensor ``name`` stored as ``dtype`` (same values)."""
    _rewrite(src, dst, lambda n, t: t.to(dtype) if n == name else t)


def _rewrite(src: Path, dst: Path, change: Any) -> None:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    files = sorted(dst.glob("*.safetensors"))
    if (dst / "model.safetensors.index.json").exists():
        raise AssertionError("the tiny checkpoints are one file")
    (f,) = files
    tensors = load_file(f)
    out = {n: t2 for n, t in tensors.items() if (t2 := change(n, t)) is not None}
    if out.keys() == tensors.keys() and all(out[n] is tensors[n] for n in out):
        raise AssertionError("the change touched no tensor")
    save_file(out, f, metadata={"format": "pt"})
