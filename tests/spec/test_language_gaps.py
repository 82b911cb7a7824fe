"""Three constructs the mainstream families needed, each accepted where it is sound and refused
in one line where it is not:

* ``max(...)`` / ``min(...)`` in the shape algebra: exact integers, usable in shapes, derived
  symbols, geometry expressions, constraints and engine shapes; the generated code computes
  what the evaluator does. A sharded dim holding one (itself or through a derived symbol) is
  refused, since the whole-units proofs cannot expand it;
* model-level ``names:`` (``scope: model``): another writer's name for a model-level tensor
  (a final norm called ``final_layernorm``) renamed onto the globals block's own, under the
  text model's prefix; a rename into a tensor the globals block lacks, or read as sections,
  is refused;
* ``never_replicated`` units: a tp past the unit's count is refused by name (query heads),
  while a unit that may replicate (KV heads) still does.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specbind.core import algebra, algebra_ops
from specbind.core.errors import AlgebraError, BindError, GeometryError, SpecError
from specbind.core.ir import NameRule
from specbind.generated import MODELS
from specbind.generator import engines
from specbind.generator.render import load_specs, render_all
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.io.source import DictSource, RawTensor

REPO = Path(__file__).resolve().parents[2]
GQA = "blocks/gqa.yaml"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    return tmp_path


def edit(root: Path, rel: str, old: str, new: str) -> None:
    p = root / "specs" / rel
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new, 1))


def _module(root: Path, name: str) -> Any:
    """A block module rendered from the specs under ``root``, imported from its source."""
    source = render_all(root)[f"{name}.py"]
    mod = types.ModuleType(f"specbind_gaps_{name}")
    sys.modules[mod.__name__] = mod
    exec(compile(source, f"{name}.py", "exec"), mod.__dict__)
    return mod


# --- max / min -------------------------------------------------------------------------------

EXTREMA = "max(a, b) * c - min(a, c // 2, 7) + max(min(a, b), c)"


@given(st.integers(1, 10**6), st.integers(1, 10**6), st.integers(1, 10**6))
def test_max_and_min_evaluate_exactly_and_the_generated_python_agrees(
    a: int, b: int, c: int
) -> None:
    e = algebra.parse(EXTREMA)
    want = max(a, b) * c - min(a, c // 2, 7) + max(min(a, b), c)
    env = {"a": a, "b": b, "c": c}
    assert e.names == {"a", "b", "c"}  # max and min are functions, not symbols
    assert algebra.evaluate(e, env) == want
    code = algebra.to_python(e, lambda s: f"g.{s}")
    assert "algebra_ops.maximum(" in code and "algebra_ops.minimum(" in code
    g = types.SimpleNamespace(**env)
    assert eval(code, {"algebra_ops": algebra_ops, "g": g}) == want  # the algebra's own output


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("max(a)", "needs two or more arguments"),
        ("max + 1", "max is a function, not a symbol"),
        ("abs(a, b)", "only max(...) and min(...)"),
        ("max(a, b=2)", "positional arguments only"),
        ("max(*a, b)", "positional arguments only"),
        ("a.max(1, 2)", "only max(...) and min(...)"),
        ("max(a, 1.5)", "only integer literals"),
        ("max(a", "quote an expression holding a comma"),
    ],
)
def test_a_misused_max_or_min_is_refused_in_one_line(text: str, fragment: str) -> None:
    with pytest.raises(AlgebraError) as e:
        algebra.parse(text)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_a_derived_symbol_with_max_sizes_an_unsharded_tensor_and_binds_right(root: Path) -> None:
    """q_norm over ``max(head_dim, kv_heads)`` rows: the generated binder computes the
    extremum (here kv_heads, 4, not head_dim, 3) and binds the stored norm whole."""
    edit(root, GQA, "  kv_dim: kv_heads * head_dim\n",
         "  kv_dim: kv_heads * head_dim\n  norm_dim: max(head_dim, kv_heads)\n")  # fmt: skip
    edit(root, GQA, "q_norm.weight: {dtype: BF16, shape: [head_dim]",
         "q_norm.weight: {dtype: BF16, shape: [norm_dim]")  # fmt: skip
    mod = _module(root, "gqa")
    x, h, kv, d, tp = 10, 4, 4, 3, 2
    rng = np.random.default_rng(1)
    shapes = {
        "q_proj.weight": (h * d, x), "k_proj.weight": (kv * d, x), "v_proj.weight": (kv * d, x),
        "o_proj.weight": (x, h * d), "q_norm.weight": (max(d, kv),), "k_norm.weight": (d,),
    }  # fmt: skip
    arrays = {
        "self_attn." + n: rng.standard_normal(s).astype(ml_dtypes.bfloat16)
        for n, s in shapes.items()
    }
    raw = {n: RawTensor("BF16", a.shape, memoryview(a.tobytes())) for n, a in arrays.items()}
    g = mod.GqaGeometry(hidden=x, heads=h, kv_heads=kv, head_dim=d, tp=tp)
    assert mod.env(g)["norm_dim"] == 4
    for r in range(tp):
        w, _ = mod.bind_gqa(g, 0, DictSource(raw), r)
        assert w.q_norm.tobytes() == arrays["self_attn.q_norm.weight"].tobytes()
        rows = slice(r * h * d // tp, (r + 1) * h * d // tp)
        assert w.q_proj.tobytes() == arrays["self_attn.q_proj.weight"][rows].tobytes()


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("q_proj.weight: {dtype: BF16, shape: [q_dim, hidden]",
         'q_proj.weight: {dtype: BF16, shape: ["max(q_dim, hidden)", hidden]', "holds max/min"),
        ("  q_dim: heads * head_dim\n", "  q_dim: max(heads, 2) * head_dim\n",
         "through derived 'max(heads, 2) * head_dim'"),
    ],
    ids=["in-the-dim", "through-a-derived-symbol"],
)  # fmt: skip
def test_max_in_a_sharded_dim_is_refused_at_generate_naming_the_tensor(
    root: Path, old: str, new: str, fragment: str
) -> None:
    edit(root, GQA, old, new)
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.path == "tensors.q_proj.weight.shard", str(e.value)
    assert fragment in e.value.message and "\n" not in str(e.value)


QKV = "      qkv_proj: {concat: [q_proj.weight, k_proj.weight, v_proj.weight], axis: 0}\n"


def _engine_check(root: Path, shape: str) -> None:
    # vLLM's gqa block layout, which every model with a gqa block and a vLLM layout takes
    edit(root, "engines/vllm/blocks/gqa.yaml", "  self_attn.qkv_proj.weight: qkv_proj\n",
         f"  self_attn.qkv_proj.weight: {{field: qkv_proj, shape: [{shape}, hidden]}}\n")  # fmt: skip
    specs = load_specs(root)
    list(engines.load_engines(root, specs.models, specs.blocks))


def test_an_engine_shape_with_max_states_the_replicated_kv_heads_and_a_wrong_one_is_refused(
    root: Path,
) -> None:
    """vLLM's fused qkv holds max(kv_heads / tp, 1) KV heads per rank; the checker evaluates
    the engine shape at every tp the units allow and both geometries (real and tiny)."""
    _engine_check(root, '"(heads / tp + max(kv_heads // tp, 1) * 2) * head_dim"')
    shutil.rmtree(root / "specs")
    shutil.copytree(REPO / "specs", root / "specs")
    with pytest.raises(SpecError) as e:
        _engine_check(root, '"(heads / tp + max(kv_heads // tp, 2) * 2) * head_dim"')
    assert "qkv_proj" in str(e.value) and "\n" not in str(e.value)


# --- model-level names -----------------------------------------------------------------------


def _rename_in_file(f: Path, old: str, new: str) -> bool:
    """Rename one tensor of a safetensors file in its JSON header (the data bytes unchanged)."""
    blob = f.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    if old not in header:
        return False
    header[new] = header.pop(old)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data stays 8-byte aligned
    f.write_bytes(len(text).to_bytes(8, "little") + text + blob[8 + n :])
    return True


def _llama_with_renamed_norm(tmp_path: Path) -> tuple[Path, bytes]:
    """A tiny Llama checkpoint whose final norm is stored as ``final_layernorm.weight``."""
    from specbind.synth import synth, tiny_values

    table = MODELS["llama"]
    out = tmp_path / "ck"
    synth(table, out, tiny_values(table), layers=2, seed=3)
    norm = CheckpointDir(out).get("norm.weight")
    assert norm is not None
    data = bytes(norm.data)
    assert sum(_rename_in_file(f, "norm.weight", "final_layernorm.weight")
               for f in out.glob("*.safetensors")) == 1  # fmt: skip
    index = out / "model.safetensors.index.json"
    if index.exists():
        doc = json.loads(index.read_text())
        doc["weight_map"]["final_layernorm.weight"] = doc["weight_map"].pop("norm.weight")
        index.write_text(json.dumps(doc))
    return out, data


def test_a_model_level_name_binds_a_final_norm_stored_under_another_name(tmp_path: Path) -> None:
    ck, norm = _llama_with_renamed_norm(tmp_path)
    table = MODELS["llama"]
    with pytest.raises(BindError) as e:  # without the rule the renamed norm is unclaimed
        bind_checkpoint(CheckpointDir(ck), table, progress=False)
    assert "final_layernorm.weight" in str(e.value)
    rule = NameRule("final_layernorm.", ("norm.",), "another writer's final norm", scope="model")
    renamed = dataclasses.replace(table, names=(*table.names, rule))
    for tp in (1, 2):
        bound = bind_checkpoint(CheckpointDir(ck), renamed, tp_size=tp, tp_rank=tp - 1,
                                progress=False).fields()  # fmt: skip
        assert bound["globals.norm"][1].tobytes() == norm


def test_nemotron_h_names_its_embedding_and_final_norm_by_model_level_names() -> None:
    """The 28-line copy of the globals block (backbone_globals) is gone: two rules suffice."""
    table = MODELS["nemotron-h"]
    model = [(r.source, r.to) for r in table.names if r.scope == "model"]
    assert model == [
        ("embeddings.weight", ("embed_tokens.weight",)),
        ("norm_f.weight", ("norm.weight",)),
    ]
    assert table.globals == "lm_globals"


NEMOTRON = "models/nemotron-h.yaml"
RULE = "  - {from: norm_f.weight, to: norm.weight, scope: model, why: the final RMSNorm}\n"


@pytest.mark.parametrize(
    ("new", "path", "fragment"),
    [
        ("  - {from: norm_f.weight, to: final.weight, scope: model, why: x}\n", "names[4].to",
         "declares no tensor 'final.weight'"),
        ("  - {from: norm_f.weight, to: [a.weight, b.weight], segments: 2, scope: model, "
         "why: x}\n", "names[4].scope", "never read as sections"),
        ('  - {from: "norm_f.{e}.weight", to: "norm.{e}.weight", scope: model, why: x}\n',
         "names[4].scope", "no family placeholder"),
    ],
    ids=["into-nothing", "as-sections", "with-a-placeholder"],
)  # fmt: skip
def test_a_bad_model_level_name_is_refused_in_one_line(
    root: Path, new: str, path: str, fragment: str
) -> None:
    edit(root, NEMOTRON, RULE, new)
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.file == f"specs/{NEMOTRON}" and e.value.path == path, str(e.value)
    assert fragment in e.value.message and "\n" not in str(e.value)


# --- never-replicated units -----------------------------------------------------------------


def _gqa_source(h: int, kv: int, d: int, x: int) -> DictSource:
    rng = np.random.default_rng(2)
    shapes = {
        "q_proj.weight": (h * d, x), "k_proj.weight": (kv * d, x), "v_proj.weight": (kv * d, x),
        "o_proj.weight": (x, h * d),
    }  # fmt: skip
    raw = {}
    for n, s in shapes.items():
        a = rng.standard_normal(s).astype(ml_dtypes.bfloat16)
        raw["self_attn." + n] = RawTensor("BF16", a.shape, memoryview(a.tobytes()))
    return DictSource(raw)


def test_query_heads_are_never_replicated_a_tp_past_them_is_refused_by_name() -> None:
    from specbind.generated import gqa

    src = _gqa_source(4, 2, 3, 10)
    g = gqa.GqaGeometry(hidden=10, heads=4, kv_heads=2, head_dim=3, tp=8)
    with pytest.raises(GeometryError) as e:
        gqa.bind_gqa(g, 0, src, 5)
    msg = str(e.value)
    assert "q_proj.weight" in msg and "heads = 4 units, fewer than tp 8" in msg
    assert "never replicated" in msg and "\n" not in msg


def test_kv_heads_still_replicate_where_tp_exceeds_them() -> None:
    from specbind.generated import gqa

    src = _gqa_source(4, 2, 3, 10)
    g = gqa.GqaGeometry(hidden=10, heads=4, kv_heads=2, head_dim=3, tp=4)
    k = np.frombuffer(src.get("self_attn.k_proj.weight").data, ml_dtypes.bfloat16)
    k = k.reshape(6, 10)
    for r in range(4):
        w, _ = gqa.bind_gqa(g, 0, src, r)
        head = r // 2  # KV head r // (tp / kv_heads)
        assert w.k_proj.tobytes() == k[head * 3 : (head + 1) * 3].tobytes()


def test_a_never_replicated_unit_no_tensor_shards_on_is_refused(root: Path) -> None:
    edit(root, GQA, "never_replicated:\n  heads:", "never_replicated:\n  hidden:")
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.path == "never_replicated.hidden"
    assert "no tensor of this block shards on 'hidden'" in e.value.message


# --- unstacked names -------------------------------------------------------------------------

GRANITE = "models/granitemoe.yaml"
UNSTACK = """  - from: block_sparse_moe.output_linear.weight
    to: "mlp.experts.{e}.down_proj.weight"
    unstack: true
"""


@pytest.mark.parametrize(
    ("new", "fragment"),
    [
        (UNSTACK.replace('"mlp.experts.{e}.down_proj.weight"', "mlp.experts.down_proj.weight"),
         "one and the same placeholder"),
        (UNSTACK.replace("block_sparse_moe.output_linear.weight",
                         '"block_sparse_moe.{e}.output_linear.weight"'), "no placeholder"),
        (UNSTACK.replace("unstack: true", "unstack: true\n    scope: model"),
         "a layer's stacked tensor"),
    ],
    ids=["to-without-placeholder", "from-with-placeholder", "model-scope"],
)  # fmt: skip
def test_a_bad_unstack_rule_is_refused_in_one_line(root: Path, new: str, fragment: str) -> None:
    edit(root, GRANITE, UNSTACK, new)
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.path == "names[1].unstack", str(e.value)
    assert fragment in e.value.message and "\n" not in str(e.value)


def test_an_unstacked_member_is_its_own_bytes_of_the_stored_tensor(tmp_path: Path) -> None:
    """GraniteMoE's input_linear [E, 2I, X] read as experts.{e}.gate_proj / up_proj: member i's
    [gate_i; up_i] rows, each its own bytes of the stored tensor at its own offset (zero-copy),
    and output_linear [E, X, I] as experts.{e}.down_proj."""
    from safetensors.numpy import save_file

    from specbind.runtime.bind.preamble import NamedView

    e, x, i = 5, 6, 4
    gate_up = np.arange(e * 2 * i * x, dtype=np.float32).reshape(e, 2 * i, x)
    down = -np.arange(e * x * i, dtype=np.float32).reshape(e, x, i)
    out = tmp_path / "ck"
    out.mkdir()
    save_file({"model.layers.0.block_sparse_moe.input_linear.weight": gate_up,
               "model.layers.0.block_sparse_moe.output_linear.weight": down},
              str(out / "model.safetensors"))  # fmt: skip
    (out / "config.json").write_text("{}")
    table = MODELS["granitemoe"]
    ck = CheckpointDir(out)
    view = NamedView(ck, table.layer_pattern, table.names, prefixes=table.layer_prefixes)
    stored = ck.get("model.layers.0.block_sparse_moe.input_linear.weight")
    assert stored is not None
    for m in range(e):
        head = f"model.layers.0.mlp.experts.{m}."
        for k, part in enumerate(("gate_proj", "up_proj")):
            got = view.get(head + part + ".weight")
            assert got is not None and got.shape == (i, x)
            assert bytes(got.data) == gate_up[m, k * i : (k + 1) * i].tobytes()
            if stored.span is not None and got.span is not None:  # the same mapped bytes
                assert got.span.offset == stored.span.offset + (2 * m + k) * i * x * 4
        d = view.get(head + "down_proj.weight")
        assert d is not None and bytes(d.data) == down[m].tobytes()
    assert view.on_disk("model.layers.0.mlp.experts.3.up_proj.weight") == (
        "model.layers.0.block_sparse_moe.input_linear.weight"
    )
