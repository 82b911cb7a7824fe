"""Checks shared by the model-family tests (test_family_*.py): a bound field against a loaded
transformers tensor, and the MoE reference summed over every (tp, ep) rank's bound fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
from whole_model import Routing, expert_range, moe_forward, routing_margin

MIN_MARGIN = 1e-4  # a routing decided by less is a near-tie, not a layout test


def same_values(bound: Any, theirs: Any) -> bool:
    """Equal values, bit for bit, through an exact widening to F64 (theirs: a torch tensor)."""
    ours = np.asarray(bound)
    assert ours.dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)), ours.dtype
    t = theirs.detach().double().numpy()
    return ours.shape == t.shape and bool(np.array_equal(ours.astype(np.float64), t))


def decisive_inputs(fields: dict[str, Any], routing: Routing, hidden: int, seed: int) -> Any:
    """BF16-exact inputs [T, hidden] whose routing is no near-tie under the bound router."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, hidden)).astype(ml_dtypes.bfloat16).astype(np.float64)
    margin = routing_margin(x, fields["router"], fields["router_bias"], routing)
    return x[margin >= MIN_MARGIN]


def moe_rank_sum(
    x: Any, mlp_of: Callable[[int, int], dict[str, Any]], tp: int, ep: int, routing: Routing
) -> Any:
    """Σ over (tp, ep) ranks of each rank's MoE from its bound fields; the shared experts on ep
    rank 0 of every tp rank. ``mlp_of(r, e)`` gives rank (r, e)'s fields."""
    total = np.zeros_like(x)
    for r in range(tp):
        for e in range(ep):
            f = mlp_of(r, e)
            start, _ = expert_range(f["router"].shape[0], ep, e)
            total += moe_forward(x, f, start, routing, include_shared=e == 0)
    return total


def rel_err(got: Any, want: Any) -> float:
    return float(np.abs(got - want).max()) / float(np.abs(want).max())
