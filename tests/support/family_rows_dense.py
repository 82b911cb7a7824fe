"""Family rows for the dense families (tests/families/test_family_proofs.py collects every
``family_rows_*.py``'s ``ROWS``).

Each config: no two sizes equal (hidden, heads, kv_heads, head_dim, intermediate, vocab, and
the q rows heads·head_dim), 2 layers, 2 KV heads so k/v replicate at tp 4 and 8; vocab
divisible by every tp listed.
"""

from __future__ import annotations

from typing import Any

from family_layouts import (
    FC_MLP,
    GLM4_NORMS,
    GQA,
    GQA_PROJ_NORM,
    HEAD_NORMS,
    INPUT_NORM,
    LLAMA_LAYER,
    LM_GLOBALS,
    LM_GLOBALS_BIAS,
    NORMS,
    NORMS_BIAS,
    O_BIAS,
    POST_NORMS,
    QK_NORM,
    QKV_BIAS,
    SANDWICH_NORMS,
    SWIGLU,
    UP_DOWN,
    fused_gate_up,
)
from family_semantics import (
    attention,
    fc_mlp,
    gathered_attention,
    neox_attention,
    opt_mlp,
    swiglu_mlp,
    up_down_mlp,
)
from family_table import Col, Family, Part, Rep, Row

# Why a tp that bind accepts is not proven (a row's ``beyond``).
BACKEND_KV = (
    "vLLM runs this family through its Transformers backend, whose plain ColumnParallelLinear "
    "k/v would split a KV head's rows across ranks at tp > kv_heads, which its attention "
    "cannot run; specbind replicates the KV heads there (vLLM's native QKVParallelLinear "
    "layout), unproven against an engine"
)
COMMANDR_KV = (
    "vLLM's commandr loads k_norm [kv_heads, head_dim] with row_parallel_weight_loader, which "
    "reads past the stored rows at tp > kv_heads; specbind replicates the KV heads' rows there"
)

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
    beyond={},
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
    beyond={},
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
    beyond={},
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
    beyond={},
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
    beyond={},
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
    beyond={},
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
    beyond={},
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
    beyond={},
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
    beyond={8: COMMANDR_KV},
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
    beyond={},
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
    beyond={},
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
    beyond={},
    refused={
        "no-qkv-bias": (
            {"attention_bias": False},
            "config.json: attention_bias is false, but model glm4 binds attention_bias true only",
        )
    },
    semantics=(attention(), swiglu_mlp()),
)

# 4 KV heads: vLLM's Transformers backend (plain ColumnParallelLinear k/v) holds whole KV
# heads only while tp <= kv_heads, so those are the tps proven.
STARCODER2 = Family(
    model="starcoder2",
    hf_class="Starcoder2ForCausalLM",
    config_class="Starcoder2Config",
    config=NO_HEAD_DIM
    | {
        "num_key_value_heads": 4,
        "use_bias": True,
        "tie_word_embeddings": True,
        "hidden_act": "gelu_pytorch_tanh",
        "sliding_window": 16,
    },
    layer=GQA | QKV_BIAS | O_BIAS | FC_MLP | NORMS_BIAS,
    globals=LM_GLOBALS_BIAS,
    tps=(1, 2, 4),
    beyond={8: BACKEND_KV},
    refused={
        "no-bias": (
            {"use_bias": False},
            "config.json: use_bias is false, but model starcoder2 binds use_bias true only",
        )
    },
    semantics=(attention(), fc_mlp()),
    variants={"untied": {"tie_word_embeddings": False}},
)

GEMMA1 = Family(
    model="gemma",
    hf_class="GemmaForCausalLM",
    config_class="GemmaConfig",
    config=LLAMA_LIKE | {"tie_word_embeddings": True},
    layer=LLAMA_LAYER,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    beyond={},
    semantics=(attention(), swiglu_mlp()),
)

OLMO3 = Family(
    model="olmo3",
    hf_class="Olmo3ForCausalLM",
    config_class="Olmo3Config",
    config=NO_HEAD_DIM
    | {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]},
    layer=GQA_PROJ_NORM | SWIGLU | POST_NORMS,
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    beyond={},
    semantics=(gathered_attention(), swiglu_mlp()),
)

# vLLM runs SmolLM3 and Seed-OSS through its Transformers backend (plain ColumnParallelLinear
# k/v): 4 KV heads, tps within them. Layer 0 is a NoPE layer, layer 1 rotates.
SMOLLM3 = Family(
    model="smollm3",
    hf_class="SmolLM3ForCausalLM",
    config_class="SmolLM3Config",
    config=NO_HEAD_DIM
    | {"num_key_value_heads": 4, "tie_word_embeddings": True, "no_rope_layers": [0, 1]},
    layer=LLAMA_LAYER,
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    beyond={8: BACKEND_KV},
    semantics=(attention(rotates=lambda a: bool(a.use_rope)), swiglu_mlp()),
)

ERNIE4_5 = Family(
    model="ernie4-5",
    hf_class="Ernie4_5ForCausalLM",
    config_class="Ernie4_5Config",
    config=LLAMA_LIKE | {"tie_word_embeddings": True},
    layer=LLAMA_LAYER,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    beyond={},
    semantics=(attention(), swiglu_mlp()),
)

SEED_OSS = Family(
    model="seed-oss",
    hf_class="SeedOssForCausalLM",
    config_class="SeedOssConfig",
    config=LLAMA_LIKE
    | {"num_key_value_heads": 4, "attention_bias": True, "attention_out_bias": True},
    layer=LLAMA_LAYER | QKV_BIAS | O_BIAS,
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    beyond={8: BACKEND_KV},
    semantics=(attention(), swiglu_mlp()),
    variants={"no-o-bias": {"attention_out_bias": False}},
)

# Ministral, Helium and Hunyuan dense have no vLLM model of their own: the Transformers
# backend runs them, holding whole KV heads while tp <= kv_heads (4 here).
KV4: dict[str, Any] = LLAMA_LIKE | {"num_key_value_heads": 4}

MINISTRAL = Family(
    model="ministral",
    hf_class="MinistralForCausalLM",
    config_class="MinistralConfig",
    config=KV4 | {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]},
    layer=LLAMA_LAYER,
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    beyond={8: BACKEND_KV},
    semantics=(attention(), swiglu_mlp()),
)

HELIUM = Family(
    model="helium",
    hf_class="HeliumForCausalLM",
    config_class="HeliumConfig",
    config=NO_HEAD_DIM | {"num_key_value_heads": 4, "head_dim": 6},  # heads x 6 = hidden
    layer=LLAMA_LAYER,
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    beyond={8: BACKEND_KV},
    semantics=(attention(), swiglu_mlp()),
)

GLM = Family(
    model="glm",
    hf_class="GlmForCausalLM",
    config_class="GlmConfig",
    config=GLM4.config,
    layer=GQA | QKV_BIAS | fused_gate_up(LLAMA_LIKE["intermediate_size"]) | NORMS,
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    beyond={},
    semantics=(attention(), swiglu_mlp()),
)

HUNYUAN_DENSE = Family(
    model="hunyuan-dense",
    hf_class="HunYuanDenseV1ForCausalLM",
    config_class="HunYuanDenseV1Config",
    config=KV4,
    layer=LLAMA_LAYER
    | {
        "attention.q_norm": Rep("self_attn.query_layernorm.weight"),
        "attention.k_norm": Rep("self_attn.key_layernorm.weight"),
    },
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    beyond={8: BACKEND_KV},
    semantics=(attention(qk_norm="head_after_rope"), swiglu_mlp()),
)

# Partial rotary (half of head_dim) as released; squared ReLU.
NEMOTRON = Family(
    model="nemotron",
    hf_class="NemotronForCausalLM",
    config_class="NemotronConfig",
    config=LLAMA_LIKE
    | {
        "hidden_act": "relu2",
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    },
    layer=GQA | UP_DOWN | NORMS_BIAS,
    globals=LM_GLOBALS_BIAS,
    tps=(1, 2, 4, 8),
    beyond={},
    semantics=(attention(), up_down_mlp()),
)

# vLLM runs Arcee through its Transformers backend: tps within its 4 KV heads.
ARCEE = Family(
    model="arcee",
    hf_class="ArceeForCausalLM",
    config_class="ArceeConfig",
    config=KV4,
    layer=GQA | UP_DOWN | NORMS,
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    beyond={8: BACKEND_KV},
    semantics=(attention(), up_down_mlp()),
)

# StableLM 2 (q/k/v biases, partial rotary); StableLM-3B-4E1T without biases: a variant. Its
# head_dim is hidden / heads: 4 heads of 12, so the rotary half (6 dims) is whole pairs.
STABLELM = Family(
    model="stablelm",
    hf_class="StableLmForCausalLM",
    config_class="StableLmConfig",
    config=NO_HEAD_DIM
    | {
        "num_attention_heads": 4,
        "use_qkv_bias": True,
        "layer_norm_eps": 1e-5,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    },
    layer=LLAMA_LAYER | QKV_BIAS | NORMS_BIAS,
    globals=LM_GLOBALS_BIAS,
    tps=(1, 2, 4),
    beyond={},
    refused={"qk-layernorm": ({"qk_layernorm": True}, "config.json: qk_layernorm is true")},
    semantics=(attention(), swiglu_mlp()),
    variants={"no-qkv-bias": {"use_qkv_bias": False}},
)

# vLLM runs Phi through its Transformers backend: tps within the KV heads (4 here, MHA as
# released: kv_heads = heads would leave no tp > kv_heads to check anyway). Partial rotary 0.5.
PHI = Family(
    model="phi",
    hf_class="PhiForCausalLM",
    config_class="PhiConfig",
    config=NO_HEAD_DIM
    | {
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "layer_norm_eps": 1e-5,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    },
    layer={
        "attention.q_proj": Col("self_attn.q_proj.weight", "num_attention_heads"),
        "attention.k_proj": Col("self_attn.k_proj.weight", "num_key_value_heads"),
        "attention.v_proj": Col("self_attn.v_proj.weight", "num_key_value_heads"),
        "attention.o_proj": Row("self_attn.dense.weight", "num_attention_heads"),
        "attention.o_bias": Rep("self_attn.dense.bias"),
        "mlp.c_fc": Col("mlp.fc1.weight", "intermediate_size"),
        "mlp.c_fc_bias": Col("mlp.fc1.bias", "intermediate_size"),
        "mlp.c_proj": Row("mlp.fc2.weight", "intermediate_size"),
        "mlp.c_proj_bias": Rep("mlp.fc2.bias"),
        "norms.input_norm": Rep("input_layernorm.weight"),
        "norms.input_norm_bias": Rep("input_layernorm.bias"),
    }
    | QKV_BIAS,
    globals={
        "embed_tokens": Col("model.embed_tokens.weight", "vocab_size"),
        "norm": Rep("model.final_layernorm.weight"),
        "norm_bias": Rep("model.final_layernorm.bias"),
        "lm_head": Col("lm_head.weight", "vocab_size"),
        "lm_head_bias": Col("lm_head.bias", "vocab_size"),
    },
    tps=(1, 2, 4),
    beyond={},
    refused={"qk-layernorm": ({"qk_layernorm": True}, "config.json: qk_layernorm is true")},
    semantics=(attention(), fc_mlp()),
)

# OLMo-1: no norm tensors at all; vLLM's Transformers backend runs it (tps within 4 KV heads).
OLMO = Family(
    model="olmo",
    hf_class="OlmoForCausalLM",
    config_class="OlmoConfig",
    config=NO_HEAD_DIM | {"num_key_value_heads": 4},
    layer=GQA | SWIGLU,
    globals={k: v for k, v in LM_GLOBALS.items() if k != "norm"},
    tps=(1, 2, 4),
    beyond={8: BACKEND_KV},
    semantics=(attention(), swiglu_mlp()),
    variants={"tied": {"tie_word_embeddings": True}},
)

# GPT-NeoX through vLLM's Transformers backend: query_key_value split into contiguous row
# blocks, which are whole heads in its per-head interleave; MHA, 4 heads: tp 1, 2, 4.
# rotary_pct 0.5 (Pythia's 0.25 of 6 dims is not whole pairs at this size).
GPT_NEOX = Family(
    model="gpt-neox",
    hf_class="GPTNeoXForCausalLM",
    config_class="GPTNeoXConfig",
    config={k: v for k, v in NO_HEAD_DIM.items() if k != "num_key_value_heads"}
    | {
        "num_attention_heads": 4,
        "layer_norm_eps": 1e-5,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    },
    layer={
        "attention.qkv_proj": Col("attention.query_key_value.weight", "num_attention_heads"),
        "attention.qkv_bias": Col("attention.query_key_value.bias", "num_attention_heads"),
        "attention.o_proj": Row("attention.dense.weight", "num_attention_heads"),
        "attention.o_bias": Rep("attention.dense.bias"),
        "mlp.c_fc": Col("mlp.dense_h_to_4h.weight", "intermediate_size"),
        "mlp.c_fc_bias": Col("mlp.dense_h_to_4h.bias", "intermediate_size"),
        "mlp.c_proj": Row("mlp.dense_4h_to_h.weight", "intermediate_size"),
        "mlp.c_proj_bias": Rep("mlp.dense_4h_to_h.bias"),
    }
    | NORMS_BIAS,
    globals={
        "embed_tokens": Col("gpt_neox.embed_in.weight", "vocab_size"),
        "norm": Rep("gpt_neox.final_layer_norm.weight"),
        "norm_bias": Rep("gpt_neox.final_layer_norm.bias"),
        "lm_head": Col("lm_head.weight", "vocab_size"),  # stored as embed_out
    },
    tps=(1, 2, 4),
    beyond={},
    semantics=(neox_attention(), fc_mlp()),
    layers_path="gpt_neox.layers",
)

# OPT: MHA (8 heads of 6), learned positions (24 + 2 rows), tied head; vLLM's own opt model.
OPT = Family(
    model="opt",
    hf_class="OPTForCausalLM",
    config_class="OPTConfig",
    config={
        "vocab_size": 112,
        "hidden_size": 48,
        "ffn_dim": 72,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "max_position_embeddings": 24,
        "word_embed_proj_dim": 48,
        "tie_word_embeddings": True,
        "pad_token_id": 1,
    },
    layer={
        "attention.q_proj": Col("self_attn.q_proj.weight", "num_attention_heads"),
        "attention.k_proj": Col("self_attn.k_proj.weight", "num_attention_heads"),
        "attention.v_proj": Col("self_attn.v_proj.weight", "num_attention_heads"),
        "attention.o_proj": Row("self_attn.out_proj.weight", "num_attention_heads"),
        "attention.q_bias": Col("self_attn.q_proj.bias", "num_attention_heads"),
        "attention.k_bias": Col("self_attn.k_proj.bias", "num_attention_heads"),
        "attention.v_bias": Col("self_attn.v_proj.bias", "num_attention_heads"),
        "attention.o_bias": Rep("self_attn.out_proj.bias"),
        "mlp.c_fc": Col("fc1.weight", "ffn_dim"),
        "mlp.c_fc_bias": Col("fc1.bias", "ffn_dim"),
        "mlp.c_proj": Row("fc2.weight", "ffn_dim"),
        "mlp.c_proj_bias": Rep("fc2.bias"),
        "norms.input_norm": Rep("self_attn_layer_norm.weight"),
        "norms.input_norm_bias": Rep("self_attn_layer_norm.bias"),
        "norms.post_attention_norm": Rep("final_layer_norm.weight"),
        "norms.post_attention_norm_bias": Rep("final_layer_norm.bias"),
    },
    globals={
        "embed_tokens": Col("model.decoder.embed_tokens.weight", "vocab_size"),
        "embed_positions": Rep("model.decoder.embed_positions.weight"),
        "norm": Rep("model.decoder.final_layer_norm.weight"),
        "norm_bias": Rep("model.decoder.final_layer_norm.bias"),
        "lm_head": Col("lm_head.weight", "vocab_size"),
    },
    tps=(1, 2, 4, 8),
    beyond={},
    refused={"project-in-out": ({"word_embed_proj_dim": 40}, "project_in")},
    semantics=(attention(rotary=False), opt_mlp()),
    layers_path="model.decoder.layers",
    variants={"untied": {"tie_word_embeddings": False}},
)

# Falcon-7B style: multi-query (one KV head, whole on every rank), one fused query_key_value
# read as [q; k; v] sections, as vLLM's falcon loads it into QKVParallelLinear.
FALCON_Q = 8 * 6  # q rows: heads x head_dim (48 / 8)
FALCON = Family(
    model="falcon",
    hf_class="FalconForCausalLM",
    config_class="FalconConfig",
    config={
        "vocab_size": 112,
        "hidden_size": 48,
        "ffn_hidden_size": 72,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "multi_query": True,
        "parallel_attn": True,
        "new_decoder_architecture": False,
        "bias": False,
        "alibi": False,
        "tie_word_embeddings": False,
        "pad_token_id": 0,
    },
    layer={
        "attention.q_proj": Part(
            Col("self_attention.query_key_value.weight", "num_attention_heads"), (FALCON_Q, 6, 6), 0
        ),
        "attention.k_proj": Part(
            Col("self_attention.query_key_value.weight", 1), (FALCON_Q, 6, 6), 1
        ),
        "attention.v_proj": Part(
            Col("self_attention.query_key_value.weight", 1), (FALCON_Q, 6, 6), 2
        ),
        "attention.o_proj": Row("self_attention.dense.weight", "num_attention_heads"),
        "mlp.up": Col("mlp.dense_h_to_4h.weight", "ffn_hidden_size"),
        "mlp.down": Row("mlp.dense_4h_to_h.weight", "ffn_hidden_size"),
        "norms.input_norm": Rep("input_layernorm.weight"),
        "norms.input_norm_bias": Rep("input_layernorm.bias"),
    },
    globals={
        "embed_tokens": Col("transformer.word_embeddings.weight", "vocab_size"),
        "norm": Rep("transformer.ln_f.weight"),
        "norm_bias": Rep("transformer.ln_f.bias"),
        "lm_head": Col("lm_head.weight", "vocab_size"),
    },
    tps=(1, 2, 4, 8),
    beyond={},
    refused={
        "new-decoder-architecture": (
            {"new_decoder_architecture": True, "num_kv_heads": 2},
            "config.json: new_decoder_architecture is true, but model falcon binds",
        )
    },
    semantics=(attention(), up_down_mlp()),
    layers_path="transformer.h",
)

ROWS: tuple[Family, ...] = (
    MISTRAL, LLAMA, QWEN2, QWEN3, GEMMA2, GEMMA3_TEXT, GRANITE, OLMO2, COHERE, COHERE2, EXAONE4,
    GLM4, STARCODER2, GEMMA1, OLMO3, SMOLLM3, ERNIE4_5, SEED_OSS, MINISTRAL, HELIUM, GLM,
    HUNYUAN_DENSE, NEMOTRON, ARCEE, STABLELM, PHI, OLMO, GPT_NEOX, OPT, FALCON,
)  # fmt: skip
