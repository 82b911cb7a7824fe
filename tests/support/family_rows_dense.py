"""Family rows for the dense families (tests/families/test_family_proofs.py collects every
``family_rows_*.py``'s ``ROWS``).

Each config: no two sizes equal (hidden, heads, kv_heads, head_dim, intermediate, vocab, and
the q rows heads·head_dim), 2 layers, 2 KV heads so k/v replicate at tp 4 and 8; vocab
divisible by every tp listed.
"""

from __future__ import annotations

from typing import Any

from family_layouts import LLAMA_LAYER, LM_GLOBALS
from family_semantics import attention, swiglu_mlp
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

ROWS: tuple[Family, ...] = (MISTRAL,)
