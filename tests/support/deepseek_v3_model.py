"""A tiny DeepSeek-V3 checkpoint, written by transformers' own ``save_pretrained``.

Layers 0 and 1 dense, 2 and 3 MoE (6 routed experts in 2 groups, 1 shared); every layer MLA
with a low-rank query and RoPE, no indexer. transformers writes no MTP layer although its
config keeps ``num_nextn_predict_layers: 1``; ``topk_method``/``scoring_func`` are written as
the hub's config.json has them (what vLLM's DeepSeek loader reads). Every tensor is seeded
N(0, 0.05); BF16 except the router's correction bias (F32, as transformers keeps it). No two
geometry sizes are equal (specs/models/deepseek-v3.yaml's synth.tiny): kv_lora_rank (26) !=
nope + rope (22), nope + v (32) != heads·kv_lora_rank (104), q_lora_rank (34) != kv_lora_rank.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hf_random import load_f64, write_random

CONFIG: dict[str, Any] = dict(
    vocab_size=136,
    hidden_size=60,
    intermediate_size=88,
    moe_intermediate_size=20,
    num_hidden_layers=4,
    first_k_dense_replace=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=6,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    q_lora_rank=34,
    kv_lora_rank=26,
    qk_nope_head_dim=14,
    qk_rope_head_dim=8,
    v_head_dim=18,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    pad_token_id=0,
    tie_word_embeddings=False,
)
SPARSE_LAYERS = (2, 3)
_F32 = re.compile(r".*\.gate\.e_score_correction_bias")


def write_deepseek_v3_checkpoint(path: Path, seed: int = 0) -> None:
    import transformers

    write_random(
        transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config, CONFIG, path, _F32, seed
    )


def load_deepseek_v3_model(path: Path) -> Any:
    import transformers

    return load_f64(transformers.DeepseekV3ForCausalLM, path)
