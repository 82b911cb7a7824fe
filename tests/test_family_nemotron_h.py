"""NemotronH binds from YAML alone: a checkpoint transformers' ``NemotronHForCausalLM`` writes
with ``save_pretrained`` (``nemotron_h_model``) binds through ``specs/models/nemotron-h.yaml``
(Mamba2, GQA attention, non-gated MLP and MoE), with no NemotronH-specific Python.

Claims:
* ``audit`` accounts for every tensor (the fused ``in_proj`` and ``conv1d`` as their
  sections), and each layer's mixer follows config.json's ``layers_block_type``;
* ``bind`` binds at every tp (1, 2, 4) and ep (1 to 7 experts); tp 8 is refused, naming a
  unit it does not divide; every single-unit field's shares rejoin to the tp = ep = 1 field;
* the fields joined across units are exactly vLLM's per-rank parameters: ``in_proj`` and
  ``conv1d`` as ``mamba_v2_sharded_weight_loader`` fills them, ``qkv_proj`` as
  ``QKVParallelLinear.weight_loader`` does (both re-implemented below in NumPy, from the
  stored fused tensors);
* every bound field equals what transformers' loaded modules hold;
* semantic: on every tp rank, the bound ``in_proj`` applied to an input gives the module's
  ``in_proj`` output split into z, x, B, C, dt, each section's rank-r block; and the
  attention output projection summed over ranks equals the module's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from family_checks import same_values
from helpers import cached_binds, rejoin
from nemotron_h_model import (
    ATTENTION_LAYER,
    CONFIG,
    MAMBA_LAYERS,
    MLP_LAYER,
    MOE_LAYER,
    load_nemotron_h_model,
)
from whole_model import read_checkpoint

from specbind.audit import audit
from specbind.core.errors import GeometryError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)
if not hasattr(transformers, "NemotronHForCausalLM"):
    pytest.skip("this transformers has no nemotron_h model", allow_module_level=True)

pytestmark = pytest.mark.interop

TABLE = MODELS["nemotron-h"]
E = CONFIG["n_routed_experts"]
RANKS = [(tp, ep) for tp in (1, 2, 4) for ep in (1, 2, E)]
INNER = CONFIG["mamba_num_heads"] * CONFIG["mamba_head_dim"]
GS = CONFIG["n_groups"] * CONFIG["ssm_state_size"]
MH = CONFIG["mamba_num_heads"]
# The fields whose sources shard by different units (checked against vLLM's loaders instead)
ACROSS_UNITS = ("in_proj", "conv1d", "conv1d_bias", "qkv_proj")


@pytest.fixture(scope="session")
def nh_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nemotron_h_model import write_nemotron_h_checkpoint

    path = tmp_path_factory.mktemp("nemotron_h")
    write_nemotron_h_checkpoint(path, seed=0)
    return path


@pytest.fixture(scope="module")
def model(nh_ckpt: Path) -> Any:
    return load_nemotron_h_model(nh_ckpt)


@pytest.fixture(scope="module")
def bind_at(nh_ckpt: Path) -> Callable[[int, int, int, int], BindResult]:
    return cached_binds(nh_ckpt, TABLE)


def vllm_mamba_share(loaded: Any, spec: list[tuple[int, int, bool]], tp: int, r: int) -> Any:
    """vLLM's ``mamba_v2_sharded_weight_loader`` (vllm/model_executor/layers/mamba/
    mamba_mixer2.py): per (full_dim, extra, duplicate_groups) section, rank r's shard_size rows
    (rank 0's when the groups are duplicated), placed one after another."""
    param = np.zeros((sum(d // tp for d, _, _ in spec), *loaded.shape[1:]), loaded.dtype)
    boundary = loaded_boundary = 0
    for full_dim, extra, duplicate in spec:
        shard = full_dim // tp
        skip = (0 if duplicate else r) * shard
        take = min(shard, full_dim - extra - skip)
        param[boundary : boundary + take] = loaded[loaded_boundary + skip :][:take]
        boundary += shard
        loaded_boundary += full_dim - extra
    return param


def vllm_qkv_share(q: Any, k: Any, v: Any, heads: int, kv_heads: int, tp: int, r: int) -> Any:
    """vLLM's ``QKVParallelLinear.weight_loader`` (vllm/model_executor/layers/linear.py): q's
    rank-r rows, then k's and v's rows of KV head group ``r // replicas`` (replicas =
    tp / kv_heads when tp >= kv_heads, else 1), in that order."""
    replicas = tp // kv_heads if tp >= kv_heads else 1
    qs, ks = q.shape[0] // tp, k.shape[0] * replicas // tp
    kr = r // replicas
    return np.concatenate(
        [q[r * qs : (r + 1) * qs], k[kr * ks : (kr + 1) * ks], v[kr * ks : (kr + 1) * ks]]
    )


def test_audit_accounts_for_every_tensor_and_follows_the_layer_types(nh_ckpt: Path) -> None:
    rep = audit(CheckpointDir(nh_ckpt), TABLE, progress=False)
    stored = read_checkpoint(nh_ckpt)
    assert "backbone.layers.0.mixer.in_proj.weight" in stored, "the fused hub name"
    sections = len(MAMBA_LAYERS) * ((5 - 1) + (3 - 1) + (3 - 1))  # in_proj, conv weight, bias
    assert rep["stored_tensors"] == len(stored)
    assert rep["coverage"] == {
        "bound": len(stored) + sections, "declared_unbound": 0, "unaccounted": 0
    }  # fmt: skip
    assert rep["problems"] == []
    kind = {"linear_attention": "mamba2", "full_attention": "mixer_attention",
            "moe": "mixer_moe", "mlp": "mixer_mlp"}  # fmt: skip
    roles = {r["index"]: r["slots"]["mixer"]["block"] for r in rep["layers"]}
    assert roles == {i: kind[t] for i, t in enumerate(CONFIG["layers_block_type"])}


@pytest.mark.parametrize(("tp", "ep"), RANKS, ids=[f"tp{t}-ep{e}" for t, e in RANKS])
def test_every_tensor_binds_at_every_tp_and_ep_and_the_shares_rejoin(
    nh_ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult], tp: int, ep: int
) -> None:
    whole = bind_at(1, 0, 1, 0)
    full = {k: a for k, (_, a) in whole.fields().items()}
    shares = {(r, e): bind_at(tp, r, ep, e).fields() for r in range(tp) for e in range(ep)}
    rules = {k: rule for k, (rule, _) in shares[(0, 0)].items()}
    assert set(rules) == set(full)
    for name, want in full.items():
        if name.rsplit(".", 1)[1] in ACROSS_UNITS:
            continue
        got = rejoin(rules[name], {k: v[name][1] for k, v in shares.items()}, tp, ep)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_fields_joined_across_units_are_vllms_per_rank_parameters(
    nh_ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult], tp: int
) -> None:
    stored = read_checkpoint(nh_ckpt)
    mix = f"backbone.layers.{MAMBA_LAYERS[1]}.mixer."
    att = f"backbone.layers.{ATTENTION_LAYER}.mixer."
    groups = (GS, 0, False)  # n_groups (8) % tp == 0: no extra, no duplication
    in_spec = [(INNER, 0, False), (INNER, 0, False), groups, groups, (MH, 0, False)]
    conv_spec = [(INNER, 0, False), groups, groups]
    for r in range(tp):
        f = {k: a for k, (_, a) in bind_at(tp, r, 1, 0).fields().items()}
        m = f"layers.{MAMBA_LAYERS[1]}.mixer."
        want = vllm_mamba_share(stored[mix + "in_proj.weight"], in_spec, tp, r)
        assert f[m + "in_proj"].tobytes() == want.tobytes(), f"in_proj rank {r}"
        want = vllm_mamba_share(stored[mix + "conv1d.weight"], conv_spec, tp, r)
        assert f[m + "conv1d"].tobytes() == want.tobytes(), f"conv1d rank {r}"
        want = vllm_mamba_share(stored[mix + "conv1d.bias"], conv_spec, tp, r)
        assert f[m + "conv1d_bias"].tobytes() == want.tobytes(), f"conv1d bias rank {r}"
        q, k, v = (stored[att + f"{p}_proj.weight"] for p in "qkv")
        want = vllm_qkv_share(q, k, v, CONFIG["num_attention_heads"],
                              CONFIG["num_key_value_heads"], tp, r)  # fmt: skip
        got = f[f"layers.{ATTENTION_LAYER}.mixer.qkv_proj"]
        assert got.tobytes() == want.tobytes(), f"qkv_proj rank {r}"


def test_tp8_is_refused_naming_a_unit_it_does_not_divide(
    bind_at: Callable[[int, int, int, int], BindResult],
) -> None:
    with pytest.raises(GeometryError, match="tp 8"):
        bind_at(8, 0, 1, 0)


def test_every_field_equals_the_loaded_modules(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    f = {k: a for k, (_, a) in bind_at(1, 0, 1, 0).fields().items()}
    layers = model.model.layers
    for i in MAMBA_LAYERS:
        mx, at = layers[i].mixer, f"layers.{i}.mixer."
        pairs = {"in_proj": mx.in_proj.weight, "conv1d": mx.conv1d.weight,
                 "conv1d_bias": mx.conv1d.bias, "a_log": mx.A_log, "d": mx.D,
                 "dt_bias": mx.dt_bias, "norm": mx.norm.weight, "out_proj": mx.out_proj.weight}  # fmt: skip
        for name, theirs in pairs.items():
            assert same_values(f[at + name], theirs), at + name
    at_ = layers[ATTENTION_LAYER].mixer
    qkv = torch.cat([at_.q_proj.weight, at_.k_proj.weight, at_.v_proj.weight])
    assert same_values(f[f"layers.{ATTENTION_LAYER}.mixer.qkv_proj"], qkv)
    assert same_values(f[f"layers.{ATTENTION_LAYER}.mixer.o_proj"], at_.o_proj.weight)
    mlp = layers[MLP_LAYER].mixer
    assert same_values(f[f"layers.{MLP_LAYER}.mixer.up_proj"], mlp.up_proj.weight)
    assert same_values(f[f"layers.{MLP_LAYER}.mixer.down_proj"], mlp.down_proj.weight)
    moe, at = layers[MOE_LAYER].mixer, f"layers.{MOE_LAYER}.mixer."
    pairs = {"router": moe.gate.weight, "router_bias": moe.gate.e_score_correction_bias,
             "w1": moe.experts.up_proj, "w2": moe.experts.down_proj,
             "shared_up": moe.shared_experts.up_proj.weight,
             "shared_down": moe.shared_experts.down_proj.weight}  # fmt: skip
    for name, theirs in pairs.items():
        assert same_values(f[at + name], theirs), at + name
    for i in range(len(layers)):
        assert same_values(f[f"layers.{i}.norms.norm"], layers[i].norm.weight)
    assert same_values(f["globals.embed_tokens"], model.model.embeddings.weight)
    assert same_values(f["globals.norm"], model.model.norm_f.weight)
    assert same_values(f["globals.lm_head"], model.lm_head.weight)


def _f64(a: Any) -> Any:
    return np.asarray(a).astype(np.float64)


@pytest.mark.parametrize("tp", [2, 4])
def test_each_ranks_in_proj_gives_its_block_of_every_section_of_the_modules_projection(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult], tp: int
) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, CONFIG["hidden_size"])).astype(ml_dtypes.bfloat16)
    x64 = x.astype(np.float64)
    mx = model.model.layers[MAMBA_LAYERS[0]].mixer
    with torch.no_grad():
        theirs = mx.in_proj(torch.from_numpy(x64)).numpy()  # [T, z | x | B | C | dt]
    sizes = [INNER, INNER, GS, GS, MH]
    sections = np.split(theirs, np.cumsum(sizes)[:-1], axis=1)
    for r in range(tp):
        w = bind_at(tp, r, 1, 0).fields()[f"layers.{MAMBA_LAYERS[0]}.mixer.in_proj"][1]
        ours = x64 @ _f64(w).T  # [T, z_r | x_r | B_r | C_r | dt_r]
        want = np.concatenate([s[:, r * (n // tp) : (r + 1) * (n // tp)] for s, n in
                               zip(sections, sizes, strict=True)], axis=1)  # fmt: skip
        np.testing.assert_allclose(ours, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tp", [2, 4])
def test_the_attention_output_projection_summed_over_ranks_equals_the_modules(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult], tp: int
) -> None:
    """Each rank's o_proj columns read its own heads of the attention output (here the q
    projection stands in for it); the rank sum is the module's o_proj."""
    at_ = model.model.layers[ATTENTION_LAYER].mixer
    x = np.random.default_rng(1).standard_normal((5, CONFIG["hidden_size"]))
    with torch.no_grad():
        y = at_.q_proj(torch.from_numpy(x)).numpy()  # [T, heads * head_dim]
        want = at_.o_proj(torch.from_numpy(y)).numpy()
    total = np.zeros_like(want)
    q_rows = y.shape[1] // tp
    for r in range(tp):
        f = bind_at(tp, r, 1, 0).fields()
        qkv = _f64(f[f"layers.{ATTENTION_LAYER}.mixer.qkv_proj"][1])
        y_r = x @ qkv[:q_rows].T  # this rank's q rows, from the fused field's q part
        np.testing.assert_allclose(y_r, y[:, r * q_rows : (r + 1) * q_rows], rtol=1e-12)
        total += y_r @ _f64(f[f"layers.{ATTENTION_LAYER}.mixer.o_proj"][1]).T
    np.testing.assert_allclose(total, want, rtol=1e-10, atol=1e-12)
