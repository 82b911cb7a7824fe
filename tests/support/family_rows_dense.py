"""Family rows for the dense families (tests/families/test_family_proofs.py collects every
``family_rows_*.py``'s ``ROWS``).

Each config: no two sizes equal (hidden, heads, kv_heads, head_dim, intermediate, vocab, and
the q rows heads·head_dim), 2 layers, 2 KV heads so k/v replicate at tp 4 and 8; vocab
divisible by every tp listed.
"""

from __future__ import annotations

from typing import Any

from family_layouts import (
    GLM4_NORMS,
    GQA,
    GQA_PROJ_NORM,
    HEAD_NORMS,
    INPUT_NORM,
    LLAMA_LAYER,
    LM_GLOBALS,
    POST_NORMS,
    QK_NORM,
    QKV_BIAS,
    SANDWICH_NORMS,
    SWIGLU,
    fused_gate_up,
)
from family_semantics import attention, gathered_attention, swiglu_mlp
from family_table import Family

# Llama-shaped sizes: q rows 96, kv rows 24 (2 x 12), no size repeated.
LLAMA_LIKE: dict[str, Any] = {
    "vocab_size": 112,
    "hidden_size": 40,
    "intermediate_size": 72,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 12,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
}

MISTRAL = Family(
    model="mistral",
    hf_class="MistralForCausalLM",
    config_class="MistralConfig",
    config=LLAMA_LIKE | {"sliding_window": 16},
    layer=LLAMA_LAYER,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    semantics=(attention(), swiglu_mlp()),
)

LLAMA = Family(
    model="llama",
    hf_class="LlamaForCausalLM",
    config_class="LlamaConfig",
    config=LLAMA_LIKE,
    layer=LLAMA_LAYER,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    semantics=(attention(), swiglu_mlp()),
    variants={"tied": {"tie_word_embeddings": True}},
)

# No head_dim in config.json (Qwen2 never writes one): 48 / 8 heads = 6.
NO_HEAD_DIM: dict[str, Any] = {k: v for k, v in LLAMA_LIKE.items() if k != "head_dim"} | {
    "hidden_size": 48
}

QWEN2 = Family(
    model="qwen2",
    hf_class="Qwen2ForCausalLM",
    config_class="Qwen2Config",
    config=NO_HEAD_DIM,
    layer=LLAMA_LAYER | QKV_BIAS,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    semantics=(attention(), swiglu_mlp()),
    variants={"tied": {"tie_word_embeddings": True}},
)

QWEN3 = Family(
    model="qwen3",
    hf_class="Qwen3ForCausalLM",
    config_class="Qwen3Config",
    config=LLAMA_LIKE,
    layer=LLAMA_LAYER | QK_NORM,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    semantics=(attention(qk_norm="head"), swiglu_mlp()),
)

# Gemma: the head tied as released; query_pre_attn_scalar (10) is none of head_dim's sizes,
# so a semantic check that scaled by head_dim**-0.5 instead would fail; soft-capping on.
GEMMA: dict[str, Any] = LLAMA_LIKE | {
    "tie_word_embeddings": True,
    "query_pre_attn_scalar": 10,
    "attn_logit_softcapping": 5.0,
    "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention"],
}

GEMMA2 = Family(
    model="gemma2",
    hf_class="Gemma2ForCausalLM",
    config_class="Gemma2Config",
    config=GEMMA,
    layer=GQA | SWIGLU | SANDWICH_NORMS,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    semantics=(attention(), swiglu_mlp()),
    variants={"untied": {"tie_word_embeddings": False}},
)

GEMMA3_TEXT = Family(
    model="gemma3-text",
    hf_class="Gemma3ForCausalLM",
    config_class="Gemma3TextConfig",
    config=GEMMA | {"attn_logit_softcapping": None},
    layer=GQA | QK_NORM | SWIGLU | SANDWICH_NORMS,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    semantics=(attention(qk_norm="head"), swiglu_mlp()),
)

# The multipliers are none of 1 (and attention_multiplier is not head_dim**-0.5), so a semantic
# check that ignored the module's scaling would fail.
GRANITE = Family(
    model="granite",
    hf_class="GraniteForCausalLM",
    config_class="GraniteConfig",
    config=NO_HEAD_DIM
    | {
        "tie_word_embeddings": True,
        "attention_multiplier": 0.3,
        "embedding_multiplier": 6.0,
        "residual_multiplier": 0.2,
        "logits_scaling": 4.0,
    },
    layer=LLAMA_LAYER,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    semantics=(attention(), swiglu_mlp()),
    variants={"untied": {"tie_word_embeddings": False}},
)

# tp 4 and 8 split each KV head's rows across ranks (kv rows 12: 3 per rank at tp 4), as
# vLLM's Transformers backend does; the semantic check gathers them back.
OLMO2 = Family(
    model="olmo2",
    hf_class="Olmo2ForCausalLM",
    config_class="Olmo2Config",
    config=NO_HEAD_DIM,
    layer=GQA_PROJ_NORM | SWIGLU | POST_NORMS,
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    semantics=(gathered_attention(), swiglu_mlp()),
)

# Command R+'s per-head q/k LayerNorms on; 4 KV heads so every tp listed holds whole KV heads
# (vLLM's commandr cannot load k_norm at tp > kv_heads). Command R without them: a variant.
COHERE = Family(
    model="cohere",
    hf_class="CohereForCausalLM",
    config_class="CohereConfig",
    config=NO_HEAD_DIM
    | {
        "num_key_value_heads": 4,
        "use_qk_norm": True,
        "tie_word_embeddings": True,
        "logit_scale": 0.5,
    },
    layer=GQA | HEAD_NORMS | SWIGLU | INPUT_NORM,
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    semantics=(attention(qk_norm="head"), swiglu_mlp()),
    variants={"command-r": {"use_qk_norm": False}},
)

COHERE2 = Family(
    model="cohere2",
    hf_class="Cohere2ForCausalLM",
    config_class="Cohere2Config",
    config=NO_HEAD_DIM
    | {
        "tie_word_embeddings": True,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    layer=GQA | SWIGLU | INPUT_NORM,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    semantics=(attention(rotates=lambda a: a.sliding_window is not None), swiglu_mlp()),
)

EXAONE4 = Family(
    model="exaone4",
    hf_class="Exaone4ForCausalLM",
    config_class="Exaone4Config",
    config=LLAMA_LIKE
    | {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]},
    layer=GQA | QK_NORM | SWIGLU | POST_NORMS,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    semantics=(
        attention(qk_norm="head", rotates=lambda a: a.sliding_window is None or a.is_sliding),
        swiglu_mlp(),
    ),
    variants={"tied": {"tie_word_embeddings": True}},
)

# Partial rotary (half of head_dim) as released; q/k/v biases on.
GLM4 = Family(
    model="glm4",
    hf_class="Glm4ForCausalLM",
    config_class="Glm4Config",
    config=LLAMA_LIKE
    | {
        "attention_bias": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    },
    layer=GQA | QKV_BIAS | fused_gate_up(LLAMA_LIKE["intermediate_size"]) | GLM4_NORMS,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    semantics=(attention(), swiglu_mlp()),
)

ROWS: tuple[Family, ...] = (
    MISTRAL, LLAMA, QWEN2, QWEN3, GEMMA2, GEMMA3_TEXT, GRANITE, OLMO2, COHERE, COHERE2, EXAONE4,
    GLM4,
)  # fmt: skip
