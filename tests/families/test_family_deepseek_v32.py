"""DeepSeek-V3.2 binds from YAML alone: a checkpoint transformers' ``DeepseekV32ForCausalLM``
writes with ``save_pretrained`` (``deepseek_model.write_deepseek_checkpoint``) binds through
``specs/models/deepseek-v3.2.yaml`` (the ``mla_indexed`` block, GLM's ``moe`` and ``dense``).

Claims:
* transformers keeps ``num_nextn_predict_layers: 1`` and writes no MTP layer, so the
  checkpoint binds as the decoder alone (``mtp=False``, ``--no-mtp``; test_mtp_layers.py
  covers the refusal without it and the hub's MTP layer);
* ``audit`` accounts for every tensor; ``bind`` binds every tensor at every tp (1, 2, 4: the
  4 heads) and ep (1 to 6) and each rank's shares rejoin to the single-rank fields;
* the RoPE-aware absorb: q_absorb over each head's nope rows of q_b_proj is within one BF16 ulp
  of an f64 reference on every tp rank, each head's rope rows are bound bit for bit as q_rope
  (rank r: heads [r·H/tp, (r+1)·H/tp)), and kv_a_proj_with_mqa's rows split into the latent
  and the shared rope key; o_absorb within one BF16 ulp; weights_proj scaled by IH^-0.5 in F32;
* every other field equals what transformers' loaded modules hold, the indexer included;
* the semantic MoE check (grouped routing, a shared expert) against DeepseekV32MoE;
* an FP8-block DeepSeek checkpoint (``synth --quant fp8-block``) binds every tensor once, its
  rope rows and latent read dequantized, and a tp that splits a 128 x 128 block is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from deepseek_model import CONFIG, SPARSE_LAYERS, load_deepseek_model
from family_checks import (
    check_rope_aware_absorbs,
    decisive_inputs,
    moe_rank_sum,
    rel_err,
    same_values,
    schedule_decided,
)
from helpers import cached_binds, rejoin
from whole_model import Routing, module_output, read_checkpoint

from specbind.audit import audit
from specbind.core.errors import SpecbindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)
if not hasattr(transformers, "DeepseekV32ForCausalLM"):
    pytest.skip("this transformers has no deepseek_v32 model", allow_module_level=True)

pytestmark = pytest.mark.interop

TABLE = MODELS["deepseek-v3.2"]
E, H, X = CONFIG["n_routed_experts"], CONFIG["num_attention_heads"], CONFIG["hidden_size"]
N, R, V = CONFIG["qk_nope_head_dim"], CONFIG["qk_rope_head_dim"], CONFIG["v_head_dim"]
KVL, IH = CONFIG["kv_lora_rank"], CONFIG["index_n_heads"]
RANKS = [(tp, ep) for tp in (1, 2, 4) for ep in range(1, E + 1)]
REL_TOL = 1e-4  # float64 reference vs the float32 module: see test_mlp_reference's docstring


@pytest.fixture(scope="session")
def deepseek_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from deepseek_model import write_deepseek_checkpoint

    path = tmp_path_factory.mktemp("deepseek_v32")
    write_deepseek_checkpoint(path, seed=0)
    return path


@pytest.fixture(scope="module")
def model(deepseek_ckpt: Path) -> Any:
    return load_deepseek_model(deepseek_ckpt)


@pytest.fixture(scope="module")
def bind_at(deepseek_ckpt: Path) -> Callable[[int, int, int, int], BindResult]:
    return cached_binds(deepseek_ckpt, TABLE, mtp=False)


def test_audit_accounts_for_every_tensor_and_follows_the_layer_types(deepseek_ckpt: Path) -> None:
    rep = audit(CheckpointDir(deepseek_ckpt), TABLE, progress=False, mtp=False)
    names = read_checkpoint(deepseek_ckpt)
    assert names["model.layers.0.self_attn.indexer.weights_proj.weight"].dtype == np.float32
    assert rep["coverage"] == {"bound": len(names), "declared_unbound": 0, "unaccounted": 0}
    assert rep["problems"] == []
    config = json.loads((deepseek_ckpt / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1, "the field is kept, the layer never written"
    roles = {r["index"]: {s: v["block"] for s, v in r["slots"].items()} for r in rep["layers"]}
    assert sorted(roles) == list(range(CONFIG["num_hidden_layers"]))
    for i, mlp in enumerate(config["mlp_layer_types"]):
        assert roles[i]["attention"] == "mla_indexed"
        assert roles[i]["mlp"] == {"sparse": "moe", "dense": "dense"}[mlp]
    assert schedule_decided(TABLE, config, roles) == len(roles), "first_k_dense_replace agrees"


@pytest.mark.parametrize(("tp", "ep"), RANKS, ids=[f"tp{t}-ep{e}" for t, e in RANKS])
def test_every_tensor_binds_at_every_tp_and_ep_and_the_shares_rejoin(
    deepseek_ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult], tp: int, ep: int
) -> None:
    whole = bind_at(1, 0, 1, 0)
    seen = sum(s.report.seen for _, s in whole.slots())
    assert seen == len(read_checkpoint(deepseek_ckpt)), "every tensor is bound at tp = ep = 1"
    full = {k: a for k, (_, a) in whole.fields().items()}
    shares = {(r, e): bind_at(tp, r, ep, e).fields() for r in range(tp) for e in range(ep)}
    rules = {k: rule for k, (rule, _) in shares[(0, 0)].items()}
    assert set(rules) == set(full)
    for name, want in full.items():
        got = rejoin(rules[name], {k: v[name][1] for k, v in shares.items()}, tp, ep)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_rope_aware_absorb_on_every_rank(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult], tp: int
) -> None:
    check_rope_aware_absorbs(model, bind_at, tp, CONFIG)


def test_bound_fields_equal_what_transformers_loads(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    bound = bind_at(1, 0, 1, 0)
    for x in bound.layers:
        layer = model.model.layers[x.index]
        norms = x.slots["norms"].weights.arrays()
        assert same_values(norms["input_norm"], layer.input_layernorm.weight)
        assert same_values(norms["post_attention_norm"], layer.post_attention_layernorm.weight)
        attn, a = layer.self_attn, x.slots["attention"].weights.arrays()
        assert same_values(a["q_a_proj"], attn.q_a_proj.weight)
        assert same_values(a["q_a_layernorm"], attn.q_a_layernorm.weight)
        assert same_values(a["kv_a_layernorm"], attn.kv_a_layernorm.weight)
        ix = attn.indexer
        assert same_values(a["wq_b"], ix.wq_b.weight) and same_values(a["wk"], ix.wk.weight)
        assert same_values(a["k_norm_weight"], ix.k_norm.weight)
        assert same_values(a["k_norm_bias"], ix.k_norm.bias)
        w = ix.weights_proj.weight.detach().numpy()
        assert a["weights_proj"].dtype == np.float32
        assert np.array_equal(a["weights_proj"], (w.astype(np.float32) * np.float32(IH**-0.5)))
        mlp, m = layer.mlp, x.slots["mlp"].weights.arrays()
        if x.index not in SPARSE_LAYERS:
            gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
            assert same_values(m["gate_up"], gate_up)
            assert same_values(m["down"], mlp.down_proj.weight)
            continue
        assert same_values(m["router"], mlp.gate.weight)
        assert same_values(m["router_bias"], mlp.gate.e_score_correction_bias)
        assert same_values(m["w13"], mlp.experts.gate_up_proj), x.index
        assert same_values(m["w2"], mlp.experts.down_proj), x.index
        sh = mlp.shared_experts
        assert same_values(m["shared_gate_up"], torch.cat([sh.gate_proj.weight, sh.up_proj.weight]))
        assert same_values(m["shared_down"], sh.down_proj.weight)
    assert bound.globals is not None
    g = bound.globals.weights.arrays()
    assert same_values(g["embed_tokens"], model.model.embed_tokens.weight)
    assert same_values(g["norm"], model.model.norm.weight)
    assert same_values(g["lm_head"], model.lm_head.weight)


@pytest.mark.parametrize(
    ("tp", "ep"), [(1, 1), (2, 3), (4, 2)], ids=["tp1-ep1", "tp2-ep3", "tp4-ep2"]
)
def test_moe_from_the_bound_fields_summed_over_ranks_equals_transformers_moe(
    deepseek_ckpt: Path, model: Any, bind_at: Callable[[int, int, int, int], BindResult],
    tp: int, ep: int,
) -> None:  # fmt: skip
    config = json.loads((deepseek_ckpt / "config.json").read_text())
    routing = Routing(  # DeepSeek's config.json names; plain SiLU, no clamp
        top_k=int(config["num_experts_per_tok"]), n_group=int(config["n_group"]),
        topk_group=int(config["topk_group"]), norm_topk_prob=bool(config["norm_topk_prob"]),
        routed_scaling_factor=float(config["routed_scaling_factor"]), swiglu_limit=float("inf"),
    )  # fmt: skip
    assert routing.n_group > 1, "the grouped choice is exercised"
    for layer in SPARSE_LAYERS:
        whole = bind_at(1, 0, 1, 0).layers[layer].slots["mlp"].weights.arrays()
        x = decisive_inputs(whole, routing, X, seed=11 + layer)
        assert len(x) >= 48, "most tokens are not near-ties"

        def mlp_of(r: int, e: int, layer: int = layer) -> dict[str, Any]:
            return bind_at(tp, r, ep, e).layers[layer].slots["mlp"].weights.arrays()

        got = moe_rank_sum(x, mlp_of, tp, ep, routing)
        assert rel_err(got, module_output(model.model.layers[layer].mlp, x)) <= REL_TOL, layer


def test_an_fp8_block_checkpoint_binds_every_tensor_once_its_rope_rows_dequantized(
    tmp_path: Path,
) -> None:
    from specbind.runtime.binder.quant_numerics import dequant_fp8_block
    from specbind.synth import synth, tiny_values

    path = tmp_path / "fp8"
    scheme = next(s for s in TABLE.schemes if s.name == "fp8-block")
    synth(TABLE, path, tiny_values(TABLE), seed=5, quant=scheme)
    ck = CheckpointDir(path)
    names = ck.names()

    def array(name: str, dtype: Any) -> Any:
        t = ck.get(name)
        assert t is not None and t.dtype in ("F8_E4M3", "F32"), name
        return np.frombuffer(t.data, dtype=dtype).reshape(t.shape)

    q_b = "layers.2.self_attn.q_b_proj.weight"
    weight = array(q_b, ml_dtypes.float8_e4m3fn)
    scale = array(q_b + "_scale_inv", np.float32)
    rep = audit(CheckpointDir(path), TABLE, progress=False)
    assert rep["coverage"]["unaccounted"] == 0 and rep["problems"] == []
    for ep in (1, 3):
        got = [
            bind_checkpoint(CheckpointDir(path), TABLE, ep_size=ep, ep_rank=e, progress=False)
            for e in range(ep)
        ]  # fmt: skip
        assert sum(s.report.seen for _, s in got[0].slots()) == len(names)
    a = got[0].layers[2].slots["attention"].weights.arrays()
    w = dequant_fp8_block(weight, scale, block=(128, 128))
    want = np.asarray(w).reshape(H, N + R, -1)[:, N:].reshape(H * R, -1)  # the rope rows
    assert a["q_rope"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(a["q_rope"].astype(np.float32), want.astype(np.float32))
    with pytest.raises(SpecbindError) as e:
        bind_checkpoint(CheckpointDir(path), TABLE, tp_size=2, tp_rank=0, progress=False)  # fmt: skip
    assert "whole 128-element units" in str(e.value) and "\n" not in str(e.value)
