"""A tiny Kimi Linear checkpoint, written by transformers' own ``save_pretrained``.

The config is in the hub's form (``linear_attn_config`` with 1-based ``kda_layers`` /
``full_attn_layers``, ``first_k_dense_replace``); transformers derives ``layer_types`` and
``mlp_layer_types`` from it and writes both. Layers: 0 KDA+dense, 1 KDA+MoE, 2 MLA+MoE,
3 KDA+MoE, 4 MLA+MoE. Every tensor is seeded N(0, 0.05) (no init constants); BF16 except what
transformers keeps in F32 (A_log, dt_bias, the router's correction bias).
Sizes are pairwise different where a swap would be silent in shapes: KVL (18) != N + R (20),
N + V (22) != H·KVL; KDA's scan_tile holds at tp 1, 2 and 4 (H = 8, D = 64).
Trap: load with ``dtype=torch.float64`` for a reference, never ``"auto"``: Kimi declares no
``_keep_in_fp32_modules``, so "auto" narrows the F32 A_log, dt_bias and router bias to BF16.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hf_random import load_f64, write_random

CONFIG: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=48,  # X
    intermediate_size=84,  # F (dense layer 0)
    moe_intermediate_size=28,  # Im
    num_hidden_layers=5,
    num_attention_heads=4,  # MLA heads
    num_key_value_heads=4,
    n_shared_experts=2,  # shared intermediate S·Im = 56
    num_local_experts=6,  # E (config.json: num_experts)
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    kv_lora_rank=18,
    q_lora_rank=None,
    qk_nope_head_dim=12,
    qk_rope_head_dim=8,
    v_head_dim=10,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
    linear_attn_config=dict(
        head_dim=64,
        num_heads=8,
        short_conv_kernel_size=4,
        kda_layers=[1, 2, 4],
        full_attn_layers=[3, 5],
    ),
    first_k_dense_replace=1,
)
MLA_LAYERS = (2, 4)
KDA_LAYERS = (0, 1, 3)
SPARSE_LAYERS = (1, 2, 3, 4)
# transformers' in-memory names of the tensors it keeps in F32
_F32 = re.compile(r".*\.(forget_gate\.(A_log|dt_bias)|gate\.e_score_correction_bias)")


def write_kimi_checkpoint(path: Path, seed: int = 0) -> None:
    import transformers

    write_random(
        transformers.KimiLinearForCausalLM, transformers.KimiLinearConfig, CONFIG, path, _F32, seed
    )


def load_kimi_model(path: Path) -> Any:
    import transformers

    return load_f64(transformers.KimiLinearForCausalLM, path)
