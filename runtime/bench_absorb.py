"""Absorb throughput: specbind's generated DSA transforms beside plain NumPy matmul on the same
shapes, and beside a transcription of the hand-written loader's loop order, in one run.

The seed loader computes ``q_absorb`` output row by output row (one head, one latent channel),
accumulating over r inside the row; the transcription keeps that order with one BLAS ``gemv``
per output row (a pure-Python inner loop would measure the interpreter, not the order).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from specbind.runtime import ops

F32 = np.float32


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up: page in, allocate, let BLAS spin up its threads
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


Arr = np.ndarray[Any, Any]


def seed_q_absorb(kv_b: Arr, q_b: Arr, g: Any, heads: int) -> Arr:
    """The seed's loop order: per output row (h, c), Σ_r kv_b[h, r, c] · q_b[h, r, :]."""
    kv = kv_b.reshape(heads, g.N + g.V, g.KVL)  # [H(N+V), KVL] -> [H, N+V, KVL]
    qb = q_b.reshape(heads, g.N, g.QL)  # [HN, QL] -> [H, N, QL]
    out = np.empty((heads * g.KVL, g.QL), dtype=F32)
    for h in range(heads):
        k_half = kv[h, : g.N]  # [N, KVL]
        for c in range(g.KVL):
            out[h * g.KVL + c] = k_half[:, c] @ qb[h]  # one row: Σ_r w_r · q_row_r
    return out


def run(dsa: Any, g: Any, rank: int = 0, repeat: int = 3, seed_rows: bool = True) -> dict[str, Any]:
    """GFLOP/s of the generated absorbs, of matmul on the same F32 operands, of the seed order.

    ``dsa`` is the generated MLA block module (with ``make_q_absorb`` / ``make_o_absorb``),
    handed over by the caller: the runtime never imports ``generated`` at module level."""
    heads = g.H // g.tp
    rng = np.random.default_rng(0)

    def bf16(*shape: int) -> np.ndarray[Any, Any]:
        return (rng.standard_normal(shape, dtype=F32) * 0.02).astype(ml_dtypes.bfloat16)

    t = {
        "self_attn.kv_b_proj.weight": bf16(heads * (g.N + g.V), g.KVL),
        "self_attn.q_b_proj.weight": bf16(heads * g.N, g.QL),
        "self_attn.o_proj.weight": bf16(g.X, heads * g.V),
    }
    with ops.counting() as stats:
        dsa.make_q_absorb(g, t)
        dsa.make_o_absorb(g, t)
    flops = stats.flops
    absorb_s = median_seconds(lambda: (dsa.make_q_absorb(g, t), dsa.make_o_absorb(g, t)), repeat)

    kv = t["self_attn.kv_b_proj.weight"].astype(F32).reshape(heads, g.N + g.V, g.KVL)
    qb = t["self_attn.q_b_proj.weight"].astype(F32).reshape(heads, g.N, g.QL)
    o = t["self_attn.o_proj.weight"].astype(F32).reshape(g.X, heads, g.V).transpose(1, 0, 2)
    k_t = np.ascontiguousarray(kv[:, : g.N].transpose(0, 2, 1))  # [H, KVL, N]
    v_h = np.ascontiguousarray(kv[:, g.N :])  # [H, V, KVL]
    o_h = np.ascontiguousarray(o)  # [H, X, V]
    matmul_s = median_seconds(lambda: (np.matmul(k_t, qb), np.matmul(o_h, v_h)), repeat)

    out: dict[str, Any] = {
        "geometry": {
            "H": g.H,
            "tp": g.tp,
            "rank": rank,
            "heads_on_rank": heads,
            "X": g.X,
            "QL": g.QL,
            "KVL": g.KVL,
            "N": g.N,
            "V": g.V,
        },
        "gflop": flops / 1e9,
        "absorb_seconds": absorb_s,
        "matmul_seconds": matmul_s,
        "absorb_gflops": flops / absorb_s / 1e9,
        "matmul_gflops": flops / matmul_s / 1e9,
        "absorb_over_matmul": matmul_s / absorb_s,
    }
    if seed_rows:
        q_flops = 2 * heads * g.KVL * g.N * g.QL
        kv_b = t["self_attn.kv_b_proj.weight"].astype(F32)
        q_b = t["self_attn.q_b_proj.weight"].astype(F32)
        seed_s = median_seconds(lambda: seed_q_absorb(kv_b, q_b, g, heads), 1)
        ours_q = median_seconds(lambda: dsa.make_q_absorb(g, t), repeat)
        out |= {
            "seed_order_q_absorb_gflops": q_flops / seed_s / 1e9,
            "specbind_q_absorb_gflops": q_flops / ours_q / 1e9,
            "specbind_over_seed_order": seed_s / ours_q,
        }
    return out
