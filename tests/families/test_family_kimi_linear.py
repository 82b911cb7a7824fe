"""Kimi Linear binds from YAML alone: a checkpoint transformers' ``KimiLinearForCausalLM``
writes with ``save_pretrained`` (``kimi_model.write_kimi_checkpoint``) binds through
``specs/models/kimi-linear.yaml`` and the blocks it names, with no Kimi-specific Python.

Claims:
* ``audit`` accounts for every tensor, and each layer's blocks follow config.json's
  ``layer_types`` / ``mlp_layer_types``;
* ``bind`` binds every tensor at every tp (1, 2, 4: MLA's 4 heads) and ep (1 to 6 experts)
  and each rank's shares rejoin to the single-rank fields; tp 8 is refused, naming the heads;
* every bound field equals what transformers' loaded modules hold: A_log stored [1, 1, H, 1]
  binds as [H], the Mixtral-named experts (w1 gate, w3 up, w2 down) as transformers' own
  fused gate_up_proj / down_proj, the dense MLP from ``block_sparse_moe.``, q_rope and
  kv_a_proj bit for bit;
* the MLA absorbs are within one BF16 ulp of an f64 reference from the loaded modules, on
  every tp rank (rank r holds heads [r·H/tp, (r+1)·H/tp));
* the semantic MoE check: the bound fields' MoE, summed over (tp, ep) ranks, equals
  transformers' KimiLinearMoE on inputs whose routing is not a near-tie;
* the hub's own dense names (``mlp.``) bind to the same fields as transformers' resaved
  ``block_sparse_moe.``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from family_checks import schedule_decided
from helpers import cached_binds, rejoin
from kimi_model import CONFIG, KDA_LAYERS, MLA_LAYERS, SPARSE_LAYERS, load_kimi_model
from whole_model import (
    Routing,
    expert_range,
    module_output,
    moe_forward,
    read_checkpoint,
    routing_margin,
    write_safetensors,
)

from specbind.audit import audit
from specbind.core.dtypes import within_one_bf16_ulp
from specbind.core.errors import GeometryError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)
if not hasattr(transformers, "KimiLinearForCausalLM"):
    pytest.skip("this transformers has no kimi_linear model", allow_module_level=True)

pytestmark = pytest.mark.interop

TABLE = MODELS["kimi-linear"]
E = CONFIG["num_local_experts"]
H = CONFIG["num_attention_heads"]
RANKS = [(tp, ep) for tp in (1, 2, 4) for ep in range(1, E + 1)]
REL_TOL = 1e-4  # float64 reference vs the float32 module: see test_mlp_reference's docstring
MIN_MARGIN = 1e-4


@pytest.fixture(scope="session")
def kimi_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kimi_model import write_kimi_checkpoint

    path = tmp_path_factory.mktemp("kimi_linear")
    write_kimi_checkpoint(path, seed=0)
    return path


@pytest.fixture(scope="module")
def model(kimi_ckpt: Path) -> Any:
    return load_kimi_model(kimi_ckpt)


@pytest.fixture(scope="module")
def bind_at(kimi_ckpt: Path) -> Callable[[int, int, int, int], BindResult]:
    return cached_binds(kimi_ckpt, TABLE)


def test_audit_accounts_for_every_tensor_and_follows_the_layer_types(kimi_ckpt: Path) -> None:
    rep = audit(CheckpointDir(kimi_ckpt), TABLE, progress=False)
    names = read_checkpoint(kimi_ckpt)
    assert any(".block_sparse_moe.experts.0.w1.weight" in n for n in names), "hub expert names"
    assert names["model.layers.0.self_attn.A_log"].shape == (1, 1, 8, 1)
    assert rep["coverage"] == {"bound": len(names), "declared_unbound": 0, "unaccounted": 0}
    assert rep["problems"] == []
    config = json.loads((kimi_ckpt / "config.json").read_text())
    roles = {r["index"]: {s: v["block"] for s, v in r["slots"].items()} for r in rep["layers"]}
    for i, (attn, mlp) in enumerate(
        zip(config["layer_types"], config["mlp_layer_types"], strict=True)
    ):
        assert roles[i]["attention"] == {"full_attention": "mla", "linear_attention": "kda"}[attn]
        assert roles[i]["mlp"] == {"sparse": "moe", "dense": "dense"}[mlp]
    assert [i for i in roles if roles[i]["attention"] == "mla"] == list(MLA_LAYERS)
    # vLLM's rules (1-based kda_layers, first_k_dense_replace) decide every slot they cover
    assert schedule_decided(TABLE, config, roles) == 2 * len(roles)


@pytest.mark.parametrize(("tp", "ep"), RANKS, ids=[f"tp{t}-ep{e}" for t, e in RANKS])
def test_every_tensor_binds_at_every_tp_and_ep_and_the_shares_rejoin(
    kimi_ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult], tp: int, ep: int
) -> None:
    whole = bind_at(1, 0, 1, 0)
    seen = sum(s.report.seen for _, s in whole.slots())
    assert seen == len(read_checkpoint(kimi_ckpt)), "every tensor is bound at tp = ep = 1"
    full = {k: a for k, (_, a) in whole.fields().items()}
    shares = {(r, e): bind_at(tp, r, ep, e).fields() for r in range(tp) for e in range(ep)}
    rules = {k: rule for k, (rule, _) in shares[(0, 0)].items()}
    assert set(rules) == set(full)
    for name, want in full.items():
        got = rejoin(rules[name], {k: v[name][1] for k, v in shares.items()}, tp, ep)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
    base, rem = divmod(E, ep)
    w13 = shares[(0, ep - 1)][f"layers.{SPARSE_LAYERS[0]}.mlp.w13"][1]
    assert w13.shape == (base + (ep - 1 < rem), 2 * CONFIG["moe_intermediate_size"] // tp, 48)


def test_a_tp_past_what_the_geometry_allows_is_refused_in_one_line(kimi_ckpt: Path) -> None:
    """tp 8: KDA's scan tile (and MLA's 4 heads) do not split; refused before any read."""
    with pytest.raises(GeometryError) as e:
        bind_checkpoint(CheckpointDir(kimi_ckpt), TABLE, tp_size=8, tp_rank=0, progress=False)
    assert "tp=8" in str(e.value) and "\n" not in str(e.value)


def _same(bound: Any, theirs: Any) -> bool:
    """Equal values, bit for bit, through an exact widening to F64."""
    ours = np.asarray(bound)
    assert ours.dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)), ours.dtype
    t = theirs.detach().double().numpy()
    return ours.shape == t.shape and bool(np.array_equal(ours.astype(np.float64), t))


def test_bound_fields_equal_what_transformers_loads(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    bound = bind_at(1, 0, 1, 0)
    cfg = model.config
    kvl = cfg.kv_lora_rank
    for x in bound.layers:
        layer = model.model.layers[x.index]
        norms = x.slots["norms"].weights.arrays()
        assert _same(norms["input_norm"], layer.input_layernorm.weight)
        assert _same(norms["post_attention_norm"], layer.post_attention_layernorm.weight)
        attn, a = layer.self_attn, x.slots["attention"].weights.arrays()
        if x.index in KDA_LAYERS:
            fg = attn.forget_gate
            assert a["a_log"].dtype == np.float32 and a["a_log"].shape == (8,)
            assert _same(a["a_log"], fg.A_log.reshape(-1)), "[1, 1, H, 1] binds as [H]"
            assert a["dt_bias"].dtype == np.float32 and _same(a["dt_bias"], fg.dt_bias)
            assert _same(a["f_a"], fg.f_a_proj.weight) and _same(a["f_b"], fg.f_b_proj.weight)
            assert _same(a["conv"], attn.conv1d.weight.squeeze(1)), "[q; k; v] as transformers"
            for f in ("q_proj", "k_proj", "v_proj", "b_proj", "o_proj"):
                assert _same(a[f], getattr(attn, f).weight), (x.index, f)
            assert _same(a["g_a"], attn.g_a_proj.weight) and _same(a["g_b"], attn.g_b_proj.weight)
            assert _same(a["o_norm"], attn.o_norm.weight)
        else:
            n, r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
            q = attn.q_proj.weight.reshape(H, n + r, -1)
            assert _same(a["q_rope"], q[:, n:].reshape(H * r, -1)), "each head's rope rows"
            assert _same(a["kv_a_proj"], attn.kv_a_proj_with_mqa.weight)
            assert a["kv_a_proj"].shape == (kvl + r, 48), "latent rows, then the rope key"
            assert _same(a["kv_a_layernorm"], attn.kv_a_layernorm.weight)
        mlp, m = layer.mlp, x.slots["mlp"].weights.arrays()
        if x.index not in SPARSE_LAYERS:
            gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
            assert _same(m["gate_up"], gate_up) and _same(m["down"], mlp.down_proj.weight)
            continue
        assert _same(m["router"], mlp.gate.weight)
        assert m["router_bias"].dtype == np.float32
        assert _same(m["router_bias"], mlp.gate.e_score_correction_bias)
        # transformers merges w1 and w3 as [gate; up] per expert: w13's layout
        assert _same(m["w13"], mlp.experts.gate_up_proj), x.index
        assert _same(m["w2"], mlp.experts.down_proj), x.index
        shared = mlp.shared_experts
        assert _same(
            m["shared_gate_up"], torch.cat([shared.gate_proj.weight, shared.up_proj.weight])
        )
        assert _same(m["shared_down"], shared.down_proj.weight)
    assert bound.globals is not None
    g = bound.globals.weights.arrays()
    assert _same(g["embed_tokens"], model.model.embed_tokens.weight)
    assert _same(g["norm"], model.model.norm.weight)
    assert _same(g["lm_head"], model.lm_head.weight)


def _reference(attn: Any, cfg: Any) -> dict[str, Any]:
    """The absorbs in float64 from the loaded module's weights (every value exact)."""
    n, r, v, kvl = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    qb = attn.q_proj.weight.detach().numpy().reshape(H, n + r, -1)  # [H(N+R), X] -> [H, N+R, X]
    kv_b = attn.kv_b_proj.weight.detach().numpy().reshape(H, n + v, kvl)  # -> [H, N+V, KVL]
    o = attn.o_proj.weight.detach().numpy().reshape(-1, H, v)  # [X, HV] -> [X, H, V]
    return {
        "q_absorb": np.einsum("hrc,hrk->hck", kv_b[:, :n], qb[:, :n]),  # [H, KVL, X]
        "o_absorb": np.einsum("ihr,hrc->ihc", o, kv_b[:, n:]),  # [X, H, KVL]
    }


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_mla_absorbs_are_within_one_bf16_ulp_of_an_f64_reference_on_every_rank(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult], tp: int
) -> None:
    cfg = model.config
    kvl, per = cfg.kv_lora_rank, H // tp
    for layer in MLA_LAYERS:
        ref = _reference(model.model.layers[layer].self_attn, cfg)
        for r in range(tp):
            heads = slice(r * per, (r + 1) * per)
            a = bind_at(tp, r, 1, 0).layers[layer].slots["attention"].weights.arrays()
            want_q = ref["q_absorb"][heads].reshape(per * kvl, -1)  # [h, KVL, X] -> [h·KVL, X]
            want_o = ref["o_absorb"][:, heads].reshape(-1, per * kvl)  # -> [X, h·KVL]
            assert a["q_absorb"].dtype == np.dtype(ml_dtypes.bfloat16)
            assert a["q_absorb"].shape == want_q.shape and a["o_absorb"].shape == want_o.shape
            assert within_one_bf16_ulp(a["q_absorb"], want_q), (layer, tp, r)
            assert within_one_bf16_ulp(a["o_absorb"], want_o), (layer, tp, r)
            # and not trivially: the rounding really happened somewhere
            assert not np.array_equal(a["q_absorb"].astype(np.float64), want_q)


def _routing(config: dict[str, Any]) -> Routing:
    """Kimi's config.json names for the router (not GLM's): plain SiLU, so no clamp."""
    return Routing(
        top_k=int(config["num_experts_per_token"]),
        n_group=int(config["num_expert_group"]),
        topk_group=int(config["topk_group"]),
        norm_topk_prob=bool(config["moe_renormalize"]),
        routed_scaling_factor=float(config["routed_scaling_factor"]),
        swiglu_limit=float("inf"),
    )


@pytest.mark.parametrize(
    ("tp", "ep"), [(1, 1), (2, 3), (4, 2)], ids=["tp1-ep1", "tp2-ep3", "tp4-ep2"]
)
def test_moe_from_the_bound_fields_summed_over_ranks_equals_transformers_moe(
    kimi_ckpt: Path, model: Any, bind_at: Callable[[int, int, int, int], BindResult], tp: int,
    ep: int,
) -> None:  # fmt: skip
    routing = _routing(json.loads((kimi_ckpt / "config.json").read_text()))
    assert routing.routed_scaling_factor != 1.0 and routing.norm_topk_prob
    rng = np.random.default_rng(7)
    for layer in SPARSE_LAYERS:
        x = rng.standard_normal((64, 48)).astype(ml_dtypes.bfloat16).astype(np.float64)
        whole = bind_at(1, 0, 1, 0).layers[layer].slots["mlp"].weights.arrays()
        margin = routing_margin(x, whole["router"], whole["router_bias"], routing)
        x = x[margin >= MIN_MARGIN]
        assert len(x) >= 48, "most tokens are not near-ties"
        total = np.zeros_like(x)
        for r in range(tp):
            for e in range(ep):
                f = bind_at(tp, r, ep, e).layers[layer].slots["mlp"].weights.arrays()
                start, _ = expert_range(E, ep, e)
                total += moe_forward(x, f, start, routing, include_shared=e == 0)
        want = module_output(model.model.layers[layer].mlp, x)
        err = float(np.abs(total - want).max()) / float(np.abs(want).max())
        assert err <= REL_TOL, (layer, err)
        # a swapped [up; gate] (silent in shapes) misses by far more than the tolerance
        swapped = dict(whole)
        i = whole["w13"].shape[1] // 2
        swapped["w13"] = np.concatenate([whole["w13"][:, i:], whole["w13"][:, :i]], axis=1)
        bad = moe_forward(x, swapped, 0, routing, include_shared=True)
        assert float(np.abs(bad - want).max()) / float(np.abs(want).max()) > 100 * REL_TOL


def test_the_hub_dense_names_bind_to_the_same_fields(
    kimi_ckpt: Path, tmp_path: Path, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    """The hub and vLLM name layer 0's dense MLP ``mlp.``; transformers re-saves it under
    ``block_sparse_moe.``. Both are read; a checkpoint holding both is refused."""
    hub = tmp_path / "hub"
    shutil.copytree(kimi_ckpt, hub)
    (shard,) = hub.glob("*.safetensors")
    tensors = read_checkpoint(hub)
    renamed = {
        k.replace("layers.0.block_sparse_moe.", "layers.0.mlp."): v for k, v in tensors.items()
    }
    assert "model.layers.0.mlp.gate_proj.weight" in renamed
    write_safetensors(shard, renamed, {"format": "pt"})
    (hub / "model.safetensors.index.json").unlink(missing_ok=True)
    got = bind_checkpoint(CheckpointDir(hub), TABLE, progress=False).fields()
    want = bind_at(1, 0, 1, 0).fields()
    assert set(got) == set(want)
    for k, (_, a) in got.items():
        assert a.tobytes() == want[k][1].tobytes(), k
    both = dict(renamed)
    both["model.layers.0.block_sparse_moe.gate_proj.weight"] = renamed[
        "model.layers.0.mlp.gate_proj.weight"
    ]
    write_safetensors(shard, both, {"format": "pt"})
    with pytest.raises(Exception, match="refusing to guess"):
        bind_checkpoint(CheckpointDir(hub), TABLE, progress=False)
