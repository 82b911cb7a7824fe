"""A tiny DeepSeek-V3.2 checkpoint, written by transformers' own ``save_pretrained``.

Layers 0 and 1 dense, 2 and 3 MoE (6 routed experts in 2 groups, 1 shared); every layer MLA
with RoPE (qk_rope_head_dim 8) plus the indexer. transformers writes no MTP layer although
config.json keeps num_nextn_predict_layers. Every tensor is seeded N(0, 0.05) (no init
constants); BF16 except what transformers keeps F32 (the router bias, indexer.weights_proj).
Sizes are pairwise different where a swap would be silent in shapes: KVL (18) != N + R (20),
N + V (22) != H·KVL (72); ID (16) >= R (8), as the indexer's rope needs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hf_random import load_f64, write_random

CONFIG: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=56,
    intermediate_size=92,
    moe_intermediate_size=24,
    num_hidden_layers=4,
    first_k_dense_replace=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=6,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    q_lora_rank=36,
    kv_lora_rank=18,
    qk_nope_head_dim=12,
    qk_rope_head_dim=8,
    v_head_dim=10,
    index_n_heads=3,
    index_head_dim=16,
    index_topk=4,
    num_nextn_predict_layers=1,
    pad_token_id=0,
    tie_word_embeddings=False,
)
SPARSE_LAYERS = (2, 3)
_F32 = re.compile(r".*\.(gate\.e_score_correction_bias|indexer\.weights_proj\.weight)")


def write_deepseek_checkpoint(path: Path, seed: int = 0) -> None:
    import transformers

    write_random(
        transformers.DeepseekV32ForCausalLM,
        transformers.DeepseekV32Config,
        CONFIG,
        path,
        _F32,
        seed,
    )


def load_deepseek_model(path: Path) -> Any:
    import transformers

    return load_f64(transformers.DeepseekV32ForCausalLM, path)
