"""Reference layouts shared by the family rows: the standard layers vLLM builds most dense
families from, written as family_table rules over transformers' module names.

Each is a dict of bound `slot.field` -> rule; a row takes them whole or merges in its own
(``LLAMA_LAYER | {"attention.q_bias": ...}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from family_table import Cat, Col, Part, Rep, Row, Rule

HEADS, KV, INTER, VOCAB = (
    "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size",
)  # fmt: skip

# specs/blocks/gqa.yaml: separate q/k/v fields; k and v replicate where tp > KV heads.
GQA: dict[str, Rule] = {
    "attention.q_proj": Col("self_attn.q_proj.weight", HEADS),
    "attention.k_proj": Col("self_attn.k_proj.weight", KV),
    "attention.v_proj": Col("self_attn.v_proj.weight", KV),
    "attention.o_proj": Row("self_attn.o_proj.weight", HEADS),
}
# Qwen3's per-head RMSNorm of q and k: over head_dim, the same on every rank.
QK_NORM: dict[str, Rule] = {
    "attention.q_norm": Rep("self_attn.q_norm.weight"),
    "attention.k_norm": Rep("self_attn.k_norm.weight"),
}
# specs/blocks/dense.yaml: MergedColumnParallelLinear [gate_r; up_r], RowParallelLinear down.
SWIGLU: dict[str, Rule] = {
    "mlp.gate_up": Cat(Col("mlp.gate_proj.weight", INTER), Col("mlp.up_proj.weight", INTER)),
    "mlp.down": Row("mlp.down_proj.weight", INTER),
}
NORMS: dict[str, Rule] = {
    "norms.input_norm": Rep("input_layernorm.weight"),
    "norms.post_attention_norm": Rep("post_attention_layernorm.weight"),
}
LLAMA_LAYER: dict[str, Rule] = GQA | SWIGLU | NORMS
# specs/blocks/sandwich_norms.yaml (Gemma 2 and 3): four replicated norms per layer.
SANDWICH_NORMS: dict[str, Rule] = NORMS | {
    "norms.pre_mlp_norm": Rep("pre_feedforward_layernorm.weight"),
    "norms.post_mlp_norm": Rep("post_feedforward_layernorm.weight"),
}
# specs/blocks/lm_globals.yaml: VocabParallelEmbedding / ParallelLMHead by vocabulary rows
# (specbind binds the stored rows; vLLM's padding to a multiple of 64 is the engine layout's).
LM_GLOBALS: dict[str, Rule] = {
    "embed_tokens": Col("model.embed_tokens.weight", VOCAB),
    "norm": Rep("model.norm.weight"),
    "lm_head": Col("lm_head.weight", VOCAB),
}
# specs/blocks/gqa_bias.yaml: the biases shard as their projections' rows (QKVParallelLinear).
QKV_BIAS: dict[str, Rule] = {
    "attention.q_bias": Col("self_attn.q_proj.bias", HEADS),
    "attention.k_bias": Col("self_attn.k_proj.bias", KV),
    "attention.v_bias": Col("self_attn.v_proj.bias", KV),
}


def head_dim(cfg: Mapping[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def kv_rows(cfg: Mapping[str, Any]) -> int:
    return int(cfg[KV]) * head_dim(cfg)


# specs/blocks/gqa_proj_norm.yaml (OLMo-2 through vLLM's Transformers backend): q, k and v are
# ColumnParallelLinear split into tp contiguous row blocks (k and v by rows, so mid-head at
# tp > KV heads, never replicated), outputs gathered; the whole-projection norms replicated.
GQA_PROJ_NORM: dict[str, Rule] = {
    "attention.q_proj": Col("self_attn.q_proj.weight", HEADS),
    "attention.k_proj": Col("self_attn.k_proj.weight", kv_rows),
    "attention.v_proj": Col("self_attn.v_proj.weight", kv_rows),
    "attention.o_proj": Row("self_attn.o_proj.weight", HEADS),
    "attention.q_norm": Rep("self_attn.q_norm.weight"),
    "attention.k_norm": Rep("self_attn.k_norm.weight"),
}
POST_NORMS: dict[str, Rule] = {
    "norms.post_attention_norm": Rep("post_attention_layernorm.weight"),
    "norms.post_mlp_norm": Rep("post_feedforward_layernorm.weight"),
}
# specs/blocks/gqa_head_norms.yaml (Command R+): [heads, head_dim] norms split by heads, as
# vLLM's commandr row_parallel_weight_loader splits them.
HEAD_NORMS: dict[str, Rule] = {
    "attention.q_norm": Col("self_attn.q_norm.weight", HEADS),
    "attention.k_norm": Col("self_attn.k_norm.weight", KV),
}
INPUT_NORM: dict[str, Rule] = {"norms.input_norm": Rep("input_layernorm.weight")}
GLM4_NORMS: dict[str, Rule] = {
    "norms.input_norm": Rep("input_layernorm.weight"),
    "norms.post_attention_norm": Rep("post_self_attn_layernorm.weight"),
    "norms.pre_mlp_norm": Rep("post_attention_layernorm.weight"),
    "norms.post_mlp_norm": Rep("post_mlp_layernorm.weight"),
}


def fused_gate_up(intermediate: int) -> dict[str, Rule]:
    """One stored gate_up_proj [gate; up] (Phi-3, GLM-4): rank r's [gate_r; up_r], as vLLM's
    MergedColumnParallelLinear loads the fused tensor (each half split by its own rows)."""
    whole = Col("mlp.gate_up_proj.weight", INTER)
    halves = (intermediate, intermediate)
    return {
        "mlp.gate_up": Cat(Part(whole, halves, 0), Part(whole, halves, 1)),
        "mlp.down": Row("mlp.down_proj.weight", INTER),
    }


# Starcoder2: specs/blocks/fc_mlp.yaml, layer_norms_bias.yaml, lm_globals_bias.yaml.
FC_MLP: dict[str, Rule] = {
    "mlp.c_fc": Col("mlp.c_fc.weight", INTER),
    "mlp.c_fc_bias": Col("mlp.c_fc.bias", INTER),
    "mlp.c_proj": Row("mlp.c_proj.weight", INTER),
    "mlp.c_proj_bias": Rep("mlp.c_proj.bias"),  # RowParallelLinear: whole, added once
}
NORMS_BIAS: dict[str, Rule] = NORMS | {
    "norms.input_norm_bias": Rep("input_layernorm.bias"),
    "norms.post_attention_norm_bias": Rep("post_attention_layernorm.bias"),
}
LM_GLOBALS_BIAS: dict[str, Rule] = LM_GLOBALS | {"norm_bias": Rep("model.norm.bias")}
O_BIAS: dict[str, Rule] = {"attention.o_bias": Rep("self_attn.o_proj.bias")}
# specs/blocks/up_down_mlp.yaml (Nemotron, Arcee): ColumnParallelLinear up, RowParallel down.
UP_DOWN: dict[str, Rule] = {
    "mlp.up": Col("mlp.up_proj.weight", INTER),
    "mlp.down": Row("mlp.down_proj.weight", INTER),
}
