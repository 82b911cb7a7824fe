"""Family rows for the mixture-of-experts and hybrid families (tests/families/
test_family_proofs.py collects every ``family_rows_*.py``'s ``ROWS``).

Each config: no two sizes equal (hidden, heads, kv_heads, head_dim, expert and shared
intermediates, experts, vocab, the q rows heads·head_dim), 2 layers, 2 KV heads so k/v replicate
at tp 4 and 8; 6 experts, so ep 2 splits them evenly and ep 4 does not (the first 2 ranks hold
one more, vLLM's map); every ep rank checked at each tp.
"""

from __future__ import annotations

from typing import Any

from family_layouts import GQA, LM_GLOBALS, NORMS, QK_NORM, QKV_BIAS, SWIGLU
from family_moe import (
    W2,
    W13,
    Flat,
    dense_layers,
    mamba2_projections,
    sparse_moe,
    whole_norm_attention,
)
from family_semantics import attention, gated_attention, gated_deltanet
from family_table import Cat, Col, Family, Part, Rep, Row, Rule

# one expert's intermediate 72 (Mixtral's intermediate_size), q rows 96, kv rows 24, 6 experts
MIXTRAL_CONFIG: dict[str, Any] = {
    "vocab_size": 112,
    "hidden_size": 40,
    "intermediate_size": 72,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 12,
    "num_local_experts": 6,
    "num_experts_per_tok": 2,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
}


def routed(inter: str) -> dict[str, Rule]:
    """specs/blocks/moe.yaml's router and routed experts over transformers' fused experts."""
    return {
        "mlp.router": Rep("mlp.gate.weight"),
        "mlp.w13": W13("mlp.experts.gate_up_proj", inter),
        "mlp.w2": W2("mlp.experts.down_proj", inter),
    }


MIXTRAL = Family(
    model="mixtral",
    hf_class="MixtralForCausalLM",
    config_class="MixtralConfig",
    config=MIXTRAL_CONFIG,
    layer=GQA | NORMS | routed("intermediate_size"),
    globals=LM_GLOBALS,
    tps=(1, 2, 4, 8),
    eps=(1, 2, 4),
    semantics=(attention(), sparse_moe()),
)

# Qwen2-MoE writes no head_dim (hidden / heads = 6): q rows equal hidden (48) by construction.
# 7 experts (6 is head_dim): ep 2 and 4 split them unevenly; shared expert 28, experts 20.
QWEN2_MOE_CONFIG: dict[str, Any] = {
    "vocab_size": 112,
    "hidden_size": 48,
    "intermediate_size": 72,
    "moe_intermediate_size": 20,
    "shared_expert_intermediate_size": 28,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_experts": 7,
    "num_experts_per_tok": 2,
    "norm_topk_prob": False,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
}
SHARED = "shared_expert_intermediate_size"

QWEN2_MOE = Family(
    model="qwen2-moe",
    hf_class="Qwen2MoeForCausalLM",
    config_class="Qwen2MoeConfig",
    config=QWEN2_MOE_CONFIG,
    layer=GQA | QKV_BIAS | NORMS | routed("moe_intermediate_size") | {
        "mlp.shared_gate_up": Cat(Col("mlp.shared_expert.gate_proj.weight", SHARED),
                                  Col("mlp.shared_expert.up_proj.weight", SHARED)),
        "mlp.shared_down": Row("mlp.shared_expert.down_proj.weight", SHARED),
        "mlp.shared_gate": Rep("mlp.shared_expert_gate.weight"),
    },
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    eps=(1, 2, 4),
    semantics=(attention(), sparse_moe(shared="sigmoid")),
    variants={"dense-layer-1": {"mlp_only_layers": [1]}},
)  # fmt: skip

# OLMoE writes no head_dim (48 / 8 = 6); one expert's intermediate 20, 7 experts.
OLMOE = Family(
    model="olmoe",
    hf_class="OlmoeForCausalLM",
    config_class="OlmoeConfig",
    config={
        k: v for k, v in QWEN2_MOE_CONFIG.items()
        if k not in ("moe_intermediate_size", "shared_expert_intermediate_size",
                     "decoder_sparse_step", "mlp_only_layers")
    } | {"intermediate_size": 20, "eos_token_id": 1, "bos_token_id": 2},
    layer=GQA | NORMS | routed("intermediate_size") | {
        "attention.q_norm": Rep("self_attn.q_norm.weight"),
        "attention.k_norm": Rep("self_attn.k_norm.weight"),
    },
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    eps=(1, 2, 4),
    semantics=(whole_norm_attention(), sparse_moe()),
)  # fmt: skip

# vLLM's PhiMoE always biases q/k/v/o and the head, as Phi-3.5-MoE's config.json says.
PHIMOE = Family(
    model="phimoe",
    hf_class="PhimoeForCausalLM",
    config_class="PhimoeConfig",
    config=OLMOE.config | {"num_local_experts": 7, "attention_bias": True, "lm_head_bias": True},
    layer=GQA | QKV_BIAS | routed("intermediate_size") | {
        "attention.o_bias": Rep("self_attn.o_proj.bias"),
        "mlp.router": Rep("mlp.router.weight"),
        "norms.input_norm": Rep("input_layernorm.weight"),
        "norms.input_norm_bias": Rep("input_layernorm.bias"),
        "norms.post_attention_norm": Rep("post_attention_layernorm.weight"),
        "norms.post_attention_norm_bias": Rep("post_attention_layernorm.bias"),
    },
    globals=LM_GLOBALS | {
        "norm_bias": Rep("model.norm.bias"),
        "lm_head_bias": Col("lm_head.bias", "vocab_size"),
    },
    tps=(1, 2, 4),
    eps=(1, 2, 4),
    semantics=(attention(), sparse_moe(router="router")),
)  # fmt: skip

# GLM-4.5: 3 layers (layer 0 dense, 1 and 2 MoE), head_dim 10 of its own, 2 shared experts
# (shared rows 40), the F32 score-correction bias; no MTP layer (transformers writes none).
GLM4_MOE_CONFIG: dict[str, Any] = {
    "vocab_size": 112,
    "hidden_size": 48,
    "intermediate_size": 72,
    "moe_intermediate_size": 20,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 10,
    "n_routed_experts": 7,
    "n_shared_experts": 2,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "attention_bias": True,
    "use_qk_norm": True,
    "num_nextn_predict_layers": 0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
}


def shared_rows(cfg: Any) -> int:
    return int(cfg["n_shared_experts"]) * int(cfg["moe_intermediate_size"])


GLM4_ATTENTION = GQA | QKV_BIAS | QK_NORM | NORMS
GLM4_MOE_MLP: dict[str, Rule] = routed("moe_intermediate_size") | {
    "mlp.router_bias": Rep("mlp.gate.e_score_correction_bias"),
    "mlp.shared_gate_up": Cat(Col("mlp.shared_experts.gate_proj.weight", shared_rows),
                              Col("mlp.shared_experts.up_proj.weight", shared_rows)),
    "mlp.shared_down": Row("mlp.shared_experts.down_proj.weight", shared_rows),
}  # fmt: skip
GLM4_MOE_LAYER = GLM4_ATTENTION | GLM4_MOE_MLP

GLM4_MOE = Family(
    model="glm4-moe",
    hf_class="Glm4MoeForCausalLM",
    config_class="Glm4MoeConfig",
    config=GLM4_MOE_CONFIG,
    layer=GLM4_MOE_LAYER,
    layer_at=lambda cfg, i: GLM4_ATTENTION | (
        SWIGLU if i < cfg["first_k_dense_replace"] else GLM4_MOE_MLP
    ),
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    eps=(1, 2, 4),
    semantics=(attention(qk_norm="head"), dense_layers(), sparse_moe(shared="plain")),
    f32=r"model\.layers\.\d+\.mlp\.gate\.e_score_correction_bias",
    variants={"no-qk-norm": {"use_qk_norm": False}},
)  # fmt: skip

# GraniteMoE stores its experts stacked (input_linear [E, 2I, X], output_linear [E, X, I]);
# transformers holds them as experts.gate_up_proj / down_proj under block_sparse_moe.
GRANITEMOE = Family(
    model="granitemoe",
    hf_class="GraniteMoeForCausalLM",
    config_class="GraniteMoeConfig",
    config=OLMOE.config | {
        "num_local_experts": 7,
        "tie_word_embeddings": True,
        "attention_multiplier": 0.3,
        "embedding_multiplier": 6.0,
        "residual_multiplier": 0.2,
        "logits_scaling": 4.0,
    },
    layer=GQA | NORMS | {
        "mlp.router": Rep("block_sparse_moe.router.weight"),
        "mlp.w13": W13("block_sparse_moe.experts.gate_up_proj", "intermediate_size"),
        "mlp.w2": W2("block_sparse_moe.experts.down_proj", "intermediate_size"),
    },
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    eps=(1, 2, 4),
    semantics=(attention(), sparse_moe(module="block_sparse_moe", router="router")),
    variants={"untied": {"tie_word_embeddings": False}},
)  # fmt: skip

MAMBA2_KEYS = ("num_heads", "head_dim", "n_groups", "state_size")

# Mamba2: inner 80 = 16 heads x 5 (= expand 2 x hidden 40), 4 groups of state 6 (B, C rows
# 24), conv kernel 3; in_proj [z; x; B; C; dt] = 80 + 80 + 24 + 24 + 16 rows.
MAMBA2_CONFIG: dict[str, Any] = {
    "vocab_size": 112,
    "hidden_size": 40,
    "num_hidden_layers": 2,
    "num_heads": 16,
    "head_dim": 5,
    "n_groups": 4,
    "state_size": 6,
    "expand": 2,
    "conv_kernel": 3,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
}


def mamba2_mixer(
    cfg: Any, module: str = "mixer", keys: tuple[str, str, str, str] = MAMBA2_KEYS
) -> dict[str, Rule]:
    """specs/blocks/mamba2.yaml over transformers' fused in_proj / conv1d (under ``module``;
    ``keys``: the config fields of heads, head dim, groups, state), each section split by its
    own unit, as vLLM's mamba_v2_sharded_weight_loader lays rank r's rows out."""
    heads, hd, groups, state = keys
    h, g = cfg[heads], cfg[groups]
    inner, gs = h * cfg[hd], g * cfg[state]
    ins, conv = (inner, inner, gs, gs, h), (inner, gs, gs)
    by = (heads, heads, groups, groups, heads)
    w, cw, cb = (f"{module}.{n}" for n in ("in_proj.weight", "conv1d.weight", "conv1d.bias"))
    return {
        "mixer.in_proj": Cat(*(Part(Col(w, u), ins, k) for k, u in enumerate(by))),
        "mixer.conv1d": Cat(*(Part(Col(cw, u), conv, k) for k, u in enumerate(by[1:4]))),
        "mixer.conv1d_bias": Cat(*(Part(Col(cb, u), conv, k) for k, u in enumerate(by[1:4]))),
        "mixer.a_log": Col(f"{module}.A_log", heads),
        "mixer.d": Col(f"{module}.D", heads),
        "mixer.dt_bias": Col(f"{module}.dt_bias", heads),
        "mixer.norm": Col(f"{module}.norm.weight", heads),
        "mixer.out_proj": Row(f"{module}.out_proj.weight", heads),
    }


MAMBA2 = Family(
    model="mamba2",
    hf_class="Mamba2ForCausalLM",
    config_class="Mamba2Config",
    config=MAMBA2_CONFIG,
    layer=mamba2_mixer(MAMBA2_CONFIG) | {"norms.norm": Rep("norm.weight")},
    globals={
        "embed_tokens": Col("backbone.embeddings.weight", "vocab_size"),
        "norm": Rep("backbone.norm_f.weight"),
        "lm_head": Col("lm_head.weight", "vocab_size"),
    },
    tps=(1, 2, 4),
    semantics=(mamba2_projections(),),
    layers_path="backbone.layers",
)

# Granite-4 hybrid: layer 0 Mamba2 (32 heads x 3 = 96 = expand 2 x hidden 48, 4 groups of
# state 9), layer 1 attention (8 heads of 6, 2 KV heads); every layer 7 experts of 20 stored
# stacked plus a shared MLP of 28, added ungated.
GRANITE4_CONFIG: dict[str, Any] = {
    "vocab_size": 112,
    "hidden_size": 48,
    "intermediate_size": 20,
    "shared_intermediate_size": 28,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_local_experts": 7,
    "num_experts_per_tok": 2,
    "mamba_n_heads": 32,
    "mamba_d_head": 3,
    "mamba_n_groups": 4,
    "mamba_d_state": 9,
    "mamba_d_conv": 5,
    "mamba_expand": 2,
    "layer_types": ["mamba", "attention"],
    "tie_word_embeddings": False,
    "pad_token_id": 0,
}
GRANITE4_KEYS = ("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state")
GRANITE4_SHARED = "shared_intermediate_size"
GRANITE4_MLP: dict[str, Rule] = NORMS | {
    "mlp.router": Rep("block_sparse_moe.router.weight"),
    "mlp.w13": W13("block_sparse_moe.experts.gate_up_proj", "intermediate_size"),
    "mlp.w2": W2("block_sparse_moe.experts.down_proj", "intermediate_size"),
    "mlp.shared_gate_up": Cat(
        *(Part(Col("shared_mlp.input_linear.weight", GRANITE4_SHARED), (28, 28), k)
          for k in (0, 1))
    ),
    "mlp.shared_down": Row("shared_mlp.output_linear.weight", GRANITE4_SHARED),
}  # fmt: skip


def granite4_layer(cfg: Any, i: int) -> dict[str, Rule]:
    if cfg["layer_types"][i] in ("mamba", "linear_attention"):  # as the hub, as transformers
        return mamba2_mixer(cfg, "mamba", GRANITE4_KEYS) | GRANITE4_MLP
    return {f"mixer.{k.split('.')[1]}": v for k, v in GQA.items()} | GRANITE4_MLP


GRANITEMOEHYBRID = Family(
    model="granitemoehybrid",
    hf_class="GraniteMoeHybridForCausalLM",
    config_class="GraniteMoeHybridConfig",
    config=GRANITE4_CONFIG,
    layer=GRANITE4_MLP,
    layer_at=granite4_layer,
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    eps=(1, 2, 4),
    semantics=(
        mamba2_projections(module="mamba"),
        sparse_moe(module="block_sparse_moe", router="router", shared="plain", plus="shared_mlp"),
    ),
)

# ERNIE-4.5-MoE: 3 layers (layer 0 dense), head_dim 10 of its own, 2 shared experts (rows
# 40), the router and its [1, E] correction bias (moe_statics) in F32, tied head.
ERNIE_CONFIG: dict[str, Any] = {
    "vocab_size": 112,
    "hidden_size": 48,
    "intermediate_size": 72,
    "moe_intermediate_size": 20,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 10,
    "moe_num_experts": 7,
    "moe_num_shared_experts": 2,
    "moe_k": 2,
    "moe_layer_start_index": 1,
    "moe_layer_interval": 1,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
}


def ernie_shared(cfg: Any) -> int:
    return int(cfg["moe_num_shared_experts"]) * int(cfg["moe_intermediate_size"])


ERNIE_MOE_MLP: dict[str, Rule] = routed("moe_intermediate_size") | {
    "mlp.router_bias": Flat("mlp.gate.moe_statics.e_score_correction_bias"),
    "mlp.shared_gate_up": Cat(Col("mlp.shared_experts.gate_proj.weight", ernie_shared),
                              Col("mlp.shared_experts.up_proj.weight", ernie_shared)),
    "mlp.shared_down": Row("mlp.shared_experts.down_proj.weight", ernie_shared),
}  # fmt: skip

ERNIE4_5_MOE = Family(
    model="ernie4-5-moe",
    hf_class="Ernie4_5_MoeForCausalLM",
    config_class="Ernie4_5_MoeConfig",
    config=ERNIE_CONFIG,
    layer=GQA | NORMS | ERNIE_MOE_MLP,
    layer_at=lambda cfg, i: GQA | NORMS | (
        ERNIE_MOE_MLP if i >= cfg["moe_layer_start_index"] else SWIGLU
    ),
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    eps=(1, 2, 4),
    semantics=(attention(), dense_layers(), sparse_moe(shared="plain")),
    f32=r"model\.layers\.\d+\.mlp\.gate\.(weight|moe_statics\.e_score_correction_bias)",
    variants={"untied": {"tie_word_embeddings": False}},
)  # fmt: skip

# Qwen3-Next: layer 0 Gated DeltaNet (4 key heads of 6, 12 value heads of 10, conv kernel 3),
# layer 1 gated full attention (8 heads of 16, q rows 256 with the gate; 2 KV heads, so k/v
# replicate at tp 4); every layer 7 experts of 20 and a shared expert of 28 behind its gate.
QWEN3_NEXT_CONFIG: dict[str, Any] = {
    "vocab_size": 112,
    "hidden_size": 48,
    "intermediate_size": 72,
    "moe_intermediate_size": 20,
    "shared_expert_intermediate_size": 28,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 12,
    "linear_key_head_dim": 6,
    "linear_value_head_dim": 10,
    "linear_conv_kernel_dim": 3,
    "layer_types": ["linear_attention", "full_attention"],
    "num_experts": 7,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
}


def _key_rows(cfg: Any) -> int:
    return int(cfg["linear_num_key_heads"]) * int(cfg["linear_key_head_dim"])


def _value_rows(cfg: Any) -> int:
    return int(cfg["linear_num_value_heads"]) * int(cfg["linear_value_head_dim"])


def qwen3_next_gdn(cfg: Any, module: str = "linear_attn") -> dict[str, Rule]:
    """vLLM's QwenGatedDeltaNetAttention (gqa_interleaved_layout, Qwen3-Next) over transformers'
    module, written from its loaders (the units are row counts: vLLM splits rows, heads unseen):
    in_proj_qkvz / in_proj_ba are MergedColumnParallelLinear of ONE output size (rank r's
    contiguous 1/tp of the stored rows); conv1d loads by mamba_v2_sharded_weight_loader over
    the sections (key_dim, key_dim, value_dim), each split 1/tp on its own ([q_r; k_r; v_r]);
    A_log and dt_bias by sharded_weight_loader(0); the gated norm replicated; out_proj a
    RowParallelLinear (columns 1/tp)."""
    key, value = _key_rows(cfg), _value_rows(cfg)
    conv = (key, key, value)
    cw = f"{module}.conv1d.weight"
    return {
        "attention.in_proj_qkvz": Col(f"{module}.in_proj_qkvz.weight", 2 * key + 2 * value),
        "attention.in_proj_ba": Col(f"{module}.in_proj_ba.weight",
                                    2 * int(cfg["linear_num_value_heads"])),
        "attention.conv1d": Cat(*(Part(Col(cw, n), conv, k) for k, n in enumerate(conv))),
        "attention.a_log": Col(f"{module}.A_log", "linear_num_value_heads"),
        "attention.dt_bias": Col(f"{module}.dt_bias", "linear_num_value_heads"),
        "attention.norm": Rep(f"{module}.norm.weight"),
        "attention.out_proj": Row(f"{module}.out_proj.weight", value),
    }  # fmt: skip


QWEN3_NEXT_MOE: dict[str, Rule] = NORMS | routed("moe_intermediate_size") | {
    "mlp.shared_gate_up": Cat(Col("mlp.shared_expert.gate_proj.weight", SHARED),
                              Col("mlp.shared_expert.up_proj.weight", SHARED)),
    "mlp.shared_down": Row("mlp.shared_expert.down_proj.weight", SHARED),
    "mlp.shared_gate": Rep("mlp.shared_expert_gate.weight"),
}  # fmt: skip


def qwen3_next_layer(cfg: Any, i: int) -> dict[str, Rule]:
    mlp = SWIGLU | NORMS if i in cfg["mlp_only_layers"] else QWEN3_NEXT_MOE
    if cfg["layer_types"][i] == "linear_attention":
        return qwen3_next_gdn(cfg) | mlp
    return GQA | QK_NORM | mlp


QWEN3_NEXT = Family(
    model="qwen3-next",
    hf_class="Qwen3NextForCausalLM",
    config_class="Qwen3NextConfig",
    config=QWEN3_NEXT_CONFIG,
    layer=QWEN3_NEXT_MOE,
    layer_at=qwen3_next_layer,
    globals=LM_GLOBALS,
    tps=(1, 2, 4),
    eps=(1, 2),
    semantics=(gated_attention(), gated_deltanet(), sparse_moe(shared="sigmoid")),
    f32=r"model\.layers\.\d+\.linear_attn\.A_log",
    variants={"dense-layer-1": {"mlp_only_layers": [1]}},
)

ROWS = [
    MIXTRAL, QWEN2_MOE, OLMOE, PHIMOE, GLM4_MOE, GRANITEMOE, MAMBA2, GRANITEMOEHYBRID,
    ERNIE4_5_MOE, QWEN3_NEXT,
]  # fmt: skip
