"""A tiny NemotronH checkpoint, written by transformers' own ``save_pretrained``.

Layers (``layers_block_type``): 0 Mamba2, 1 MoE, 2 attention, 3 MLP, 4 Mamba2. Every tensor is
seeded N(0, 0.05); BF16 except the Mamba A_log, D, dt_bias and the router's weight and
correction bias (F32, as the spec binds them). transformers writes the hub names
(``backbone.``, one ``experts.{e}.`` tensor per expert) and keeps ``in_proj`` [z; x; B; C; dt]
and ``conv1d`` [x; B; C] fused.
Sizes are pairwise different (mamba inner = 16·5 = 80, group_state = 8·6 = 48, attention
q = 12·10 = 120, kv = 4·10 = 40), and every shard unit (12 heads, 4 KV heads, 16 Mamba heads,
8 groups, 72 / 20 / 28 intermediate, 136 vocab) divides tp 1, 2 and 4; heads 12 refuse tp 8.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hf_random import load_f64, write_random

CONFIG: dict[str, Any] = dict(
    vocab_size=136,
    hidden_size=56,
    layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "linear_attention"],
    num_attention_heads=12,
    num_key_value_heads=4,
    head_dim=10,
    intermediate_size=72,
    mamba_num_heads=16,
    mamba_head_dim=5,
    n_groups=8,
    ssm_state_size=6,
    conv_kernel=3,
    n_routed_experts=7,
    moe_intermediate_size=20,
    moe_shared_expert_intermediate_size=28,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    tie_word_embeddings=False,
    pad_token_id=0,
)
MAMBA_LAYERS = (0, 4)
MOE_LAYER, ATTENTION_LAYER, MLP_LAYER = 1, 2, 3
# transformers' in-memory names of the tensors written in F32
_F32 = re.compile(r".*\.mixer\.(A_log|D|dt_bias|gate\.weight|gate\.e_score_correction_bias)")


def write_nemotron_h_checkpoint(path: Path, seed: int = 0) -> None:
    import transformers

    write_random(
        transformers.NemotronHForCausalLM, transformers.NemotronHConfig, CONFIG, path, _F32, seed
    )


def load_nemotron_h_model(path: Path) -> Any:
    import transformers

    return load_f64(transformers.NemotronHForCausalLM, path)
