"""The seed loader's loop order for an absorb, transcribed as a baseline: per output row (one
head, one latent channel), accumulating over r inside the row, one BLAS ``gemv`` per output
row (a pure-Python inner loop would measure the interpreter, not the order).

Keyed by block: the hand-written loader knew GLM-5.3-Flash's DSA by hand, and so does this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

Arr = np.ndarray[Any, Any]
F32 = np.float32


def dsa_q_absorb(t: Mapping[str, Arr], g: Any) -> tuple[Callable[[], Arr], int]:
    """The seed's q_absorb on the operands ``t`` (this rank's), and its multiply-add count x 2:
    per output row (h, c), Σ_r kv_b[h, r, c] · q_b[h, r, :]."""
    heads = g.heads // g.tp
    kv = (
        t["self_attn.kv_b_proj.weight"]
        .astype(F32)
        .reshape(heads, g.qk_nope_head_dim + g.v_head_dim, g.kv_lora_rank)
    )  # [H(N+V), KVL] -> [H, N+V, KVL]
    qb = (
        t["self_attn.q_b_proj.weight"].astype(F32).reshape(heads, g.qk_nope_head_dim, g.q_lora_rank)
    )  # [HN, QL] -> [H, N, QL]

    def run() -> Arr:
        out = np.empty((heads * g.kv_lora_rank, g.q_lora_rank), dtype=F32)
        for h in range(heads):
            k_half = kv[h, : g.qk_nope_head_dim]  # [N, KVL]
            for c in range(g.kv_lora_rank):
                out[h * g.kv_lora_rank + c] = k_half[:, c] @ qb[h]  # one row: Σ_r w_r · q_row_r
        return out

    return run, 2 * heads * g.kv_lora_rank * g.qk_nope_head_dim * g.q_lora_rank


# block -> the seed order of its first absorb
SEED_ORDER: dict[str, Callable[[Mapping[str, Arr], Any], tuple[Callable[[], Arr], int]]] = {
    "dsa": dsa_q_absorb,
}
