"""Engine layouts (specs/engines/<engine>/<model>.yaml): checked at generate time against the
model spec, and at load every engine parameter filled exactly once or refused by name.

No engine here: the parameters are torch tensors of the shapes vLLM gives them (the claims
against a real vLLM are tests/vllm/test_vllm_proofs.py's and tests/vllm/test_vllm_loader.py's).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from specbind.core.errors import BindError, SpecError
from specbind.engine import EngineField, bind_for_engine, fill
from specbind.generator.render import render_all

REPO = Path(__file__).resolve().parents[2]
LAYOUT = "engines/vllm/blocks/mla_lora.yaml"  # the engine's layout of DeepSeek-V3's MLA
VLLM = REPO / "specs" / "engines" / "vllm"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    return tmp_path


def edit(root: Path, old: str, new: str, file: str = LAYOUT) -> None:
    p = root / "specs" / file
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new, 1))


def own_blocks(root: Path, model: str = "llama") -> None:
    """``model``'s layout with every block written in it (the model's own entries, which
    replace the engine's block layouts whole), copied from the block layouts' text: where a
    test edits one model's layout alone."""
    p = root / "specs" / "engines" / "vllm" / f"{model}.yaml"
    out = ["blocks:\n"]
    for b in ("gqa", "dense", "layer_norms", "lm_globals"):
        text = (root / "specs" / "engines" / "vllm" / "blocks" / f"{b}.yaml").read_text()
        key = "\noutputs:\n" if "\noutputs:\n" in text else "\nparameters:\n"
        body = text[text.index(key) + 1 :].splitlines(keepends=True)
        out.append(f"  {b}:\n" + "".join("    " + x if x.strip() else x for x in body))
    p.write_text(p.read_text() + "".join(out))


def refusal(root: Path) -> str:
    with pytest.raises(SpecError) as e:
        render_all(root)
    return str(e.value)


def test_one_engines_layouts_share_a_variant_and_emit_none_for_blocks_read_as_bound(
    tmp_path: Path,
) -> None:
    files = render_all(REPO)
    engines = sorted(f for f in files if f.startswith("engines/"))
    # Llama and Qwen3-MoE read gqa alike: one module; dense, norms: the model's binders; the
    # globals' padded vocabulary split (the tensors read whole, sliced by the engine's rule):
    # one variant for all three layouts
    gqa = [f for f in engines if f.endswith("_gqa.py")]
    shared = [f for f in gqa if "specs/engines/vllm/blocks/gqa.yaml" in files[f].splitlines()[0]]
    assert len(shared) == 1, gqa
    # a model whose layout reads gqa otherwise has its own (Llama 4's q/k reorder), from its
    # layout alone
    for f in set(gqa) - set(shared):
        head = files[f].splitlines()[0]
        assert "specs/engines/vllm/llama4-text.yaml" in head, (f, head)
    assert [f for f in engines if f.endswith("_lm_globals.py")] == ["engines/vllm_lm_globals.py"]
    from specbind.generated.engines import ENGINES

    tables = {f"engines/vllm_{n.replace('-', '_')}.py" for _, n in ENGINES}  # the layouts'
    variants = [f for f in engines if f not in tables]
    assert not any(f.endswith("_layer_norms.py") for f in variants), variants
    # dense: one variant, GLM's split of the stored fused gate_up (specs/engines/vllm/glm.yaml)
    assert [f for f in variants if f.endswith("_dense.py")] == ["engines/vllm_dense.py"]
    assert "glm.yaml" in files["engines/vllm_dense.py"].splitlines()[0]
    # a layout that makes another gqa variant gets a module of its own, named by its model
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    own_blocks(tmp_path)
    p = tmp_path / "specs" / "engines" / "vllm" / "llama.yaml"
    text = p.read_text()
    assert "self_attn.qkv_proj.weight: qkv_proj" in text
    p.write_text(
        text.replace("qkv_proj: {concat:", "qkv_fused: {concat:", 1).replace(
            "self_attn.qkv_proj.weight: qkv_proj", "self_attn.qkv_proj.weight: qkv_fused", 1
        )
    )
    ours = sorted(f for f in render_all(tmp_path) if f.endswith("_gqa.py"))
    assert len(ours) == len(gqa) + 1 and "engines/vllm_llama_gqa.py" in ours, ours


def test_a_parameter_naming_no_field_is_refused_at_generate(root: Path) -> None:
    edit(root, "self_attn.q_a_layernorm.weight: q_a_layernorm",
         "self_attn.q_a_layernorm.weight: q_a_norm")  # fmt: skip
    msg = refusal(root)
    assert LAYOUT in msg and "field 'q_a_norm' is neither a field of block" in msg, msg


def test_a_tensor_feeding_no_engine_parameter_is_refused_at_generate(root: Path) -> None:
    edit(root, "self_attn.kv_a_layernorm.weight: kv_a_layernorm", "")
    assert "tensor 'kv_a_layernorm.weight'" in refusal(root)


def test_an_engine_shape_the_field_does_not_bind_is_refused_naming_the_tp(root: Path) -> None:
    edit(root, "shape: [hidden, heads / tp * v_head_dim]", "shape: [hidden, heads * v_head_dim]")
    msg = refusal(root)
    assert "self_attn.o_proj.weight" in msg and "tp 2" in msg and "the engine's shape is" in msg


def test_one_field_filling_two_parameters_is_refused(root: Path) -> None:
    edit(root, "model.norm.weight: norm", "model.norm.weight: norm\n  model.norm2.weight: norm",
         "engines/vllm/blocks/lm_globals.yaml")  # fmt: skip
    assert "field 'norm' already fills 'model.norm.weight'" in refusal(root)


def test_an_engine_output_no_parameter_takes_is_refused(root: Path) -> None:
    edit(root, "\noutputs:\n", "\noutputs:\n  spare: o_proj.weight\n")
    assert "engine output 'spare' fills no parameter" in refusal(root)


# -- fill: every parameter once, equal shape and dtype, nothing left over ------------------


@pytest.fixture(scope="module")
def fields(tmp_path_factory: pytest.TempPathFactory) -> dict[str, EngineField]:
    from specbind.cli import main

    ckpt = tmp_path_factory.mktemp("ds") / "ckpt"
    assert main(["synth", "--model", "deepseek-v3", str(ckpt)]) == 0
    return bind_for_engine(ckpt, "vllm", tp_size=2, tp_rank=1)


def _params(fields: dict[str, EngineField]) -> dict[str, Any]:
    import torch

    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
    return {n: torch.zeros(f.array.shape, dtype=dtypes[f.dtype]) for n, f in fields.items()}


def test_fill_copies_every_field_bit_for_bit_into_its_parameter(
    fields: dict[str, EngineField],
) -> None:
    import numpy as np
    import torch

    params = _params(fields)
    fill("vllm", params, fields)
    for n, f in fields.items():
        got = params[n].view(torch.int16 if f.dtype == "BF16" else torch.int32).numpy()
        assert np.array_equal(got, np.ascontiguousarray(f.array).view(got.dtype)), n


def test_a_parameter_no_field_fills_is_refused_and_nothing_is_written(
    fields: dict[str, EngineField],
) -> None:
    import torch

    params = _params(fields)
    params["model.layers.0.self_attn.extra.weight"] = torch.zeros(3)
    with pytest.raises(
        BindError,
        match=r"parameter 'model.layers.0.self_attn.extra.weight' is filled by no bound field",
    ):
        fill("vllm", params, fields)
    assert all(not p.any() for p in params.values())


def test_a_field_the_engine_holds_no_parameter_for_is_refused(
    fields: dict[str, EngineField],
) -> None:
    params = _params(fields)
    del params["model.norm.weight"]
    with pytest.raises(
        BindError, match=r"globals.norm has no engine parameter 'model.norm.weight'"
    ):
        fill("vllm", params, fields)


def test_a_parameter_of_another_shape_or_dtype_is_refused_naming_both(
    fields: dict[str, EngineField],
) -> None:
    import torch

    name = "model.layers.3.mlp.experts.routed_experts.w13_weight"
    params = _params(fields)
    e, rows, hidden = fields[name].array.shape  # this rank's [experts, 2 * inter / tp, hidden]
    params[name] = torch.zeros(e, 2 * rows, hidden, dtype=torch.bfloat16)
    with pytest.raises(
        BindError,
        match=rf"is \[{e}, {2 * rows}, {hidden}\] bfloat16, but bound field layers.3.mlp.w13 "
        rf"is \[{e}, {rows}, {hidden}\] BF16",
    ):
        fill("vllm", params, fields)
    params = _params(fields)
    bias = "model.layers.3.mlp.gate.e_score_correction_bias"
    params[bias] = params[bias].to(torch.bfloat16)
    with pytest.raises(
        BindError, match=r"e_score_correction_bias' is \[6\] bfloat16, but bound field .* F32"
    ):
        fill("vllm", params, fields)


def test_a_tied_head_fills_nothing_where_the_engine_holds_it_as_the_embedding(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    import torch
    import transformers
    from hf_random import write_random
    from vllm_rows import LLAMA_LIKE, NOTHING

    ckpt = tmp_path / "tied"
    write_random(transformers.LlamaForCausalLM, transformers.LlamaConfig,
                 LLAMA_LIKE | {"tie_word_embeddings": True}, ckpt, NOTHING)  # fmt: skip
    fields = bind_for_engine(ckpt, "vllm", tp_size=2, tp_rank=0)
    assert fields["lm_head.weight"].tied_to == "model.embed_tokens.weight"
    params = _params(fields)
    del params["lm_head.weight"]  # vLLM lists a tied head once, as the embedding
    fill("vllm", params, fields)
    emb = params["model.embed_tokens.weight"]
    assert emb.any() and torch.equal(emb, _params(fields)["lm_head.weight"] + emb)
    both = _params(fields)  # an engine that keeps two copies gets both filled
    fill("vllm", both, fields)
    assert torch.equal(both["lm_head.weight"], both["model.embed_tokens.weight"])


def test_an_engine_shape_over_a_computed_symbol_is_checked_with_its_tiny_value(
    root: Path,
) -> None:
    # q_width = heads * head_dim: 4096 at the real geometry, 96 at the tiny one. The o_proj
    # shape over it holds at both; checked with the real q_width beside tiny heads it was
    # refused ("the engine's shape is [40, 4096]"), and a wrong one must still be refused.
    # (Qwen3-MoE, which no model extends: a symbol added to it reaches no other model.)
    model = root / "specs" / "models" / "qwen3-moe.yaml"
    text = model.read_text()
    anchor = "  head_dim:         {config: head_dim, default: hidden / heads, value: 128}\n"
    assert anchor in text
    model.write_text(
        text.replace(anchor, anchor + "  q_width: {expr: heads * head_dim, value: 4096}\n")
    )
    own_blocks(root, "qwen3-moe")  # its attention written in its layout; its moe the engine's
    layout = root / "specs" / "engines" / "vllm" / "qwen3-moe.yaml"
    old = "shape: [hidden, heads / tp * head_dim]"
    text = layout.read_text()
    assert old in text
    layout.write_text(text.replace(old, "shape: [hidden, q_width / tp]"))
    render_all(root)
    layout.write_text(text.replace(old, "shape: [hidden, q_width / tp + kv_heads - 4]"))
    msg = refusal(root)  # kv_heads - 4 is 0 at the real geometry, -2 at the tiny one
    assert "synth tiny geometry, tp 1" in msg and "[40, 94]" in msg and "[40, 96]" in msg, msg


# -- padded splits: vLLM's VocabParallelEmbedding pads the vocabulary to a multiple of 64 ----


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specbind.cli import main

    ckpt = tmp_path_factory.mktemp("llama") / "ckpt"
    assert main(["synth", "--model", "llama", str(ckpt)]) == 0  # tiny vocab 112, hidden 40
    return ckpt


def _stored(ckpt: Path, name: str) -> Any:
    """Tensor ``name`` as stored, its BF16 read as raw 16-bit integers (from the file's
    header and bytes, not through specbind)."""
    import json
    import struct

    import numpy as np

    file = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"][name]
    raw = (ckpt / file).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    meta = json.loads(raw[8 : 8 + n])[name]
    start, end = meta["data_offsets"]
    return np.frombuffer(raw[8 + n + start : 8 + n + end], "<i2").reshape(meta["shape"])


def test_a_vocabulary_of_112_gives_each_rank_vllms_padded_rows_then_zeros(
    llama_ckpt: Path,
) -> None:
    import numpy as np

    names = ("model.embed_tokens.weight", "lm_head.weight")
    stored = {n: _stored(llama_ckpt, n.removeprefix("model.")) for n in names}  # synth: no model.
    assert all(s.shape == (112, 40) and (s != 0).all(axis=1).all() for s in stored.values())
    # vLLM pads 112 to 128: tp 1 holds 112 rows and 16 zero rows; at tp 2 rank 0 holds
    # [0, 64), rank 1 [64, 112) and 16 zero rows (an unpadded split gives [0, 56)); rank 3 of
    # tp 4 [96, 112) and 16 zero rows
    for tp, rank, (start, end) in [(1, 0, (0, 112)), (2, 0, (0, 64)), (2, 1, (64, 112)),
                                   (4, 3, (96, 112))]:  # fmt: skip
        fields = bind_for_engine(llama_ckpt, "vllm", tp_size=tp, tp_rank=rank)
        for n in names:
            got = np.asarray(fields[n].array).view("<i2")
            assert got.shape == (128 // tp, 40), (n, tp, rank)
            assert np.array_equal(got[: end - start], stored[n][start:end]), (n, tp, rank)
            assert not got[end - start :].any(), (n, tp, rank)


def test_a_padded_parameter_fills_the_engines_padded_parameter(llama_ckpt: Path) -> None:
    import numpy as np
    import torch

    fields = bind_for_engine(llama_ckpt, "vllm", tp_size=2, tp_rank=1)
    params = _params(fields)
    assert tuple(params["model.embed_tokens.weight"].shape) == (64, 40)
    fill("vllm", params, fields)
    got = params["model.embed_tokens.weight"].view(torch.int16).numpy()
    want = _stored(llama_ckpt, "embed_tokens.weight")
    assert np.array_equal(got[:48], want[64:]) and not got[48:].any()


def _pad_edit(root: Path, old: str, new: str, file: str = "engines/vllm/llama.yaml") -> None:
    p = root / "specs" / file
    if file.endswith("llama.yaml") and "blocks:" not in p.read_text():
        own_blocks(root)
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new))


def test_a_padded_split_with_the_unpadded_shape_is_refused_naming_the_parameter(
    root: Path,
) -> None:
    _pad_edit(
        root, 'shape: ["(vocab + 63) // 64 * 64 / tp", hidden]', "shape: [vocab / tp, hidden]"
    )
    msg = refusal(root)  # the real 128256 is a multiple of 64; the tiny 112 is not
    assert "model.embed_tokens.weight of llama at the synth tiny geometry, tp 1" in msg, msg
    assert "the engine's shape is [112, 40], field 'embed_tokens' binds [128, 40]" in msg, msg


def test_a_padding_tp_does_not_split_is_refused_at_generate(root: Path) -> None:
    _pad_edit(root, "pad: {multiple: 64,", "pad: {multiple: 3,")
    _pad_edit(root, '"(vocab + 63) // 64 * 64 / tp"', '"(vocab + 2) // 3 * 3 / tp"')
    msg = refusal(root)  # 128256 is a multiple of 3 and of 8; the tiny 112 pads to 114
    assert "lm_globals.parameters.model.embed_tokens.weight.pad" in msg, msg
    assert "112 padded to a multiple of 3 is 114, which tp 4 does not split" in msg, msg


def test_padding_a_replicated_tensor_or_one_side_of_a_tie_is_refused(root: Path) -> None:
    pad = '        pad: {multiple: 64, why: "VocabParallelEmbedding: DEFAULT_VOCAB_PADDING_SIZE"}\n'
    _pad_edit(root, "      model.norm.weight: norm\n",
              "      model.norm.weight:\n        field: norm\n" + pad)  # fmt: skip
    assert "tensor 'norm.weight' is replicated: there is no split to pad" in refusal(root)
    shutil.rmtree(root / "specs")
    shutil.copytree(REPO / "specs", root / "specs")
    own_blocks(root)
    p = root / "specs" / "engines" / "vllm" / "llama.yaml"
    text = p.read_text()
    p.write_text(text[: text.rindex(pad)] + text[text.rindex(pad) + len(pad) :])  # head unpadded
    msg = refusal(root)
    assert "'lm_head.weight' is tied to 'embed_tokens.weight': pad both" in msg, msg


# -- what the engine's loader does to values: functions, rank 0 alone, its tp checks ---------

_OPS = (
    ("      model.norm.weight: norm\n",
     "      model.norm.weight: {field: norm, apply: [exp, neg], dtype: F32, why: A = -exp(A_log)}\n"),
    ("      input_layernorm.weight: input_norm\n",
     "      input_layernorm.weight: {field: input_norm, ranks: first, why: added after the reduce}\n"),
    ("blocks:\n",
     "constraints:\n  - {name: kv_split, check: tp <= kv_heads, why: one KV head a rank at least}\n"
     "blocks:\n"),
)  # fmt: skip


@pytest.fixture(scope="module")
def ops_layout(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The llama layout with the three declared, rendered from YAML and loaded as a module."""
    import types

    root = tmp_path_factory.mktemp("ops")
    shutil.copytree(REPO / "specs", root / "specs")
    for old, new in _OPS:
        _pad_edit(root, old, new)
    module = types.ModuleType("vllm_llama_ops")
    exec(
        compile(render_all(root)["engines/vllm_llama.py"], "vllm_llama_ops", "exec"),
        module.__dict__,
    )
    return module.LAYOUT


def test_declared_functions_and_rank_0_alone_give_the_values_the_engine_holds(
    llama_ckpt: Path, ops_layout: Any
) -> None:
    import numpy as np
    import torch

    stored_norm = _stored(llama_ckpt, "norm.weight").astype("<u4") << 16  # BF16 bits -> F32
    stored_ln = _stored(llama_ckpt, "layers.0.input_layernorm.weight")
    ranks = [bind_for_engine(llama_ckpt, "vllm", tp_size=2, tp_rank=r, layout=ops_layout)
             for r in (0, 1)]  # fmt: skip
    for fields in ranks:
        norm = fields["model.norm.weight"]
        assert norm.dtype == "F32" and norm.array.dtype == np.float32
        # torch's kernels, as vLLM's loader computes -torch.exp(A_log.float()) (NumPy's exp
        # rounds otherwise in the last bits)
        want = (-torch.exp(torch.from_numpy(stored_norm.view(np.float32)))).numpy()
        assert np.array_equal(norm.array, want)
    ln0, ln1 = (f["model.layers.0.input_layernorm.weight"] for f in ranks)
    assert np.array_equal(np.asarray(ln0.array).view("<i2"), stored_ln) and stored_ln.any()
    assert ln1.dtype == "BF16" and ln1.array.shape == stored_ln.shape and not ln1.array.any()
    # and fill puts them in F32 and BF16 parameters as they are
    params = _params(ranks[1])
    fill("vllm", params, ranks[1])
    assert np.array_equal(params["model.norm.weight"].numpy(), ranks[1]["model.norm.weight"].array)


def test_a_tp_an_engine_constraint_forbids_is_refused_naming_it(
    llama_ckpt: Path, ops_layout: Any
) -> None:
    with pytest.raises(
        BindError,
        match=r"vllm refuses llama at tp 4: constraint kv_split \(tp <= kv_heads\) fails at "
        r"kv_heads=2, tp=4: one KV head a rank at least",
    ):
        bind_for_engine(llama_ckpt, "vllm", tp_size=4, tp_rank=0, layout=ops_layout)


def test_a_function_that_overflows_a_finite_stored_value_is_refused_naming_the_index(
    llama_ckpt: Path, ops_layout: Any, tmp_path: Path
) -> None:
    import json
    import struct

    ckpt = tmp_path / "hot"
    shutil.copytree(llama_ckpt, ckpt)
    file = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    path = ckpt / file["norm.weight"]
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    start = json.loads(raw[8 : 8 + n])["norm.weight"]["data_offsets"][0]
    raw[8 + n + start + 2 * 7 : 8 + n + start + 2 * 8] = struct.pack("<H", 0x42C8)  # BF16 100.0
    path.write_bytes(bytes(raw))
    with pytest.raises(
        BindError,
        match=r"parameter 'model.norm.weight': exp then neg of the stored value 100.0 at index "
        r"\[7\] is -inf in F32",
    ):
        bind_for_engine(ckpt, "vllm", layout=ops_layout)


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("self_attn.o_proj.weight: {field: o_proj,", "self_attn.o_proj.weight: {field: o_proj, apply: [exp],",
         "apply computes on the stored float values; field 'o_proj' reads 'o_proj.weight', a linear"),
        ("self_attn.o_proj.weight: {field: o_proj,", "self_attn.o_proj.weight: {field: o_proj, ranks: first,",
         "field 'o_proj' reads 'o_proj.weight', which is split across ranks"),
        ("blocks:\n", "constraints:\n  - {name: big, check: heads > 64, why: w}\nblocks:\n",
         "at the real geometry, tp 1: constraint big fails: w"),
        ("blocks:\n", "constraints:\n  - {name: odd, check: groups % tp == 0, why: w}\nblocks:\n",
         "unknown symbol(s) groups in 'groups % tp == 0'"),
    ],
)  # fmt: skip
def test_functions_rank_0_and_constraints_the_field_or_geometry_cannot_take_are_refused(
    root: Path, old: str, new: str, says: str
) -> None:
    _pad_edit(root, old, new)
    msg = refusal(root)
    assert "specs/engines/vllm/llama.yaml" in msg and says in msg, msg


# -- proof status: each layout names the test that proves it against the engine's loader -----


def test_every_engine_layout_names_the_proof_that_runs_it_against_the_engines_loader() -> None:
    import yaml
    from vllm_rows import ROWS

    layouts = sorted((REPO / "specs" / "engines").glob("*/*.yaml"))
    assert layouts
    proven: dict[str, set[str]] = {}
    for p in layouts:
        data = yaml.safe_load(p.read_text())
        if "unavailable" in data:  # no layout: the engine cannot run the model (measured)
            continue
        proof = data.get("proof")
        if proof is None:  # the engine cannot build it: the measured reason, not silence
            assert data.get("unproven"), f"{p.relative_to(REPO)} names no proof and no reason"
            continue
        assert (REPO / proof["test"]).is_file(), proof["test"]
        proven.setdefault(p.parent.name, set()).add(p.stem)
    # the vLLM proof runs every vLLM layout, and only those, on each rank of each row's tp
    assert {r.model for r in ROWS} == proven.pop("vllm")
    assert not proven, f"layouts of engines no test runs: {proven}"
    text = (REPO / "tests" / "vllm" / "test_vllm_proofs.py").read_text()
    claim = "test_every_vllm_parameter_after_loading_equals_the_default_loaders_on_each_rank"
    assert f"def {claim}(" in text and '@pytest.mark.parametrize(("model", "tp"), CASES)' in text


def test_a_layout_without_a_proof_is_reported_by_generate_and_warned_of_at_bind(
    root: Path,
    llama_ckpt: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    import specbind.generator.render as render
    from specbind.cli import main

    p = root / "specs" / "engines" / "vllm" / "llama.yaml"
    text = p.read_text()
    lines = text.splitlines(keepends=True)
    start = next(i for i, x in enumerate(lines) if x.startswith("proof:"))
    end = next(
        (i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines)
    )
    p.write_text("".join(lines[:start] + lines[end:]))  # the whole proof: mapping
    monkeypatch.setattr(render, "generate", lambda root, out: [])  # the note, not the writes
    assert main(["generate", "--root", str(root)]) == 0
    err = capsys.readouterr().err
    assert "note: specs/engines/vllm/llama.yaml is unproven" in err, err
    assert "qwen3-moe" not in err
    module = types.ModuleType("vllm_llama_unproven")
    src = render_all(root)["engines/vllm_llama.py"]
    assert "# UNPROVEN: no test proves this layout" in src
    exec(compile(src, "vllm_llama_unproven", "exec"), module.__dict__)
    assert module.LAYOUT.proof is None
    with caplog.at_level("WARNING", logger="specbind.engine"):
        bind_for_engine(llama_ckpt, "vllm", layout=module.LAYOUT)
    (rec,) = [r for r in caplog.records if r.name == "specbind.engine"]
    assert "the vllm layout of llama is unproven" in rec.getMessage()
    caplog.clear()
    with caplog.at_level("WARNING", logger="specbind.engine"):
        bind_for_engine(llama_ckpt, "vllm")  # the generated, proven layout: no warning
    assert not [r for r in caplog.records if r.name == "specbind.engine"]
