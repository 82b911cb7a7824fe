"""Qwen3-MoE binds from YAML alone (``specs/models/qwen3-moe.yaml``): the ``gqa`` block with its
optional q_norm/k_norm group, and the ``moe`` block without its optional correction-bias and
shared-expert groups, for a checkpoint transformers' ``Qwen3MoeForCausalLM`` writes.

Claims:
* ``audit`` accounts for every tensor, and reports no optional group as missing in error;
* with 2 KV heads and 6 experts, every tp in 1, 2, 4, 8 and ep in 1, 2, 3 binds; the shares
  rejoin (k/v replicated on tp / 2 ranks at tp 4 and 8, rank r holding KV head r // (tp / 2));
* every bound field equals the loaded module's parameter (q_norm/k_norm; transformers' fused
  experts.gate_up_proj / down_proj as w13 / w2; the router as ``router``);
* the semantic checks: attention with q/k norms, and the softmax-routed MoE, each computed
  from every rank's bound fields and summed over ranks, equal transformers' modules.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_checks import rel_err, same_values, schedule_decided
from gqa_model import (
    QWEN3_MOE,
    attention_rank,
    bf16,
    load,
    module_attention,
    moe_rank,
    rejoin_replicated,
    rotary,
    route,
    write_qwen3_moe,
)
from helpers import cached_binds
from whole_model import expert_range, module_output, read_checkpoint

from specbind.audit import audit
from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
pytest.importorskip("transformers", exc_type=ImportError)

pytestmark = pytest.mark.interop

TABLE = MODELS["qwen3-moe"]
KV = QWEN3_MOE["num_key_value_heads"]
D = QWEN3_MOE["head_dim"]
E = QWEN3_MOE["num_experts"]
TOP_K = QWEN3_MOE["num_experts_per_tok"]
RANKS = [(tp, ep) for tp in (1, 2, 4, 8) for ep in (1, 2, 3)]
REL_TOL = 1e-4
MIN_MARGIN = 1e-4  # a routing decided by less is a near-tie, not a layout test


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen3_moe(tmp_path_factory.mktemp("qwen3_moe") / "ck")


@pytest.fixture(scope="module")
def bind_at(ckpt: Path) -> Callable[[int, int, int, int], BindResult]:
    return cached_binds(ckpt, TABLE)


@pytest.fixture(scope="module")
def model(ckpt: Path) -> Any:
    return load(ckpt, "Qwen3MoeForCausalLM")


def test_audit_accounts_for_every_tensor(ckpt: Path) -> None:
    rep = audit(CheckpointDir(ckpt), TABLE, progress=False)
    names = read_checkpoint(ckpt)
    assert rep["coverage"] == {"bound": len(names), "declared_unbound": 0, "unaccounted": 0}
    assert rep["problems"] == []
    for r in rep["layers"]:
        assert r["slots"]["attention"]["block"] == "gqa"
        assert r["slots"]["attention"]["absent_optional_groups"] == []  # q/k norms present
        assert r["slots"]["mlp"]["block"] == "moe"
        assert sorted(r["slots"]["mlp"]["absent_optional_groups"]) == ["correction", "shared"]
    config = json.loads((ckpt / "config.json").read_text())
    roles = {r["index"]: {s: v["block"] for s, v in r["slots"].items()} for r in rep["layers"]}
    assert schedule_decided(TABLE, config, roles) == len(roles), "mlp_only_layers, sparse step"


@pytest.mark.parametrize(("tp", "ep"), RANKS, ids=[f"tp{t}-ep{e}" for t, e in RANKS])
def test_every_tp_and_ep_binds_and_the_shares_rejoin_or_replicate(
    bind_at: Callable[[int, int, int, int], BindResult], tp: int, ep: int
) -> None:
    full = {k: a for k, (_, a) in bind_at(1, 0, 1, 0).fields().items()}
    shares = {(r, e): bind_at(tp, r, ep, e).fields() for r in range(tp) for e in range(ep)}
    assert set(shares[(0, 0)]) == set(full)
    replicas = max(tp // KV, 1)
    for name, want in full.items():
        rule = shares[(0, 0)][name][0]
        kv = name.endswith((".k_proj", ".v_proj"))
        got = rejoin_replicated(
            rule, {k: v[name][1] for k, v in shares.items()}, tp, ep, replicas if kv else 1
        )
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
    if tp > KV:  # rank r's k rows are KV head r // (tp / KV), whole
        k = full["layers.1.attention.k_proj"]
        for r in range(tp):
            got = shares[(r, 0)]["layers.1.attention.k_proj"][1]
            h = r // replicas
            assert got.tobytes() == k[h * D : (h + 1) * D].tobytes(), r


def test_bound_fields_equal_the_loaded_modules(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    bound = bind_at(1, 0, 1, 0)
    for x in bound.layers:
        layer = model.model.layers[x.index]
        a, attn = x.slots["attention"].weights.arrays(), layer.self_attn
        for f in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            assert same_values(a[f], getattr(attn, f).weight), (x.index, f)
        m, mlp = x.slots["mlp"].weights.arrays(), layer.mlp
        assert same_values(m["router"], mlp.gate.weight)
        assert same_values(m["w13"], mlp.experts.gate_up_proj), "[gate; up] per expert"
        assert same_values(m["w2"], mlp.experts.down_proj)
        assert {"router_bias", "shared_gate_up", "shared_down"}.isdisjoint(m)


@pytest.mark.parametrize("tp", (1, 2, 4, 8))
def test_attention_with_qk_norms_summed_over_ranks_equals_transformers(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult], tp: int
) -> None:
    x = bf16(np.random.default_rng(tp).standard_normal((7, QWEN3_MOE["hidden_size"])))
    cos, sin = rotary(model, x.shape[0])
    want = module_attention(model.model.layers[0].self_attn, x, cos, sin)
    got = sum(
        attention_rank(
            bind_at(tp, r, 1, 0).layers[0].slots["attention"].weights.arrays(),
            x, cos, sin, D, QWEN3_MOE["rms_norm_eps"],
        )
        for r in range(tp)
    )  # fmt: skip
    assert rel_err(got, want) < REL_TOL


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 3), (8, 2)])
def test_moe_from_bound_fields_summed_over_ranks_equals_transformers(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult], tp: int, ep: int
) -> None:
    mlp = model.model.layers[1].mlp
    router = bind_at(1, 0, 1, 0).layers[1].slots["mlp"].weights.arrays()["router"]
    x = bf16(np.random.default_rng(7).standard_normal((64, QWEN3_MOE["hidden_size"])))
    x = x[route(x, router, TOP_K, True)[2] >= MIN_MARGIN]
    assert len(x) >= 32, "enough tokens whose routing is no near-tie"
    want = module_output(mlp, x)
    got = np.zeros_like(want)
    for r in range(tp):
        for e in range(ep):
            f = bind_at(tp, r, ep, e).layers[1].slots["mlp"].weights.arrays()
            got += moe_rank(x, f, expert_range(E, ep, e)[0], TOP_K, True)
    assert rel_err(got, want) < REL_TOL
