"""DeepSeek-V3 binds from YAML alone: a checkpoint transformers' ``DeepseekV3ForCausalLM``
writes with ``save_pretrained`` (``deepseek_v3_model.write_deepseek_v3_checkpoint``) binds
through ``specs/models/deepseek-v3.yaml`` (the ``mla_lora`` block, the shared ``moe``,
``dense``, ``layer_norms``, ``lm_globals`` and ``mtp_head``).

Claims:
* the checkpoint is picked by its model_type alone; transformers keeps
  ``num_nextn_predict_layers: 1`` and writes no MTP layer, so audit lists that one problem
  naming ``--no-mtp`` and, with it, accounts for every tensor;
* every tp (1, 2, 4: the 4 heads) and ep (1 to 6) binds, and each rank's shares rejoin to the
  single-rank fields;
* the RoPE-aware absorb on every tp rank: q_absorb and o_absorb within one BF16 ulp of f64,
  q_rope and the latent / rope-key rows of kv_a_proj_with_mqa bit for bit;
* every other field equals what transformers' loaded modules hold;
* the semantic MoE check (grouped sigmoid routing with the correction bias, a shared expert):
  the MoE output computed from the bound fields, summed over ranks, equals DeepseekV3MoE's;
* the hub's MTP layer (layer 61 of the real model) binds as an ``mtp`` layer at tp 2.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from deepseek_v3_model import CONFIG, SPARSE_LAYERS, load_deepseek_v3_model
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
from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)

pytestmark = pytest.mark.interop

TABLE = MODELS["deepseek-v3"]
E, H, X = CONFIG["n_routed_experts"], CONFIG["num_attention_heads"], CONFIG["hidden_size"]
N, R, V = CONFIG["qk_nope_head_dim"], CONFIG["qk_rope_head_dim"], CONFIG["v_head_dim"]
KVL = CONFIG["kv_lora_rank"]
RANKS = [(tp, ep) for tp in (1, 2, 4) for ep in range(1, E + 1)]
REL_TOL = 1e-4  # float64 reference vs the float32 module: see test_mlp_reference's docstring


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from deepseek_v3_model import write_deepseek_v3_checkpoint

    path = tmp_path_factory.mktemp("deepseek_v3")
    write_deepseek_v3_checkpoint(path, seed=3)
    return path


@pytest.fixture(scope="module")
def model(ckpt: Path) -> Any:
    return load_deepseek_v3_model(ckpt)


@pytest.fixture(scope="module")
def bind_at(ckpt: Path) -> Callable[[int, int, int, int], BindResult]:
    return cached_binds(ckpt, TABLE, mtp=False)


def test_audit_accounts_for_every_tensor_once_the_missing_mtp_layer_is_named(ckpt: Path) -> None:
    import specbind

    assert specbind.open(ckpt).model == "deepseek-v3", "picked by model_type alone"
    config = json.loads((ckpt / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1, "transformers keeps the count, not the layer"
    rep = audit(CheckpointDir(ckpt), TABLE, progress=False)
    assert len(rep["problems"]) == 1 and "--no-mtp" in rep["problems"][0]
    rep = audit(CheckpointDir(ckpt), TABLE, progress=False, mtp=False)
    names = read_checkpoint(ckpt)
    assert rep["coverage"] == {"bound": len(names), "declared_unbound": 0, "unaccounted": 0}
    assert rep["problems"] == []
    roles = {r["index"]: {s: v["block"] for s, v in r["slots"].items()} for r in rep["layers"]}
    assert sorted(roles) == list(range(CONFIG["num_hidden_layers"]))
    for i, slots in roles.items():
        assert slots["attention"] == "mla_lora"
        assert slots["mlp"] == ("moe" if i in SPARSE_LAYERS else "dense")
    assert config["first_k_dense_replace"] == min(SPARSE_LAYERS) > 0
    assert schedule_decided(TABLE, config, roles) == len(roles), "vLLM's rule, read from the file"


def test_a_first_k_dense_replace_the_layers_contradict_is_refused(
    ckpt: Path, tmp_path: Path
) -> None:
    """transformers' own checkpoint with one dense layer fewer in config.json than it holds."""
    path = shutil.copytree(ckpt, tmp_path / "ck")
    config = json.loads((path / "config.json").read_text())
    k = config["first_k_dense_replace"] = min(SPARSE_LAYERS) - 1
    (path / "config.json").write_text(json.dumps(config))
    rep = audit(CheckpointDir(path), TABLE, progress=False, mtp=False)
    assert rep["problems"] == [
        f"layer {k}: config.json first_k_dense_replace is {k} (layer {k} >= {k}); "
        f"moe_layer_freq is absent, read as 1 (layer {k} is a multiple of 1), so its mlp is moe by "
        "the schedule, but the layer's tensors are dense"
    ]


@pytest.mark.parametrize(("tp", "ep"), RANKS, ids=[f"tp{t}-ep{e}" for t, e in RANKS])
def test_every_tensor_binds_at_every_tp_and_ep_and_the_shares_rejoin(
    ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult], tp: int, ep: int
) -> None:
    whole = bind_at(1, 0, 1, 0)
    seen = sum(s.report.seen for _, s in whole.slots())
    assert seen == len(read_checkpoint(ckpt)), "every tensor is bound at tp = ep = 1"
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
        assert not any(k.startswith(("wq_b", "wk", "weights_proj")) for k in a), "no indexer"
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
    ckpt: Path, model: Any, bind_at: Callable[[int, int, int, int], BindResult], tp: int, ep: int
) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    assert (config["topk_method"], config["scoring_func"]) == ("noaux_tc", "sigmoid")
    routing = Routing(  # DeepSeek's config.json names; plain SiLU, no clamp
        top_k=int(config["num_experts_per_tok"]), n_group=int(config["n_group"]),
        topk_group=int(config["topk_group"]), norm_topk_prob=bool(config["norm_topk_prob"]),
        routed_scaling_factor=float(config["routed_scaling_factor"]), swiglu_limit=float("inf"),
    )  # fmt: skip
    assert routing.n_group > 1, "the grouped choice is exercised"
    for layer in SPARSE_LAYERS:
        whole = bind_at(1, 0, 1, 0).layers[layer].slots["mlp"].weights.arrays()
        x = decisive_inputs(whole, routing, X, seed=21 + layer)
        assert len(x) >= 48, "most tokens are not near-ties"

        def mlp_of(r: int, e: int, layer: int = layer) -> dict[str, Any]:
            return bind_at(tp, r, ep, e).layers[layer].slots["mlp"].weights.arrays()

        got = moe_rank_sum(x, mlp_of, tp, ep, routing)
        assert rel_err(got, module_output(model.model.layers[layer].mlp, x)) <= REL_TOL, layer


def test_the_hub_mtp_layer_binds_as_an_mtp_layer(ckpt: Path, tmp_path: Path) -> None:
    from mtp_layer import add_mtp_layer

    hub = tmp_path / "hub"
    shutil.copytree(ckpt, hub)
    added = add_mtp_layer(hub, seed=9)
    rep = audit(CheckpointDir(hub), TABLE, progress=False)
    assert rep["problems"] == [] and rep["coverage"]["unaccounted"] == 0
    rows = CONFIG["vocab_size"] // 2
    for rank in range(2):
        result = bind_checkpoint(CheckpointDir(hub), TABLE, tp_size=2, tp_rank=rank, progress=False)
        last = result.layers[-1]
        assert (last.index, last.role) == (4, "mtp")
        assert last.slots["attention"].block == "mla_lora" and last.slots["mlp"].block == "moe"
        head = last.slots["mtp"].weights.arrays()
        want = added["model.layers.4.shared_head.head.weight"].float().numpy()
        assert np.array_equal(
            head["shared_head"].astype(np.float32), want[rank * rows : (rank + 1) * rows]
        )


def test_a_geometry_vllms_cpu_mla_takes_binds_from_config_alone(tmp_path: Path) -> None:
    """kv_lora_rank 512 and qk_rope_head_dim 64 (what vLLM's CPU MLA requires), with the hub's
    topk_method/scoring_func: every size comes from config.json; the MTP layer synth writes
    binds too."""
    from specbind.synth import synth, tiny_values

    values = tiny_values(TABLE) | {"kv_lora_rank": 512, "qk_rope_head_dim": 64}
    synth(TABLE, tmp_path / "ck", values, layers=2, seed=2)
    ck = CheckpointDir(tmp_path / "ck")
    assert (ck.config["kv_lora_rank"], ck.config["qk_rope_head_dim"]) == (512, 64)
    assert (ck.config["topk_method"], ck.config["scoring_func"]) == ("noaux_tc", "sigmoid")
    for rank in range(2):
        res = bind_checkpoint(ck, TABLE, tp_size=2, tp_rank=rank, progress=False)
        assert [x.role for x in res.layers] == ["decoder", "decoder", "mtp"]
        a = res.layers[0].slots["attention"].weights.arrays()
        assert a["q_absorb"].shape == (H // 2 * 512, values["q_lora_rank"])
        assert a["k_rope"].shape == (64, values["hidden"])
