"""gpt-oss binds from YAML alone: a checkpoint transformers' ``GptOssForCausalLM`` writes
binds through ``specs/models/gpt-oss.yaml`` (``sink_attention``, ``stacked_moe``), with no
gpt-oss Python.

Claims:
* ``audit`` accounts for every tensor; sliding and full layers are one block;
* every tp the KV heads allow (1, 2) times every ep (1 to 6 experts) binds, and each rank's
  shares rejoin to the single-rank fields; an ep rank reads only its own experts' rows of the
  stacked tensors (its bytes shrink with ep), and the ranks' planned reads tile every stored
  tensor exactly once per replica (the torchrun coverage proof, without torch.distributed);
* each rank's share is vLLM's gpt-oss layout (``_load_weights_other``): w13 =
  gate_up_proj[ep experts][..., 2·t0 : 2·t1].permute(0, 2, 1), still interleaved; w13_bias
  the same columns; w2 = down_proj[ep experts][:, t0:t1].permute(0, 2, 1); sinks of the rank's
  heads;
* every bound field equals what transformers loads;
* the semantic MoE check: the MoE computed from the bound fields (gpt-oss's clamped SwiGLU
  on the interleaved halves), summed over (tp, ep) ranks, equals transformers' GptOssMLP; the
  check has teeth (reading w13 as [gate; up] fails it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_checks import same_values
from gpt_oss_model import CONFIG, load_gpt_oss_model
from gqa_model import rejoin_replicated
from helpers import cached_binds, rejoin
from rank_pieces import every_rank
from whole_model import expert_range, read_checkpoint

from specbind.audit import audit
from specbind.core.errors import GeometryError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.ranks import byte_coverage

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)
if not hasattr(transformers, "GptOssForCausalLM"):
    pytest.skip("this transformers has no gpt_oss model", allow_module_level=True)

pytestmark = pytest.mark.interop

TABLE = MODELS["gpt-oss"]
E = CONFIG["num_local_experts"]
H = CONFIG["num_attention_heads"]
INTER = CONFIG["intermediate_size"]
X = CONFIG["hidden_size"]
KV = CONFIG["num_key_value_heads"]
# 2 KV heads: at tp 4 and 8 each is held by tp / 2 ranks (vLLM's QKVParallelLinear)
RANKS = [(tp, ep) for tp in (1, 2, 4) for ep in range(1, E + 1)] + [(8, 1), (8, 2)]


@pytest.fixture(scope="session")
def oss_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpt_oss_model import write_gpt_oss_checkpoint

    path = tmp_path_factory.mktemp("gpt_oss")
    write_gpt_oss_checkpoint(path, seed=0)
    return path


@pytest.fixture(scope="module")
def model(oss_ckpt: Path) -> Any:
    return load_gpt_oss_model(oss_ckpt)


@pytest.fixture(scope="module")
def bind_at(oss_ckpt: Path) -> Callable[[int, int, int, int], BindResult]:
    return cached_binds(oss_ckpt, TABLE)


def _np(t: Any) -> Any:
    return t.detach().double().numpy()


def test_audit_accounts_for_every_tensor_and_sliding_and_full_layers_are_one_block(
    oss_ckpt: Path,
) -> None:
    rep = audit(CheckpointDir(oss_ckpt), TABLE, progress=False)
    names = read_checkpoint(oss_ckpt)
    assert names["model.layers.0.mlp.experts.gate_up_proj"].shape == (E, X, 2 * INTER)
    assert rep["coverage"] == {"bound": len(names), "declared_unbound": 0, "unaccounted": 0}
    assert rep["problems"] == []
    config = json.loads((oss_ckpt / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention", "full_attention"]
    blocks = {r["slots"]["attention"]["block"] for r in rep["layers"]}
    assert blocks == {"sink_attention"}


@pytest.mark.parametrize(("tp", "ep"), RANKS, ids=[f"tp{t}-ep{e}" for t, e in RANKS])
def test_every_tensor_binds_at_every_tp_and_ep_and_the_shares_rejoin(
    oss_ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult], tp: int, ep: int
) -> None:
    whole = bind_at(1, 0, 1, 0)
    assert sum(s.report.seen for _, s in whole.slots()) == len(read_checkpoint(oss_ckpt))
    full = {k: a for k, (_, a) in whole.fields().items()}
    shares = {(r, e): bind_at(tp, r, ep, e).fields() for r in range(tp) for e in range(ep)}
    rules = {k: rule for k, (rule, _) in shares[(0, 0)].items()}
    assert set(rules) == set(full)
    for name, want in full.items():
        mine = {k: v[name][1] for k, v in shares.items()}
        kv = name.rsplit(".", 1)[1] in ("k_proj", "v_proj", "k_bias", "v_bias")
        if kv and tp > KV:  # each KV head held by tp / KV ranks
            got = rejoin_replicated(rules[name], mine, tp, ep, tp // KV)
        else:
            got = rejoin(rules[name], mine, tp, ep)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
    base, rem = divmod(E, ep)
    w13 = shares[(0, ep - 1)]["layers.0.mlp.w13"][1]
    assert w13.shape == (base + (ep - 1 < rem), 2 * INTER // tp, X)


def test_an_ep_rank_reads_only_its_own_experts_bytes(
    bind_at: Callable[[int, int, int, int], BindResult],
) -> None:
    """The stacked tensors are most of a layer's bytes: each ep rank reads only its rows."""
    one = bind_at(1, 0, 1, 0).layers[0].slots["mlp"].report.bytes
    per = [bind_at(1, 0, 3, e).layers[0].slots["mlp"].report.bytes for e in range(3)]
    router = 2 * (E * X + E)  # BF16 router weight and bias, on every ep rank
    assert [p - router for p in per] == [(one - router) // 3] * 3


@pytest.mark.parametrize(("tp", "ep"), [(1, 2), (2, 3), (2, 4)])
def test_the_ranks_planned_reads_tile_every_tensor_once_per_replica(
    oss_ckpt: Path, tp: int, ep: int
) -> None:
    by_rank, names = every_rank(oss_ckpt, TABLE, tp, ep)  # ep-major: the last tp are one ep
    assert byte_coverage.check(by_rank, names) == []
    # teeth: drop the last ep rank and its experts' rows are read by no rank
    short = byte_coverage.check(by_rank[:-tp], names)
    assert any("mlp.experts.gate_up_proj: rows" in p and "no rank" in p for p in short), short


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1), (1, 4), (2, 3), (4, 2)])
def test_each_ranks_share_is_vllms_gpt_oss_layout(
    oss_ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult], tp: int, ep: int
) -> None:
    """Transcribed from vLLM's ``GptOssModel._load_weights_other``: the tp narrow on the
    stored [E, X, 2I] columns (whole interleaved (gate, up) pairs), then permute(0, 2, 1)."""
    stored = read_checkpoint(oss_ckpt)
    pre = "model.layers.1."
    gate_up = stored[pre + "mlp.experts.gate_up_proj"]
    down = stored[pre + "mlp.experts.down_proj"]
    per_tp, heads = INTER // tp, H // tp
    for e in range(ep):
        lo, count = expert_range(E, ep, e)
        hi = lo + count
        for t in range(tp):
            f = {k: a for k, (_, a) in bind_at(tp, t, ep, e).fields().items()}
            s, end = t * per_tp, (t + 1) * per_tp
            want13 = gate_up[lo:hi][:, :, 2 * s : 2 * end].transpose(0, 2, 1)
            assert f["layers.1.mlp.w13"].tobytes() == np.ascontiguousarray(want13).tobytes()
            bias13 = stored[pre + "mlp.experts.gate_up_proj_bias"][lo:hi, 2 * s : 2 * end]
            assert f["layers.1.mlp.w13_bias"].tobytes() == bias13.tobytes()
            want2 = np.ascontiguousarray(down[lo:hi][:, s:end, :].transpose(0, 2, 1))
            assert f["layers.1.mlp.w2"].tobytes() == want2.tobytes()
            bias2 = stored[pre + "mlp.experts.down_proj_bias"][lo:hi]
            assert f["layers.1.mlp.w2_bias"].tobytes() == bias2.tobytes()
            sinks = stored[pre + "self_attn.sinks"][t * heads : (t + 1) * heads]
            assert f["layers.1.attention.sinks"].tobytes() == sinks.tobytes()


def test_a_tp_that_neither_divides_nor_is_a_multiple_of_the_heads_is_refused_in_one_line(
    oss_ckpt: Path,
) -> None:
    with pytest.raises(GeometryError) as e:
        bind_checkpoint(CheckpointDir(oss_ckpt), TABLE, tp_size=3, tp_rank=0, progress=False)
    assert "heads" in str(e.value) and "\n" not in str(e.value)


def test_bound_fields_equal_what_transformers_loads(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    bound = bind_at(1, 0, 1, 0)
    for x in bound.layers:
        layer = model.model.layers[x.index]
        a = x.slots["attention"].weights.arrays()
        attn = layer.self_attn
        for p in ("q", "k", "v", "o"):
            lin = getattr(attn, f"{p}_proj")
            assert same_values(a[f"{p}_proj"], lin.weight) and same_values(
                a[f"{p}_bias"], lin.bias
            ), p
        assert same_values(a["sinks"], attn.sinks)
        m, experts = x.slots["mlp"].weights.arrays(), layer.mlp.experts
        assert same_values(m["router"], layer.mlp.router.weight)
        assert same_values(m["router_bias"], layer.mlp.router.bias)
        assert same_values(m["w13"], experts.gate_up_proj.transpose(1, 2))
        assert same_values(m["w13_bias"], experts.gate_up_proj_bias)
        assert same_values(m["w2"], experts.down_proj.transpose(1, 2))
        assert same_values(m["w2_bias"], experts.down_proj_bias)
        n = x.slots["norms"].weights.arrays()
        assert same_values(n["input_norm"], layer.input_layernorm.weight)
    assert bound.globals is not None
    g = bound.globals.weights.arrays()
    assert same_values(g["embed_tokens"], model.model.embed_tokens.weight)
    assert same_values(g["lm_head"], model.lm_head.weight)


def _rank_moe(
    x: Any, f: dict[str, Any], lo: int, tp_rank: int, cfg: Any, interleaved: bool = True
) -> Any:
    """One (tp, ep) rank's part of the MoE output, from its bound fields only (float64):
    softmax over the top-k router logits, gpt-oss's clamped SwiGLU (``(up + 1) · gate ·
    σ(α · gate)``) on this rank's interleaved (gate, up) columns, the down projection on its
    columns; the down bias once, on tp rank 0."""
    w = {k: np.asarray(v).astype(np.float64) for k, v in f.items()}
    logits = x @ w["router"].T + w["router_bias"]  # [T, E]
    top = np.argsort(-logits, axis=1, kind="stable")[:, : cfg.num_experts_per_tok]
    vals = np.take_along_axis(logits, top, axis=1)
    weights = np.exp(vals - vals.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    out = np.zeros_like(x)
    for i in range(w["w13"].shape[0]):  # this ep rank's experts
        tok, k = np.nonzero(top == lo + i)
        if not len(tok):
            continue
        gu = x[tok] @ w["w13"][i].T + w["w13_bias"][i]  # [t, 2·I_r]
        half = gu.shape[1] // 2
        gate, up = (gu[:, ::2], gu[:, 1::2]) if interleaved else (gu[:, :half], gu[:, half:])
        gate = np.minimum(gate, cfg.swiglu_limit)
        up = np.clip(up, -cfg.swiglu_limit, cfg.swiglu_limit)
        h = (up + 1) * gate / (1 + np.exp(-cfg.swiglu_alpha * gate))
        y = h @ w["w2"][i].T + (w["w2_bias"][i] if tp_rank == 0 else 0)
        np.add.at(out, tok, y * weights[tok, k][:, None])
    return out


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1), (1, 3), (2, 4), (4, 2), (8, 1)])
def test_moe_from_the_bound_fields_summed_over_ranks_equals_transformers(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult], tp: int, ep: int
) -> None:
    mlp = model.model.layers[1].mlp
    mlp.experts.config._experts_implementation = "eager"  # the per-expert loop, in float64
    x = np.random.default_rng(7).standard_normal((11, X)) * 0.5
    with torch.no_grad():
        want = mlp(torch.from_numpy(x)[None])[0][0].double().numpy()
    got = np.zeros_like(x)
    wrong = np.zeros_like(x)
    for e in range(ep):
        lo, _ = expert_range(E, ep, e)
        for t in range(tp):
            f = bind_at(tp, t, ep, e).layers[1].slots["mlp"].weights.arrays()
            got += _rank_moe(x, f, lo, t, model.config)
            wrong += _rank_moe(x, f, lo, t, model.config, interleaved=False)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-9 * scale
    assert np.abs(wrong - want).max() > 1e-2 * scale, "reading w13 as [gate; up] must fail"
