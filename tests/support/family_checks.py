"""Checks shared by the model-family tests (test_family_*.py): a bound field against a loaded
transformers tensor, and the MoE reference summed over every (tp, ep) rank's bound fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
from whole_model import Routing, expert_range, moe_forward, routing_margin

MIN_MARGIN = 1e-4  # a routing decided by less is a near-tie, not a layout test


def schedule_decided(table: Any, config: dict[str, Any], roles: dict[int, dict[str, str]]) -> int:
    """How many (layer, slot) pairs the spec's schedules decide over this config.json, each
    asserted equal to the block the layer's names give (``roles``: audit's layer -> slot ->
    block); a schedule that cannot read the file (a field missing without a default) fails."""
    from specbind.core.schedule import ConfigSchedule
    from specbind.runtime.layout.config import config_lookup

    cs = ConfigSchedule(table.slots, lambda name: config_lookup(config, name))
    assert cs.problems == []
    decided = 0
    for slot in (s for s in table.slots if s.schedule):
        for i, blocks in roles.items():
            got = cs.scheduled(slot.schedule, i)
            assert got is not None, f"layer {i}: the {slot.name} schedule reads no decision"
            assert got[0] == blocks[slot.name], (i, got)
            decided += 1
    return decided


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


def check_rope_aware_absorbs(
    model: Any, bind_at: Callable[[int, int, int, int], Any], tp: int, config: dict[str, Any]
) -> None:
    """Every layer's MLA fields on every tp rank against transformers' module (DeepSeek-V3 and
    V3.2 alike): q_absorb (nope rows) and o_absorb within one BF16 ulp of f64; q_rope, the
    latent and the rope key bit for bit; rank r holds heads [r·H/tp, (r+1)·H/tp)."""
    from specbind.core.dtypes import within_one_bf16_ulp

    h_all, x = config["num_attention_heads"], config["hidden_size"]
    n, r_dim = config["qk_nope_head_dim"], config["qk_rope_head_dim"]
    v, kvl = config["v_head_dim"], config["kv_lora_rank"]
    per = h_all // tp
    for layer in range(config["num_hidden_layers"]):
        attn = model.model.layers[layer].self_attn
        qb = attn.q_b_proj.weight.detach().numpy().reshape(h_all, n + r_dim, -1)  # [H, N+R, QL]
        kv_b = attn.kv_b_proj.weight.detach().numpy().reshape(h_all, n + v, kvl)  # [H, N+V, KVL]
        o = attn.o_proj.weight.detach().numpy().reshape(x, h_all, v)  # [X, HV] -> [X, H, V]
        q_absorb = np.einsum("hrc,hrk->hck", kv_b[:, :n], qb[:, :n])  # [H, KVL, QL]
        o_absorb = np.einsum("ihr,hrc->ihc", o, kv_b[:, n:])  # [X, H, KVL]
        kv_a = attn.kv_a_proj_with_mqa.weight.detach().numpy()
        for r in range(tp):
            heads = slice(r * per, (r + 1) * per)
            a = bind_at(tp, r, 1, 0).layers[layer].slots["attention"].weights.arrays()
            want_q = q_absorb[heads].reshape(per * kvl, -1)  # [h, KVL, QL] -> [h·KVL, QL]
            assert a["q_absorb"].shape == want_q.shape
            assert within_one_bf16_ulp(a["q_absorb"], want_q), (layer, tp, r)
            want_o = o_absorb[:, heads].reshape(x, per * kvl)  # [X, h, KVL] -> [X, h·KVL]
            assert a["o_absorb"].shape == want_o.shape
            assert within_one_bf16_ulp(a["o_absorb"], want_o), (layer, tp, r)
            rope = qb[heads, n:].reshape(per * r_dim, -1)  # [h, R, QL] -> [h·R, QL]
            assert np.array_equal(a["q_rope"].astype(np.float64), rope), "the rope rows"
            assert np.array_equal(a["kv_a_latent"].astype(np.float64), kv_a[:kvl])
            assert np.array_equal(a["k_rope"].astype(np.float64), kv_a[kvl:])
