"""A tiny gpt-oss checkpoint, written by transformers' own ``GptOssForCausalLM.save_pretrained``.

Every tensor is seeded N(0, 0.05), BF16 (gpt-oss keeps nothing in F32). Sizes are pairwise
different: hidden 64, vocab 160, heads 8, kv_heads 2, head_dim 12, experts 6, expert
intermediate 128 (whole 32-element MXFP4 groups at tp 1, 2 and 4). Layers alternate sliding and
full attention (config.json ``layer_types``). Only tp 1 and 2 split the 2 KV heads (a tp above
them needs KV replication, which this spec does not declare).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hf_random import load_f64, write_random

CONFIG: dict[str, Any] = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=128,
    head_dim=12,
    num_attention_heads=8,
    num_key_value_heads=2,
    num_local_experts=6,
    num_experts_per_tok=2,
    num_hidden_layers=2,
    tie_word_embeddings=False,
)
_NONE = re.compile(r"(?!)")  # no tensor is kept in F32


def write_gpt_oss_checkpoint(path: Path, seed: int = 0) -> None:
    import transformers

    write_random(
        transformers.GptOssForCausalLM, transformers.GptOssConfig, CONFIG, path, _NONE, seed
    )


def load_gpt_oss_model(path: Path) -> Any:
    import transformers

    return load_f64(transformers.GptOssForCausalLM, path)
