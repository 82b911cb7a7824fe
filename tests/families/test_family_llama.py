"""Llama binds from YAML alone (``specs/models/llama.yaml``, ``specs/blocks/gqa.yaml``): a
checkpoint transformers' ``LlamaForCausalLM`` writes binds with no Llama-specific Python.

Claims:
* ``audit`` accounts for every tensor (untied, tied, and a Llama-2-style config.json without
  head_dim, which defaults to hidden_size / num_attention_heads);
* with 2 KV heads, every tp in 1, 2, 4, 8 binds; q/o and the MLP shares rejoin, and k/v at tp
  4 and 8 are replicated as vLLM's QKVParallelLinear lays them out: rank r holds KV head
  ``r // (tp / 2)``, the KV head of its own query heads;
* every bound field equals the loaded module's parameter; a tied head is the embedding;
* the semantic check: attention computed from each rank's bound fields, summed over ranks
  through its o_proj columns, equals transformers' LlamaAttention on every tp;
* refusals: a tp that neither divides nor is a multiple of a unit is refused naming it; a
  head_dim default that is not exact is refused naming head_dim, and audit lists the same line.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_checks import rel_err, same_values
from gqa_model import (
    LLAMA,
    LLAMA2,
    attention_rank,
    bf16,
    load,
    module_attention,
    rejoin_replicated,
    rotary,
    write_llama,
)
from helpers import cached_binds
from whole_model import read_checkpoint

from specbind.audit import audit
from specbind.core.errors import GeometryError, SpecbindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
pytest.importorskip("transformers", exc_type=ImportError)

pytestmark = pytest.mark.interop

TABLE = MODELS["llama"]
KV = LLAMA["num_key_value_heads"]
D = LLAMA["head_dim"]
TPS = (1, 2, 4, 8)
REL_TOL = 1e-4  # the float32 module against a float64 reference of the same BF16 weights


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama(tmp_path_factory.mktemp("llama") / "ck")


@pytest.fixture(scope="module")
def bind_at(ckpt: Path) -> Callable[[int, int, int, int], BindResult]:
    return cached_binds(ckpt, TABLE)


@pytest.fixture(scope="module")
def model(ckpt: Path) -> Any:
    return load(ckpt, "LlamaForCausalLM")


def test_audit_accounts_for_every_tensor(ckpt: Path) -> None:
    rep = audit(CheckpointDir(ckpt), TABLE, progress=False)
    names = read_checkpoint(ckpt)
    assert rep["coverage"] == {"bound": len(names), "declared_unbound": 0, "unaccounted": 0}
    assert rep["problems"] == []
    assert {s["block"] for r in rep["layers"] for s in r["slots"].values()} == {
        "gqa", "dense", "layer_norms",
    }  # fmt: skip


@pytest.mark.parametrize("tp", TPS)
def test_every_tp_binds_and_kv_heads_replicate_as_vllm_lays_them_out(
    bind_at: Callable[[int, int, int, int], BindResult], tp: int
) -> None:
    full = {k: a for k, (_, a) in bind_at(1, 0, 1, 0).fields().items()}
    shares = {(r, 0): bind_at(tp, r, 1, 0).fields() for r in range(tp)}
    replicas = max(tp // KV, 1)
    for name, want in full.items():
        rule = shares[(0, 0)][name][0]
        kv = name.endswith((".k_proj", ".v_proj"))
        got = rejoin_replicated(
            rule, {k: v[name][1] for k, v in shares.items()}, tp, 1, replicas if kv else 1
        )
        assert got.tobytes() == want.tobytes(), name
    for r in range(tp):  # rank r's k/v rows are KV head r // (tp / KV), whole
        head = r // replicas if tp > KV else None
        for f in ("k_proj", "v_proj"):
            got = shares[(r, 0)][f"layers.0.attention.{f}"][1]
            whole = full[f"layers.0.attention.{f}"]
            if head is not None:
                assert got.tobytes() == whole[head * D : (head + 1) * D].tobytes(), (r, f)
            else:
                n = KV // tp * D
                assert got.tobytes() == whole[r * n : (r + 1) * n].tobytes(), (r, f)


def test_bound_fields_equal_the_loaded_modules(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    bound = bind_at(1, 0, 1, 0)
    for x in bound.layers:
        layer = model.model.layers[x.index]
        a = x.slots["attention"].weights.arrays()
        for f in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert same_values(a[f], getattr(layer.self_attn, f).weight), (x.index, f)
        assert "q_norm" not in a and "k_norm" not in a  # Llama has no qk_norm group
        m = x.slots["mlp"].weights.arrays()
        mlp = layer.mlp
        assert same_values(m["gate_up"], torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        assert same_values(m["down"], mlp.down_proj.weight)
        n = x.slots["norms"].weights.arrays()
        assert same_values(n["input_norm"], layer.input_layernorm.weight)
    assert bound.globals is not None
    g = bound.globals.weights.arrays()
    assert same_values(g["embed_tokens"], model.model.embed_tokens.weight)
    assert same_values(g["lm_head"], model.lm_head.weight)


@pytest.mark.parametrize("tp", TPS)
def test_attention_from_bound_fields_summed_over_ranks_equals_transformers(
    model: Any, bind_at: Callable[[int, int, int, int], BindResult], tp: int
) -> None:
    x = bf16(np.random.default_rng(tp).standard_normal((7, LLAMA["hidden_size"])))
    cos, sin = rotary(model, x.shape[0])
    eps = LLAMA["rms_norm_eps"]
    for layer in (0, 1):
        want = module_attention(model.model.layers[layer].self_attn, x, cos, sin)
        got = sum(
            attention_rank(
                bind_at(tp, r, 1, 0).layers[layer].slots["attention"].weights.arrays(),
                x, cos, sin, D, eps,
            )
            for r in range(tp)
        )  # fmt: skip
        assert rel_err(got, want) < REL_TOL, (layer, tp)


def test_a_tied_checkpoint_binds_its_head_from_the_embedding(tmp_path: Path) -> None:
    ck = write_llama(tmp_path / "tied", tie_word_embeddings=True)
    assert "lm_head.weight" not in read_checkpoint(ck)
    rep = audit(CheckpointDir(ck), TABLE, progress=False)
    assert rep["problems"] == [] and rep["coverage"]["unaccounted"] == 0
    for tp in (1, 8):
        g = bind_checkpoint(CheckpointDir(ck), TABLE, tp_size=tp, tp_rank=tp - 1, progress=False)
        assert g.globals is not None
        arrays = g.globals.weights.arrays()
        assert arrays["lm_head"].tobytes() == arrays["embed_tokens"].tobytes()


@pytest.fixture(scope="module")
def llama2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama(
        tmp_path_factory.mktemp("llama2") / "ck", hidden_size=48, head_dim=6, drop_head_dim=True
    )


def test_a_config_without_head_dim_binds_with_hidden_over_heads(llama2: Path) -> None:
    assert "head_dim" not in json.loads((llama2 / "config.json").read_text())
    rep = audit(CheckpointDir(llama2), TABLE, progress=False)
    assert rep["problems"] == [] and rep["coverage"]["unaccounted"] == 0
    for tp in TPS:
        b = bind_checkpoint(CheckpointDir(llama2), TABLE, tp_size=tp, tp_rank=0, progress=False)
        k = b.layers[0].slots["attention"].weights.arrays()["k_proj"]
        assert k.shape == (max(KV // tp, 1) * LLAMA2["head_dim"], LLAMA2["hidden_size"])


def test_set_supplies_head_dim_over_the_default(llama2: Path) -> None:
    b = bind_checkpoint(CheckpointDir(llama2), TABLE, overrides={"head_dim": 6}, progress=False)
    assert b.layers[0].slots["attention"].weights.arrays()["q_proj"].shape == (48, 48)


def test_an_inexact_head_dim_default_is_refused_by_bind_and_listed_by_audit(
    llama2: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(llama2, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(cfg | {"hidden_size": 44}))
    with pytest.raises(SpecbindError) as e:
        bind_checkpoint(CheckpointDir(bad), TABLE, progress=False)
    msg = str(e.value)
    assert msg.startswith("geometry head_dim = hidden / heads (heads=8, hidden=44)")
    assert "\n" not in msg
    assert f"model: {msg}" in audit(CheckpointDir(bad), TABLE, progress=False)["problems"]


def test_a_tp_that_neither_divides_nor_is_a_multiple_of_a_unit_is_refused(ckpt: Path) -> None:
    with pytest.raises(GeometryError) as e:
        bind_checkpoint(CheckpointDir(ckpt), TABLE, tp_size=3, tp_rank=0, progress=False)
    assert "which tp 3 does not divide" in str(e.value) and "\n" not in str(e.value)


def test_four_torchrun_ranks_prove_coverage_with_kv_heads_on_two_ranks_each(
    ckpt: Path, tmp_path: Path, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    """The coverage proof under torchrun expects each KV head's bytes on exactly 2 of the 4
    ranks (with equal digests), and each rank's file holds its KV head r // 2."""
    from torchrun_ranks import finish, load_dir, torchrun

    out = tmp_path / "four"
    ((rc, so, se),) = finish(torchrun(4, "bind", str(ckpt), "--out-dir", str(out), "--json"))
    assert rc == 0, se
    cov = json.loads(so)["coverage"]
    assert cov["tensors"] == len(read_checkpoint(ckpt)) and cov["digests_compared"] > 0
    _, ranks, _ = load_dir(out)
    whole = bind_at(1, 0, 1, 0).fields()["layers.1.attention.v_proj"][1]
    for r, fields in enumerate(ranks):
        got = fields["layers.1.attention.v_proj"]
        assert got.tobytes() == whole[r // 2 * D : (r // 2 + 1) * D].tobytes(), r
