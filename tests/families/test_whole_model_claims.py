"""The whole model's claims on synthetic checkpoints: every tensor in exactly one place, layers
checked against config.json, families and ties, and expert parallelism that reads only a rank's
own experts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers import TABLE, TINY, copy_with, layer_arrays, read_file, rejoin, source
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from specbind.core.errors import BindError, GeometryError, SpecbindError
from specbind.generated import moe
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth

E = TINY["experts"]  # 6


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("whole") / "ck"
    synth(TABLE, d, TINY, seed=21)
    return d


def refused(path: Path, **kw: Any) -> str:
    with pytest.raises(BindError) as e:
        bind_checkpoint(CheckpointDir(path), TABLE, progress=False, **kw)
    return str(e.value)


def test_a_missing_middle_layer_is_refused_naming_it(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_with(ckpt, tmp_path / "b", {"layers.5.*": None})
    msg = refused(bad)
    assert msg.startswith("layer 5: config.json num_hidden_layers is 8 plus 1 MTP layer(s)")
    assert "the checkpoint has no layer 5" in msg


def test_a_missing_mtp_layer_is_refused(ckpt: Path, tmp_path: Path) -> None:
    msg = refused(copy_with(ckpt, tmp_path / "b", {"layers.8.*": None}))
    assert msg.startswith("layer 8: ") and "no layer 8" in msg


def test_layers_beyond_the_configured_count_are_refused(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_with(ckpt, tmp_path / "b", config={"num_hidden_layers": 4})
    msg = refused(bad)
    assert msg.startswith("layer 5: config.json num_hidden_layers is 4 plus 1 MTP layer(s)")
    assert "there is no layer 5, but the checkpoint has one" in msg
    assert "more problem(s)" in msg, "every extra layer is a problem; audit lists them all"


def test_layer_types_that_contradict_the_names_are_refused(ckpt: Path, tmp_path: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    types = list(cfg["layer_types"])
    types[3] = "linear_attention"
    msg = refused(copy_with(ckpt, tmp_path / "b", config={"layer_types": types}))
    assert msg == (
        "layer 3: config.json layer_types[3] is 'linear_attention' (a kda attention), but the "
        "layer's tensors are dsa"
    )


def test_mlp_layer_types_that_contradict_the_names_are_refused(ckpt: Path, tmp_path: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    kinds = ["sparse"] * len(cfg["mlp_layer_types"])
    msg = refused(copy_with(ckpt, tmp_path / "b", config={"mlp_layer_types": kinds}))
    assert msg.startswith(
        "layer 0: config.json mlp_layer_types[0] is 'sparse' (a moe mlp), but the layer's "
        "tensors are dense"
    )


def test_an_unclaimed_tensor_in_a_layer_is_refused_with_all_such_names(
    ckpt: Path, tmp_path: Path
) -> None:
    z = np.zeros(2, np.float32)
    bad = copy_with(ckpt, tmp_path / "b", {"layers.2.rotary.inv_freq": z, "layers.2.zz": z})
    msg = refused(bad)
    assert msg.startswith("layer 2: 2 tensor(s) belong to no slot of a decoder layer")
    assert "['layers.2.rotary.inv_freq', 'layers.2.zz']" in msg and "refusing to skip them" in msg


def test_a_zero_padded_layer_index_is_not_silently_outside_the_layers(
    ckpt: Path, tmp_path: Path
) -> None:
    z = np.zeros(2, np.float32)
    msg = refused(copy_with(ckpt, tmp_path / "b", {"layers.03.input_layernorm.weight": z}))
    assert "outside the layers are neither model-level tensors nor declared unbound" in msg
    assert "layers.03.input_layernorm.weight" in msg


def test_a_vision_tower_is_declared_unbound_and_never_read(ckpt: Path, tmp_path: Path) -> None:
    z = np.zeros(3, np.float32)
    ok = copy_with(ckpt, tmp_path / "ok", {"model.visual.blocks.0.attn.qkv.weight": z})
    got = bind_checkpoint(CheckpointDir(ok), TABLE, progress=False)
    assert got.unbound == {"model.visual.": 1}
    msg = refused(copy_with(ckpt, tmp_path / "b", {"vision_tower.blocks.0.weight": z}))
    assert msg.startswith("model: 1 tensor(s) outside the layers")


def test_a_missing_expert_is_refused_by_name(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_with(ckpt, tmp_path / "b", {"layers.4.mlp.experts.3.up_proj.weight": None})
    assert refused(bad) == (
        "layer 4: missing layers.4.mlp.experts.3.up_proj.weight (a moe block requires it)"
    )


def test_an_expert_index_past_the_family_is_refused(ckpt: Path, tmp_path: Path) -> None:
    extra = read_file(next(ckpt.glob("*.safetensors")))
    any_up = next(a for n, a in extra.items() if n.endswith("experts.0.up_proj.weight"))
    bad = copy_with(ckpt, tmp_path / "b", {f"layers.4.mlp.experts.{E}.up_proj.weight": any_up})
    assert refused(bad) == (
        f"layer 4: layers.4.mlp.experts.{E}.up_proj.weight: index {E} is outside the family e in "
        f"range({E}) of a moe block"
    )


def test_a_tied_head_binds_the_embedding_and_refuses_a_stored_copy(
    ckpt: Path, tmp_path: Path
) -> None:
    tied = copy_with(ckpt, tmp_path / "t", {"lm_head.weight": None}, {"tie_word_embeddings": True})
    got = bind_checkpoint(CheckpointDir(tied), TABLE, tp_size=2, tp_rank=1, progress=False)
    assert got.globals is not None
    g = got.globals.weights.arrays()
    assert g["lm_head"].tobytes() == g["embed_tokens"].tobytes()
    both = copy_with(ckpt, tmp_path / "b", config={"tie_word_embeddings": True})
    assert refused(both) == (
        "model: lm_head.weight is stored, but config.json tie_word_embeddings is true: it must "
        "be bound from embed_tokens.weight, and a second copy would be ignored"
    )


def test_an_untied_base_model_without_a_head_binds_its_embedding_and_norm(
    ckpt: Path, tmp_path: Path
) -> None:
    base = copy_with(ckpt, tmp_path / "b", {"lm_head.weight": None})
    got = bind_checkpoint(CheckpointDir(base), TABLE, progress=False)
    assert got.globals is not None
    assert set(got.globals.weights.arrays()) == {"embed_tokens", "norm"}


def test_an_exact_bf16_mhc_fn_is_widened_and_a_bf16_base_refused(
    ckpt: Path, tmp_path: Path
) -> None:
    tensors = read_file(next(ckpt.glob("*.safetensors"))) | read_file(
        sorted(ckpt.glob("*.safetensors"))[-1]
    )
    fn = tensors["layers.1.hc_attn_fn"].astype(ml_dtypes.bfloat16)
    ok = copy_with(ckpt, tmp_path / "ok", {"layers.1.hc_attn_fn": fn})
    got = bind_checkpoint(CheckpointDir(ok), TABLE, progress=False)
    arr = got.layers[1].slots["mhc"].weights.arrays()["attn_fn"]
    assert arr.dtype == np.float32 and np.array_equal(arr, fn.astype(np.float32))
    assert got.layers[1].slots["mhc"].report.cast == ["hc_attn_fn: BF16 -> F32"]
    base = tensors["layers.1.hc_attn_base"].astype(ml_dtypes.bfloat16)
    msg = refused(copy_with(ckpt, tmp_path / "b", {"layers.1.hc_attn_base": base}))
    assert msg.startswith("layer 1: layers.1.hc_attn_base is BF16 but a mhc block requires F32")


def test_an_ep_rank_reads_only_its_own_experts(ckpt: Path) -> None:
    read: list[str] = []
    ck = CheckpointDir(ckpt)
    real_get = ck.get

    def spy(name: str) -> Any:
        read.append(name)
        return real_get(name)

    ck.get = spy  # type: ignore[method-assign]
    bind_checkpoint(ck, TABLE, ep_size=4, ep_rank=1, progress=False)
    experts = {n.split(".experts.")[1].split(".")[0] for n in read if ".experts." in n}
    assert experts == {"2", "3"}, "ep 4 splits 6 experts as 2, 2, 1, 1: rank 1 holds 2 and 3"
    assert len(read) == len(set(read)), "no tensor is read twice"


def test_an_ep_larger_than_the_experts_is_refused(ckpt: Path) -> None:
    with pytest.raises(GeometryError, match=r"ep size 7 is larger than the 6 experts"):
        bind_checkpoint(CheckpointDir(ckpt), TABLE, ep_size=7, ep_rank=0, progress=False)


@st.composite
def moe_cases(draw: st.DrawFn) -> tuple[Any, int, int]:
    """A MoE geometry with a tp that divides Im and an ep no larger than E."""
    tp = draw(st.sampled_from([1, 2, 4]))
    g = moe.MoeGeometry(
        hidden=draw(st.integers(1, 5)), experts=draw(st.integers(1, 9)),
        expert_intermediate=tp * draw(st.integers(1, 3)), shared_experts=draw(st.integers(1, 2)), tp=tp,
    )  # fmt: skip
    ep = draw(st.integers(1, g.experts))
    return dataclasses.replace(g, ep=ep), tp, ep


@settings(deadline=None)
@given(moe_cases(), st.integers(0, 99))
def test_moe_shares_over_tp_and_ep_partition_the_tensors_and_rejoin(
    case: tuple[Any, int, int], seed: int
) -> None:
    """Every field of every (tp, ep) rank rejoins to the tp = ep = 1 field, and the ranks read
    every expert byte exactly once and every replicated byte once per rank."""
    g, tp, ep = case
    one = dataclasses.replace(g, tp=1, ep=1)
    arrays = layer_arrays(moe, one, seed=seed)
    whole, _ = moe.bind_moe(one, 0, source(arrays))
    shares: dict[tuple[int, int], dict[str, Any]] = {}
    read = 0
    for r in range(tp):
        for e in range(ep):
            w, rep = moe.bind_moe(g, 0, source(arrays), r, ep_rank=e)
            shares[(r, e)] = w.arrays()
            read += rep.bytes
    for name, want in whole.arrays().items():
        got = rejoin(moe.FIELDS[name], {k: v[name] for k, v in shares.items()}, tp, ep)
        assert got.tobytes() == want.tobytes(), name
    experts = sum(a.nbytes for n, a in arrays.items() if ".experts." in n)
    router = sum(a.nbytes for n, a in arrays.items() if n.startswith("mlp.gate."))
    shared = sum(a.nbytes for n, a in arrays.items() if ".shared_experts." in n)
    assert read == experts + ep * shared + tp * ep * router


def test_no_layer_under_a_known_prefix_lists_the_prefixes_and_what_the_names_start_with(
    ckpt: Path, tmp_path: Path
) -> None:
    tensors: dict[str, Any] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        tensors |= {f"backbone.decoder.{n}": a for n, a in read_file(f).items()}
    (tmp_path / "b").mkdir()
    save_file(tensors, str(tmp_path / "b" / "model.safetensors"))
    (tmp_path / "b" / "config.json").write_text((ckpt / "config.json").read_text())
    msg = refused(tmp_path / "b")
    assert "no tensors named like 'layers.{index}.' under any of the prefixes" in msg
    assert "'model.language_model.'" in msg and "'language_model.'" in msg
    assert "its names start with backbone.decoder.* (" in msg


def test_synth_honours_the_shard_count_or_refuses_it(tmp_path: Path) -> None:
    summary = synth(TABLE, tmp_path / "a", TINY, layers=2, mtp=False, shards=7)
    assert summary["files"] == 7 == len(list((tmp_path / "a").glob("*.safetensors")))
    with pytest.raises(SpecbindError, match=r"--shards 100000: there are only \d+ tensors"):
        synth(TABLE, tmp_path / "b", TINY, layers=2, mtp=False, shards=100000)
    assert not (tmp_path / "b").exists()


def test_the_top_level_tie_flag_wins_over_text_config_as_in_transformers(
    ckpt: Path, tmp_path: Path
) -> None:
    """A multimodal config ties the head by its outer tie_word_embeddings; text_config's copy
    is read only when the outer one is absent."""
    cfg = json.loads((ckpt / "config.json").read_text())
    inner = cfg | {"tie_word_embeddings": False}
    tied = copy_with(ckpt, tmp_path / "t", {"lm_head.weight": None})
    (tied / "config.json").write_text(
        json.dumps({"tie_word_embeddings": True, "text_config": inner})
    )
    got = bind_checkpoint(CheckpointDir(tied), TABLE, progress=False)
    assert got.globals is not None and "lm_head" in got.globals.weights.arrays()
    untied = copy_with(ckpt, tmp_path / "u")
    inner = cfg | {"tie_word_embeddings": True}
    (untied / "config.json").write_text(
        json.dumps({"tie_word_embeddings": False, "text_config": inner})
    )
    got = bind_checkpoint(CheckpointDir(untied), TABLE, progress=False)
    assert got.globals is not None
    g = got.globals.weights.arrays()
    assert g["lm_head"].tobytes() != g["embed_tokens"].tobytes(), "the stored head is bound"


def test_audit_counts_as_problems_what_bind_refuses(ckpt: Path, tmp_path: Path) -> None:
    from specbind.audit import audit

    up = read_file(next(ckpt.glob("*.safetensors")))
    any_up = next(a for n, a in up.items() if n.endswith("experts.0.up_proj.weight"))
    a_log = next(a for n, a in up.items() if n.endswith("self_attn.A_log"))
    bad = copy_with(ckpt, tmp_path / "b", {
        "layers.4.mlp.experts.3.up_proj.weight": None,
        f"layers.5.mlp.experts.{E}.up_proj.weight": any_up,
        "layers.1.self_attn.A_log": a_log.astype(ml_dtypes.bfloat16),
        "layers.2.self_attn.extra.weight": np.zeros(2, np.float32),
    })  # fmt: skip
    rep = audit(CheckpointDir(bad), TABLE, progress=False)
    assert rep["layers"][4]["slots"]["mlp"]["missing"] == ["mlp.experts.3.up_proj.weight"]
    assert rep["layers"][5]["slots"]["mlp"]["unknown"] == [f"mlp.experts.{E}.up_proj.weight"]
    assert rep["layers"][1]["slots"]["attention"]["wrong_dtype"] == ["self_attn.A_log (BF16)"]
    problems = "\n".join(rep["problems"])
    for layer in ("layer 1: attention", "layer 2: attention", "layer 4: mlp", "layer 5: mlp"):
        assert layer in problems
    assert rep["coverage"]["unaccounted"] == 2, "the undeclared expert and the extra tensor"
    assert rep["coverage"]["bound"] + 2 == rep["tensors"]


def test_bind_reports_the_bytes_it_read_at_their_on_disk_width(ckpt: Path, tmp_path: Path) -> None:
    tensors = read_file(next(ckpt.glob("*.safetensors"))) | read_file(
        sorted(ckpt.glob("*.safetensors"))[-1]
    )
    fn = tensors["layers.1.hc_attn_fn"]
    narrow = copy_with(ckpt, tmp_path / "n", {"layers.1.hc_attn_fn": fn.astype(ml_dtypes.bfloat16)})
    wide = bind_checkpoint(CheckpointDir(ckpt), TABLE, progress=False).layers[1].slots["mhc"]
    got = bind_checkpoint(CheckpointDir(narrow), TABLE, progress=False).layers[1].slots["mhc"]
    assert wide.report.bytes - got.report.bytes == fn.nbytes // 2, "BF16 on disk: half of F32"
    assert sum(a.nbytes for a in got.weights.arrays().values()) == wide.report.bytes


def test_a_checkpoint_without_its_model_level_tensors_is_refused(
    ckpt: Path, tmp_path: Path
) -> None:
    bare = copy_with(
        ckpt, tmp_path / "b", {"embed_tokens.weight": None, "norm.weight": None,
                               "lm_head.weight": None},
    )  # fmt: skip
    msg = refused(bare)
    assert msg.startswith("model: none of the model-level tensors of lm_globals is present")


def test_audit_lists_the_model_level_problems_bind_refuses(ckpt: Path, tmp_path: Path) -> None:
    from specbind.audit import audit

    emb = read_file(sorted(ckpt.glob("*.safetensors"))[-1])["embed_tokens.weight"]
    cases = {
        "tied": ({}, {"tie_word_embeddings": True}, "lm_head.weight is stored, but config.json"),
        "no-norm": ({"norm.weight": None}, {}, "model: missing norm.weight"),
        "f32": ({"embed_tokens.weight": emb.astype(np.float32)}, {}, "embed_tokens.weight is F32"),
        "str": ({}, {"tie_word_embeddings": "false"}, "tie_word_embeddings is 'false'"),
    }
    for name, (edit, config, fragment) in cases.items():
        d = copy_with(ckpt, tmp_path / name, edit, config)
        problems = audit(CheckpointDir(d), TABLE, progress=False)["problems"]
        assert any(fragment in p for p in problems), (name, problems)
        with pytest.raises(SpecbindError):
            bind_checkpoint(CheckpointDir(d), TABLE, progress=False)


def test_an_implausible_layer_count_is_refused_in_one_line(ckpt: Path, tmp_path: Path) -> None:
    d = copy_with(ckpt, tmp_path / "b", config={"num_hidden_layers": 10**9})
    with pytest.raises(SpecbindError, match=r"num_hidden_layers is 1000000000, expected a whole"):
        bind_checkpoint(CheckpointDir(d), TABLE, progress=False)


def test_audit_lists_every_bad_per_layer_config_value_rather_than_stopping_at_one(
    ckpt: Path, tmp_path: Path
) -> None:
    from specbind.audit import audit

    cfg = json.loads((ckpt / "config.json").read_text())
    idx, types = list(cfg["indexer_types"]), list(cfg["layer_types"])
    idx[3], types[0] = "bogus", "bogus"
    d = copy_with(ckpt, tmp_path / "b", config={"indexer_types": idx, "layer_types": types})
    problems = audit(CheckpointDir(d), TABLE, progress=False)["problems"]
    assert any(p.startswith("layer 3: config.json: indexer_types[3] is 'bogus'") for p in problems)
    assert any(p.startswith("layer 0: config.json layer_types[0] is 'bogus'") for p in problems)
