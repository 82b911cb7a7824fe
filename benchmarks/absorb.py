"""Absorb throughput: a block's generated contracting transforms beside plain NumPy matmul on
the same shapes, and (where the baseline folder transcribes one) beside the hand-written
loader's loop order, in one run.

Generic over blocks: the transforms are the block module's ``make_<field>`` functions for its
``transform`` fields, their operands random arrays of this rank's planned shapes and dtypes,
and the matmul baseline replays exactly the [B, L, C] @ [B, C, R] products ``ops.contract``
recorded. A block with no contraction (only copies and unary transforms) has no row.
Trap: the operands are random, so only the speed is meaningful here; the values are the
tests' business.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from specbind.core.dtypes import DTYPES
from specbind.runtime.binder import ops

F32 = np.float32
Arr = np.ndarray[Any, Any]


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up: page in, allocate, let BLAS spin up its threads
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def operands(block: Any, g: Any, fields: list[str], rank: int) -> dict[str, Arr]:
    """Random arrays, at this rank's planned shape and the bound dtype, of every tensor the
    ``fields`` read."""
    rng = np.random.default_rng(0)
    plan = block.plan(g, rank)
    dtypes = {r.name: r.dtype for r in block.TENSORS}
    out: dict[str, Arr] = {}
    for f in fields:
        for name in block.SOURCES[f]:
            shape = plan.tensors[name].local_shape
            np_dtype = DTYPES[dtypes[name]].numpy
            assert np_dtype is not None
            out[name] = (rng.standard_normal(shape, dtype=F32) * 0.02).astype(np_dtype)
    return out


def run(
    block: Any,
    g: Any,
    rank: int = 0,
    repeat: int = 3,
    seed: Callable[[Any, Any], tuple[Callable[[], Arr], int]] | None = None,
) -> dict[str, Any] | None:
    """GFLOP/s of the block's contracting transforms, of matmul on the same F32 operands, and of
    ``seed`` (the hand-written order of its first absorb) when given; None when the block
    contracts nothing.

    ``block`` is the generated block module, handed over by the caller: the runtime never
    imports ``generated`` at module level. ``seed`` times the first contracting field."""
    fields = [f for f, r in block.FIELDS.items() if r.kind == "transform"]
    t = operands(block, g, fields, rank)
    contracting = []
    for f in fields:  # the unary transforms (a scale, a cast, a slice) are not absorbs
        with ops.counting() as one:
            getattr(block, f"make_{f}")(g, t)
        if one.flops:
            contracting.append(f)
    if not contracting:
        return None
    fields = contracting
    makers = [getattr(block, f"make_{f}") for f in fields]
    with ops.counting() as stats:
        for make in makers:
            make(g, t)
    flops = stats.flops
    absorb_s = median_seconds(lambda: [make(g, t) for make in makers], repeat)
    pairs = [
        (np.ones((b, left, c), dtype=F32), np.ones((b, c, right), dtype=F32))
        for b, left, c, right in stats.products
    ]
    matmul_s = median_seconds(lambda: [np.matmul(x, y) for x, y in pairs], repeat)
    units = {r.shard.unit for r in block.TENSORS if r.name in {s for f in fields for s in
             block.SOURCES[f]} and r.shard.unit is not None}  # fmt: skip
    unit = sorted(units)[0] if units else None
    out: dict[str, Any] = {
        "geometry": {
            "block": block.BLOCK,
            "tp": g.tp,
            "rank": rank,
            "unit": unit,
            "heads_on_rank": g.values()[unit] // g.tp if unit else None,
            **{k: v for k, v in g.values().items() if k not in ("tp", "ep")},
        },
        "gflop": flops / 1e9,
        "absorb_seconds": absorb_s,
        "matmul_seconds": matmul_s,
        "absorb_gflops": flops / absorb_s / 1e9,
        "matmul_gflops": flops / matmul_s / 1e9,
        "absorb_over_matmul": matmul_s / absorb_s,
    }
    if seed is not None:
        seed_run, q_flops = seed(t, g)
        seed_s = median_seconds(seed_run, 1)
        ours_q = median_seconds(lambda: makers[0](g, t), repeat)
        out |= {
            "seed_order_q_absorb_gflops": q_flops / seed_s / 1e9,
            "specbind_q_absorb_gflops": q_flops / ours_q / 1e9,
            "specbind_over_seed_order": seed_s / ours_q,
        }
    return out
