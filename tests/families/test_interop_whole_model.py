"""A whole GLM-5.3-Flash checkpoint written by transformers binds from the specs, all of it.

``Glm5NextForConditionalGeneration`` (text model + a tiny vision tower) writes the checkpoint
with ``save_pretrained`` (``whole_model.write_whole_checkpoint``): dense and MoE layers, shared
experts, mHC, full and shared indexer layers, F32 where the released checkpoint is F32. Claims:

* ``audit`` accounts for every tensor: bound, or under the declared-unbound vision prefix;
* ``bind`` binds every text tensor at every tp and ep the geometry allows, reads no vision
  tensor, and each rank's shares rejoin to the single-rank fields;
* every bound field equals what transformers' loaded model holds: norms, mHC (fn widened
  exactly from BF16 to F32), router and bias, the embedding and head, and the stacked experts
  equal transformers' own fused ``gate_up_proj`` / ``down_proj`` (its conversion mapping
  merges the per-expert tensors as [gate; up] per expert: the same layout);
* a checkpoint re-saved by transformers (``from_pretrained`` -> ``save_pretrained``) writes the
  KDA convolutions as F32: they narrow exactly to BF16 and bind to the same bytes; one value
  that is not a BF16 value is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers import cached_binds, rejoin
from whole_model import (
    DSA_LAYERS,
    KDA_LAYERS,
    SPARSE_LAYERS,
    TEXT_CONFIG,
    load_whole_model,
    read_checkpoint,
    read_checkpoint_file,
    text_layers,
    write_safetensors,
    write_whole_checkpoint,
)

from specbind.audit import audit
from specbind.core.errors import BindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)
if not hasattr(transformers, "Glm5NextForConditionalGeneration"):
    pytest.skip("this transformers has no glm5_next model", allow_module_level=True)

pytestmark = pytest.mark.interop

TABLE = MODELS["glm-5.3-flash"]
E = TEXT_CONFIG["n_routed_experts"]  # 6
RANKS = [(tp, ep) for tp in (1, 2, 4) for ep in (1, 2, 3, 4)]  # ep 4 splits 6 as 2, 2, 1, 1


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("glm5_vl")
    write_whole_checkpoint(path, vision=True, seed=3)
    return path


@pytest.fixture(scope="module")
def model(ckpt: Path) -> Any:
    return load_whole_model(ckpt)


@pytest.fixture(scope="module")
def bind_at(ckpt: Path) -> Callable[[int, int, int, int], BindResult]:
    return cached_binds(ckpt, TABLE)


def test_audit_accounts_for_every_tensor_bound_or_declared_unbound(ckpt: Path) -> None:
    rep = audit(CheckpointDir(ckpt), TABLE, progress=False)
    names = set(read_checkpoint(ckpt))
    vision = {n for n in names if n.startswith("model.visual.")}
    assert vision, "the VL checkpoint carries a vision tower"
    assert rep["coverage"] == {
        "bound": len(names) - len(vision),
        "declared_unbound": len(vision),
        "unaccounted": 0,
    }
    assert rep["declared_unbound"]["model.visual."]["tensors"] == len(vision)
    assert "vision tower" in rep["declared_unbound"]["model.visual."]["why"]
    assert rep["problems"] == []
    assert rep["layer_prefix"] == "model.language_model.layers.{index}."
    roles = {
        row["index"]: {s: v["block"] for s, v in row["slots"].items()} for row in rep["layers"]
    }
    for i in range(TEXT_CONFIG["num_hidden_layers"]):
        assert roles[i]["attention"] == ("dsa" if i in DSA_LAYERS else "kda")
        assert roles[i]["mlp"] == ("moe" if i in SPARSE_LAYERS else "dense")
        assert roles[i]["mhc"] == "mhc" and roles[i]["norms"] == "layer_norms"


@pytest.mark.parametrize(("tp", "ep"), RANKS, ids=[f"tp{t}-ep{e}" for t, e in RANKS])
def test_every_text_tensor_binds_at_every_rank_and_the_shares_rejoin(
    ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult], tp: int, ep: int
) -> None:
    whole = bind_at(1, 0, 1, 0)
    text = [n for n in read_checkpoint(ckpt) if not n.startswith("model.visual.")]
    seen = sum(s.report.seen for _, s in whole.slots())
    assert seen == len(text), "every text tensor is bound at tp = ep = 1"
    assert whole.unbound == {"model.visual.": len(read_checkpoint(ckpt)) - len(text)}
    full = {k: a for k, (_, a) in whole.fields().items()}
    shares = {(r, e): bind_at(tp, r, ep, e).fields() for r in range(tp) for e in range(ep)}
    rules = {k: rule for k, (rule, _) in shares[(0, 0)].items()}
    assert set(rules) == set(full)
    for name, want in full.items():
        got = rejoin(rules[name], {k: v[name][1] for k, v in shares.items()}, tp, ep)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
    w13 = shares[(0, ep - 1)]["layers.1.mlp.w13"][1]
    base, rem = divmod(E, ep)
    assert w13.shape == (base + (ep - 1 < rem), 2 * TEXT_CONFIG["moe_intermediate_size"] // tp, 64)


def _same(bound: Any, theirs: Any) -> bool:
    """Equal values, bit for bit, through an exact widening to F32."""
    ours = np.asarray(bound)
    assert ours.dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)), ours.dtype
    t = theirs.detach().float().numpy()
    return ours.shape == t.shape and bool(np.array_equal(ours.astype(np.float32), t))


def test_bound_fields_equal_what_transformers_loads(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    bound = bind_at(1, 0, 1, 0)
    layers = text_layers(model)
    lm = model.model.language_model
    for x in bound.layers:
        layer = layers[x.index]
        norms = x.slots["norms"].weights.arrays()
        assert _same(norms["input_norm"], layer.input_layernorm.weight)
        assert _same(norms["post_attention_norm"], layer.post_attention_layernorm.weight)
        hc = x.slots["mhc"].weights.arrays()
        assert hc["attn_fn"].dtype == np.float32, "mHC fn is bound as F32"
        for field, param in [
            ("attn_fn", layer.attn_hc.fn), ("attn_base", layer.attn_hc.base),
            ("attn_scale", layer.attn_hc.scale), ("ffn_fn", layer.ffn_hc.fn),
            ("ffn_base", layer.ffn_hc.base), ("ffn_scale", layer.ffn_hc.scale),
        ]:  # fmt: skip
            assert _same(hc[field], param), (x.index, field)
        mlp = x.slots["mlp"].weights.arrays()
        if x.index not in SPARSE_LAYERS:
            gate_up = torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight])
            assert _same(mlp["gate_up"], gate_up) and _same(mlp["down"], layer.mlp.down_proj.weight)
            continue
        assert _same(mlp["router"], layer.mlp.gate.weight)
        assert mlp["router_bias"].dtype == np.float32
        assert _same(mlp["router_bias"], layer.mlp.gate.e_score_correction_bias)
        # transformers fuses the per-expert tensors on load: [E, 2*Im, H] with gate then up
        assert _same(mlp["w13"], layer.mlp.experts.gate_up_proj), x.index
        assert _same(mlp["w2"], layer.mlp.experts.down_proj), x.index
        shared = layer.mlp.shared_experts
        assert _same(
            mlp["shared_gate_up"], torch.cat([shared.gate_proj.weight, shared.up_proj.weight])
        )
        assert _same(mlp["shared_down"], shared.down_proj.weight)
    assert bound.globals is not None
    g = bound.globals.weights.arrays()
    assert _same(g["embed_tokens"], lm.embed_tokens.weight)
    assert _same(g["norm"], lm.norm.weight)
    assert _same(g["lm_head"], model.lm_head.weight)


def test_a_checkpoint_resaved_by_transformers_binds_its_f32_conv_narrowed_exactly(
    ckpt: Path, tmp_path: Path, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    """from_pretrained -> save_pretrained: transformers keeps conv1d in F32 and writes it so."""
    loaded = transformers.Glm5NextForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.bfloat16
    )
    resaved = tmp_path / "resaved"
    loaded.save_pretrained(resaved)
    on_disk = read_checkpoint(resaved)
    conv = f"model.language_model.layers.{KDA_LAYERS[0]}.self_attn.q_conv1d.weight"
    assert on_disk[conv].dtype == np.float32, "transformers writes the conv back as F32"
    again = bind_checkpoint(CheckpointDir(resaved), TABLE, progress=False)
    first = bind_at(1, 0, 1, 0).fields()
    for name, (_, a) in again.fields().items():
        assert a.dtype == first[name][1].dtype and a.tobytes() == first[name][1].tobytes(), name
    casts = [c for _, s in again.slots() for c in s.report.cast]
    assert "self_attn.q_conv1d.weight: F32 -> BF16" in casts

    # One conv value that is no BF16 value: refused, naming the layer, tensor and element.
    (shard,) = [f for f in resaved.glob("*.safetensors") if conv in read_checkpoint_file(f)]
    tensors = read_checkpoint_file(shard)
    bad = tensors[conv].copy()
    bad[5, 0, 2] = np.float32(bad[5, 0, 2]) + np.float32(2.0**-20)
    tensors[conv] = bad
    write_safetensors(shard, tensors, {"format": "pt"})
    with pytest.raises(BindError) as e:
        bind_checkpoint(CheckpointDir(resaved), TABLE, progress=False)
    msg = str(e.value)
    assert msg.startswith(f"layer {KDA_LAYERS[0]}: {conv} is stored as F32")
    assert "element [5, 0, 2]" in msg and "to BF16" in msg


def test_a_synthetic_checkpoint_loads_into_transformers_with_nothing_missing(
    tmp_path: Path,
) -> None:
    """``specbind synth`` writes what transformers' Glm5NextTextModel loads: no missing or
    mismatched key; the unexpected ones are exactly the MTP layer (which transformers drops)
    and the LM head (the base model has none)."""
    from helpers import TINY

    from specbind.synth import synth

    synth(TABLE, tmp_path / "ck", TINY, seed=9)
    _, info = transformers.Glm5NextTextModel.from_pretrained(
        tmp_path / "ck", output_loading_info=True
    )
    assert info["missing_keys"] == set() and info["mismatched_keys"] == set()
    assert {k.split(".")[1] for k in info["unexpected_keys"] if k.startswith("layers.")} == {"8"}
    assert {k for k in info["unexpected_keys"] if not k.startswith("layers.")} == {"lm_head.weight"}


def test_the_prefix_automodel_writes_is_accepted(tmp_path: Path) -> None:
    """``Glm5NextModel`` (what AutoModel returns for the VL config) writes
    ``language_model.layers.N.``: the same layers bind, and its vision tower is declared."""
    names = write_whole_checkpoint(tmp_path, vision=True, seed=5, cls=transformers.Glm5NextModel)
    assert any(n.startswith("language_model.layers.0.") for n in names)
    rep = audit(CheckpointDir(tmp_path), TABLE, progress=False)
    assert rep["layer_prefix"] == "language_model.layers.{index}."
    assert rep["coverage"]["unaccounted"] == 0 and rep["problems"] == []
    got = bind_checkpoint(CheckpointDir(tmp_path), TABLE, tp_size=2, tp_rank=1, progress=False)
    assert len(got.layers) == TEXT_CONFIG["num_hidden_layers"]
    assert got.globals is not None and "lm_head" not in got.globals.weights.arrays()
