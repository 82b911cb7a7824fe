"""Two language constructs on their own (the families that need them: test_family_llama.py,
test_family_qwen3_moe.py):

* replication: a shard unit with fewer units than tp, tp a multiple of it, is held by tp / units
  ranks (rank r holds unit r // (tp / units), vLLM's QKVParallelLinear); any other mismatch is
  refused naming the tensor; a replicated unit in a partial sum is refused; the coverage proof
  expects each replicated window on exactly tp / units ranks;
* geometry from config: ``default`` and ``expr`` entries are exact expressions over other
  symbols, checked at generate time; a ratio of two fields works as a symbol in a view of a
  tensor sharded by one of them; ``--set`` supplies a field config.json lacks; a model can
  declare an optional block group required in every layer.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_pieces import every_rank

from specbind.core.errors import CheckpointError, GeometryError, SpecError
from specbind.core.geometry import resolve
from specbind.core.ir import ShardRule, TensorRule
from specbind.core.planning import plan_block, plan_tensor
from specbind.generated import MODELS
from specbind.generator.render import load_specs
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.layout.config import values_from_config
from specbind.runtime.ranks import byte_coverage

REPO = Path(__file__).resolve().parents[2]


def _rule(kind: str = "rows") -> TensorRule:
    axis = 0 if kind == "rows" else -1
    return TensorRule("w", "BF16", "[U * 3, 5]", ShardRule(kind, "U", axis))  # type: ignore[arg-type]


@settings(max_examples=examples(0.5), deadline=None)
@given(units=st.sampled_from([1, 2, 4]), mult=st.sampled_from([1, 2, 4, 8]))
def test_rank_r_holds_unit_r_over_tp_per_unit_when_tp_exceeds_the_units(
    units: int, mult: int
) -> None:
    tp = units * mult  # at tp >= units every rank holds one whole unit of 3 rows
    for r in range(tp):
        p = plan_tensor("b", _rule(), (units * 3, 5), {"U": units, "tp": tp}, tp, r)
        assert p.local_shape == (3, 5)
        assert p.offset == r // mult * 3
        assert p.replicas == mult
    wide = plan_tensor("b", _rule(), (units * 8 * 3, 5), {"U": units * 8, "tp": tp}, tp, tp - 1)
    assert wide.replicas == 1 and wide.local_shape == (8 // mult * 3, 5)


def test_a_tp_that_neither_divides_nor_is_a_multiple_of_the_units_is_refused() -> None:
    with pytest.raises(GeometryError, match=r"b: w shards rows on U = 6 units, which tp 4 "):
        plan_tensor("b", _rule(), (18, 5), {"U": 6, "tp": 4}, 4, 0)


def test_a_replicated_unit_in_a_partial_sum_is_refused() -> None:
    """A column shard summed across ranks must not hold any unit twice."""
    rule = _rule("cols")
    with pytest.raises(GeometryError, match=r"each unit would be summed by 2 ranks"):
        plan_block("b", [rule], {"w": (5, 6)}, {"U": 2, "tp": 4}, 0, {"out": ("w",)})


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specbind.synth import synth, tiny_values

    d = tmp_path_factory.mktemp("llama") / "ck"
    synth(MODELS["llama"], d, tiny_values(MODELS["llama"]), layers=2)
    return d


def _pieces(ck: Path, tp: int) -> tuple[list[list[byte_coverage.Piece]], set[str]]:
    return every_rank(ck, MODELS["llama"], tp)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_the_coverage_proof_counts_each_kv_replica(llama: Path, tp: int) -> None:
    by_rank, claimed = _pieces(llama, tp)
    assert byte_coverage.check(by_rank, claimed) == []
    k = [p for p in by_rank[0] if p.name.endswith("layers.0.self_attn.k_proj.weight")]
    assert k[0].expect == max(tp // 2, 1) and (k[0].digest != "") == (tp > 2)


def test_a_missing_replica_is_named_with_the_ranks_that_read_it(llama: Path) -> None:
    by_rank, claimed = _pieces(llama, 4)
    by_rank[1] = [p for p in by_rank[1] if not p.name.endswith("k_proj.weight")]
    problems = byte_coverage.check(by_rank, claimed)
    assert problems and all("k_proj.weight" in p for p in problems)
    assert any(p.endswith("are read by rank 0, expected 2 rank(s)") for p in problems)


def test_a_replica_with_other_bytes_is_refused(llama: Path) -> None:
    by_rank, claimed = _pieces(llama, 8)
    i = next(i for i, p in enumerate(by_rank[5]) if p.name.endswith("0.self_attn.v_proj.weight"))
    by_rank[5][i] = replace(by_rank[5][i], digest="0" * 32)
    problems = byte_coverage.check(by_rank, claimed)
    assert len(problems) == 1 and "differ between ranks" in problems[0]
    assert problems[0].endswith("but 000000000000 on rank 5")


# -- geometry from config ----------------------------------------------------------------


def test_expressions_resolve_in_dependency_order_with_exact_division() -> None:
    got = resolve({"a": 12, "b": 3}, {"d": "c * 2", "c": "a / b"})
    assert got == {"a": 12, "b": 3, "c": 4, "d": 8}
    with pytest.raises(GeometryError, match=r"^geometry c = a / b \(a=13, b=3\): "):
        resolve({"a": 13, "b": 3}, {"c": "a / b"})
    with pytest.raises(GeometryError, match=r"^geometry \w = \w: \w is not known"):
        resolve({}, {"c": "d", "d": "c"})


def test_set_supplies_a_field_config_json_lacks_and_the_refusal_says_so() -> None:
    table = MODELS["llama"]
    config = {"hidden_size": 40, "vocab_size": 112, "intermediate_size": 72,
              "num_attention_heads": 8, "num_hidden_layers": 2}  # fmt: skip
    with pytest.raises(CheckpointError, match=r"'num_key_value_heads'.*--set kv_heads=N"):
        values_from_config(table, config)
    got = values_from_config(table, config, {"kv_heads": 2})
    assert got["kv_heads"] == 2 and got["head_dim"] == 5  # the default: hidden / heads


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    return tmp_path


GROUPED_BLOCK = """\
block: grouped
prefix: grouped.
symbols: {hidden: hidden size, k_heads: key heads, ratio: value heads per key head, dim: head dim}
markers: {all_required: true}
tensors:
  w: {dtype: BF16, shape: [k_heads * ratio * dim, hidden], shard: {rows: k_heads}}
outputs:
  first:   # the first value head of each key head's group
    tensor: w
    view: [k_heads, ratio * dim, hidden]
    slice: {axis: 1, start: 0, stop: dim}
    reshape: [k_heads * dim, hidden]
  rest:
    tensor: w
    view: [k_heads, ratio * dim, hidden]
    slice: {axis: 1, start: dim, stop: ratio * dim}
    reshape: [k_heads * (ratio - 1) * dim, hidden]
  gram:    # each key head's rows against each other: an einsum over a replicated operand
    einsum: hrk,hsk->hrs
    operands:
      - {tensor: w, view: [k_heads, ratio * dim, hidden]}
      - {tensor: w, view: [k_heads, ratio * dim, hidden]}
    view: [k_heads * ratio * dim, ratio * dim]
    dtype: F32
    shard: {rows: k_heads}
"""

GROUPED_MODEL = """\
model: grouped-test
layers:
  pattern: "layers.{index}."
  slots: {attention: {blocks: [grouped]}}
geometry:
  hidden:  {config: hidden_size, value: 16}
  k_heads: {config: num_key_heads, value: 4}
  v_heads: {config: num_value_heads, value: 12}
  ratio:   {expr: v_heads / k_heads, value: 3}
  dim:     {config: head_dim, default: hidden / k_heads, value: 6}
blocks:
  - block: grouped
    symbols: {hidden: hidden, k_heads: k_heads, ratio: ratio, dim: dim}
"""


def _grouped(root: Path, model: str = GROUPED_MODEL) -> None:
    (root / "specs/blocks/grouped.yaml").write_text(GROUPED_BLOCK)
    (root / "specs/models/grouped-test.yaml").write_text(model)


def test_a_ratio_of_two_fields_is_a_symbol_in_views_of_a_tensor_sharded_by_one(
    root: Path,
) -> None:
    """tp 1, 2, 4 split the key heads, tp 8 replicates them; ratio stays whole throughout."""
    _grouped(root)
    specs = load_specs(root)
    geometry = {g.name: g for g in specs.models["grouped-test"].geometry}
    assert geometry["ratio"].expr == "v_heads / k_heads"
    assert geometry["dim"].default == "hidden / k_heads"


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("value: 3}", "value: 4}", "value 4, but v_heads / k_heads gives 3"),
        ("{expr: v_heads / k_heads,", "{config: r, expr: v_heads / k_heads,", "has no `config`"),
        ("{expr: v_heads / k_heads,", "{expr: v_heads / nope,", "unknown symbol(s) nope"),
        ("default: hidden / k_heads,", "default: dim * 2,", "unknown symbol(s) dim"),
        ("{config: num_key_heads, value: 4}", "{config: num_key_heads, value: 5}", "not exact"),
        (
            "{config: hidden_size, value: 16}",
            "{config: hidden_size, default: dim * 4, value: 16}",
            "depend on each other: dim, hidden",
        ),
    ],
)
def test_a_bad_geometry_expression_is_refused_at_generate(
    root: Path, old: str, new: str, fragment: str
) -> None:
    assert old in GROUPED_MODEL
    _grouped(root, GROUPED_MODEL.replace(old, new, 1))
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert fragment in str(e.value) and "grouped-test.yaml" in str(e.value)


def test_a_required_group_missing_from_a_layer_is_refused_by_bind_and_audit(
    tmp_path: Path,
) -> None:
    """GLM always carries shared experts: the moe block's optional group is required there."""
    from helpers import TABLE, copy_with
    from whole_model import read_checkpoint

    from specbind.audit import audit
    from specbind.core.errors import BindError
    from specbind.runtime.bind.bind import bind_checkpoint
    from specbind.synth import synth, tiny_values

    whole = tmp_path / "whole"
    synth(TABLE, whole, tiny_values(TABLE), layers=5, mtp=False)
    victim = next(n for n in read_checkpoint(whole) if ".mlp.shared_experts." in n)
    layer = victim.split(".mlp.")[0]
    names = [n for n in read_checkpoint(whole) if n.startswith(f"{layer}.mlp.shared_experts.")]
    ck = copy_with(whole, tmp_path / "ck", dict.fromkeys(names))
    want = "requires the shared group, but the layer has no shared tensors"
    assert any(want in p for p in audit(CheckpointDir(ck), TABLE, progress=False)["problems"])
    with pytest.raises((BindError, CheckpointError, GeometryError)) as e:
        bind_checkpoint(CheckpointDir(ck), TABLE, progress=False)
    assert want in str(e.value)


@pytest.mark.parametrize("tp", [8, 16])
def test_the_plan_report_expects_each_replica_in_the_sum_over_ranks(
    tp: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Llama-3 geometry: 8 KV heads, replicated on 2 ranks at tp 16."""
    import json

    from specbind.cli import main

    assert main(["plan", "--model", "llama", "--tp-size", str(tp), "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert totals["sum_rank_bytes"] == totals["expected_sum"]
    norms = (2 * 32 + 1) * 4096 * 2  # two RMSNorms per layer and the final one, BF16, on every rank
    kv = 2 * 32 * 1024 * 4096 * 2  # k and v of 32 layers, BF16 [8 * 128, 4096], on 2 ranks each
    extra = (tp - 1) * norms + (kv if tp == 16 else 0)
    assert totals["expected_sum"] - totals["tp1_bytes"] == extra


def test_views_and_einsums_of_a_replicated_operand_bind_its_one_unit(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At tp 8 with 4 key heads, rank r's views and einsum read key head r // 2 only."""
    import importlib.util
    import sys
    from typing import Any

    import ml_dtypes
    import numpy as np
    from helpers import raw

    from specbind.generator.render import generate
    from specbind.runtime.io.source import DictSource

    _grouped(root)
    generate(root, root / "generated")
    spec = importlib.util.spec_from_file_location("grouped_gen", root / "generated/grouped.py")
    assert spec is not None and spec.loader is not None
    mod: Any = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "grouped_gen", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    k, ratio, dim, hidden = 4, 3, 6, 16
    w = np.random.default_rng(0).standard_normal((k * ratio * dim, hidden))
    w = w.astype(ml_dtypes.bfloat16)
    heads = w.reshape(k, ratio * dim, hidden).astype(np.float64)  # [k, ratio·dim, hidden]
    g = mod.GroupedGeometry(hidden=hidden, k_heads=k, ratio=ratio, dim=dim, tp=8)
    for r in range(8):
        got, _ = mod.bind_grouped(g, 0, DictSource({"grouped.w": raw(w)}), r)
        h = heads[r // 2]  # [ratio·dim, hidden]: the one key head rank r holds
        assert np.array_equal(np.asarray(got.first, np.float64), h[:dim]), r
        assert np.array_equal(np.asarray(got.rest, np.float64), h[dim:]), r
        assert got.gram.shape == (ratio * dim, ratio * dim)
        assert np.allclose(got.gram, h @ h.T, rtol=1e-5, atol=1e-4), r


def test_audit_takes_set_as_bind_does_and_lists_a_missing_field_without_it(
    llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from specbind.cli import main

    ck = tmp_path / "ck"
    shutil.copytree(llama, ck)
    config = json.loads((ck / "config.json").read_text())
    del config["num_key_value_heads"]
    (ck / "config.json").write_text(json.dumps(config))
    assert main(["audit", str(ck), "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert problems == [
        "model: config.json: missing field 'num_key_value_heads' (flat or under text_config), "
        "needed for geometry symbol kv_heads (--set kv_heads=N supplies it)"
    ]
    assert main(["bind", str(ck)]) == 1
    assert problems[0].removeprefix("model: ") in capsys.readouterr().err
    assert main(["audit", str(ck), "--json", "--set", "kv_heads=2"]) == 0
    assert json.loads(capsys.readouterr().out)["problems"] == []
    assert main(["bind", str(ck), "--set", "kv_heads=2"]) == 0
