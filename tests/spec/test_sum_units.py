"""Whole-units proofs over derivations (generator/derivation.py), on a spec root of one block and
one model (fast to load and generate):

* a sharded dim is expanded through its symbols' derivations (a model ``expr:`` ratio, a block
  ``derived:`` ratio, a ``default:``) into terms over the base symbols; a sum of terms over
  different units with no layout declared is refused naming the tensor and the terms;
* the same fused tensor read as sections binds, at tp 1 and each rank of tp 2, vLLM's
  ``[q_r; k_r; v_r]`` rows; declared ``interleave: true`` it binds each key head's rows whole;
* the expansion itself is exact (a ratio cancels, terms collect).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from specbind.core import algebra
from specbind.core import polynomial as poly
from specbind.core.errors import SpecError
from specbind.generator.render import generate, load_specs

REPO = Path(__file__).resolve().parents[2]
K, V, DK, DV, KERNEL = 4, 8, 3, 5, 2  # no two equal; V / K = 2 value heads per key head

SECTIONS_BLOCK = """\
block: conv
prefix: linear_attn.
symbols:
  k_heads: key heads
  k_dim: key head dim
  v_per_k: value heads per key head
  v_dim: value head dim
  conv_kernel: conv kernel width
markers: {all_required: true}
tensors:
  conv1d_q.weight: {dtype: BF16, shape: [k_heads * k_dim, 1, conv_kernel], shard: {rows: k_heads}}
  conv1d_k.weight: {dtype: BF16, shape: [k_heads * k_dim, 1, conv_kernel], shard: {rows: k_heads}}
  conv1d_v.weight:
    {dtype: BF16, shape: [k_heads * v_per_k * v_dim, 1, conv_kernel], shard: {rows: k_heads}}
outputs:
  conv1d: {concat: [conv1d_q.weight, conv1d_k.weight, conv1d_v.weight], axis: 0}
"""

FUSED_BLOCK = """\
block: conv
prefix: linear_attn.
symbols:
  k_heads: key heads
  k_dim: key head dim
  v_per_k: value heads per key head
  v_dim: value head dim
  conv_kernel: conv kernel width
markers: {all_required: true}
tensors:
  conv1d.weight:
    dtype: BF16
    shape: [k_heads * (2 * k_dim + v_per_k * v_dim), 1, conv_kernel]
    shard: {rows: k_heads}
outputs:
  conv1d: conv1d.weight
"""

MODEL = f"""\
model: conv-test
layers:
  pattern: "layers.{{index}}."
  slots: {{linear_attn: {{blocks: [conv]}}}}
geometry:
  k_heads:     {{config: linear_num_key_heads,   value: {K}}}
  v_heads:     {{config: linear_num_value_heads, value: {V}}}
  k_dim:       {{config: linear_key_head_dim,    value: {DK}}}
  v_dim:       {{config: linear_value_head_dim,  value: {DV}}}
  v_per_k:     {{expr: v_heads / k_heads,        value: {V // K}}}
  conv_kernel: {{config: linear_conv_kernel_dim, value: {KERNEL}}}
blocks:
  - block: conv
"""

SECTIONS = """\
names:
  - from: linear_attn.conv1d.weight
    to: [linear_attn.conv1d_q.weight, linear_attn.conv1d_k.weight, linear_attn.conv1d_v.weight]
    sections: [k_heads * k_dim, k_heads * k_dim, v_heads * v_dim]
    why: the short conv runs over cat([q, k, v]) as one conv1d
"""


def _root(tmp_path: Path, block: str, model: str) -> Path:
    root = tmp_path / "root"
    (root / "specs" / "blocks").mkdir(parents=True)
    (root / "specs" / "models").mkdir()
    (root / "specs" / "blocks" / "conv.yaml").write_text(block)
    (root / "specs" / "models" / "conv-test.yaml").write_text(model)
    return root


def _refusal(tmp_path: Path, block: str, model: str = MODEL) -> SpecError:
    with pytest.raises(SpecError) as e:
        load_specs(_root(tmp_path, block, model))
    assert "\n" not in str(e.value)
    return e.value


def _fused_conv() -> np.ndarray:
    """[q; k; v] rows, every element different (row i holds i * 16 + column)."""
    rows = 2 * K * DK + V * DV
    w = (np.arange(rows)[:, None] * 16 + np.arange(KERNEL)[None, :]).reshape(rows, 1, KERNEL)
    return w.astype(ml_dtypes.bfloat16)


def _module(root: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The block's generated module, generated from ``root`` and imported."""
    generate(root, root / "generated")
    spec = importlib.util.spec_from_file_location("conv_gen", root / "generated" / "conv.py")
    assert spec is not None and spec.loader is not None
    mod: Any = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "conv_gen", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _bind(mod: Any, tp: int, rank: int, src: Any) -> Any:
    from specbind.runtime.layout.slots import LayerSource

    g = mod.ConvGeometry(k_heads=K, k_dim=DK, v_per_k=V // K, v_dim=DV, conv_kernel=KERNEL, tp=tp)
    layer = LayerSource(src, "layers.0.", [n.removeprefix("layers.0.") for n in src.names()])
    got, _ = mod.bind_conv(g, 0, layer, rank)
    return np.asarray(got.conv1d, np.float64)


def _checkpoint(tmp_path: Path) -> Path:
    from safetensors.numpy import save_file

    d = tmp_path / "ck"
    d.mkdir()
    save_file({"layers.0.linear_attn.conv1d.weight": _fused_conv()}, str(d / "model.safetensors"))
    (d / "config.json").write_text("{}")
    return d


def test_a_fused_conv_written_with_a_model_ratio_and_sharded_by_key_heads_is_refused(
    tmp_path: Path,
) -> None:
    err = _refusal(tmp_path, FUSED_BLOCK)
    assert err.file == "specs/blocks/conv.yaml" and err.path == "tensors.conv1d.weight.shard"
    assert "2 * k_dim * k_heads + v_dim * v_heads" in err.message
    assert "(via v_per_k = v_heads / k_heads)" in err.message
    assert "(v_dim * v_heads not over k_heads)" in err.message


def test_a_block_derived_ratio_is_seen_through_as_well(tmp_path: Path) -> None:
    block = FUSED_BLOCK.replace("  v_per_k: value heads per key head\n", "  v_heads: value heads\n")
    block = block.replace("markers:", "derived: {v_per_k: v_heads / k_heads}\nmarkers:")
    model = MODEL.replace("  - block: conv\n", "  - block: conv\n    symbols: {v_heads: v_heads}\n")
    err = _refusal(tmp_path, block, model)
    assert err.path == "tensors.conv1d.weight.shard"
    assert "(v_dim * v_heads not over k_heads)" in err.message


def test_a_default_is_seen_through_where_config_json_lacks_its_field(tmp_path: Path) -> None:
    """k_dim present, the sum is over key heads only; absent, k_dim is v_heads * v_dim / k_heads
    and the q and k rows are terms over value heads."""
    model = MODEL.replace(
        "{config: linear_key_head_dim,    value: 3}",
        "{config: linear_key_head_dim, default: v_heads * v_dim / k_heads, value: 3}",
    )
    block = FUSED_BLOCK.replace("(2 * k_dim + v_per_k * v_dim)", "(2 * k_dim + v_dim)")
    err = _refusal(tmp_path, block, model)
    assert (
        "where config.json lacks k_dim (via k_dim = v_heads * v_dim / k_heads (its default))"
        in (err.message)
    )
    assert "2 * v_dim * v_heads" in err.message


@pytest.mark.parametrize("how", ["expr", "default", "derived"])
def test_a_ratio_written_with_floor_division_in_a_sharded_sum_is_refused_naming_it(
    tmp_path: Path, how: str
) -> None:
    """``v_heads // k_heads`` does not expand, so the proof cannot tell the value-head term from
    a key-head one: the same fused conv is refused, not bound as whole key-head units."""
    block, model = FUSED_BLOCK, MODEL
    ratio = "{expr: v_heads / k_heads,        value: 2}"
    if how == "expr":
        model = model.replace(ratio, "{expr: v_heads // k_heads, value: 2}")
    elif how == "default":
        model = model.replace(
            ratio, "{config: linear_v_per_k, default: v_heads // k_heads, value: 2}"
        )
    else:
        block = block.replace("  v_per_k: value heads per key head\n", "  v_heads: value heads\n")
        block = block.replace("markers:", "derived: {v_per_k: v_heads // k_heads}\nmarkers:")
        model = model.replace(
            "  - block: conv\n", "  - block: conv\n    symbols: {v_heads: v_heads}\n"
        )
    assert model != MODEL or block != FUSED_BLOCK
    err = _refusal(tmp_path, block, model)
    assert err.file == "specs/blocks/conv.yaml" and err.path == "tensors.conv1d.weight.shard"
    assert "v_heads // k_heads" in err.message and "cannot see through" in err.message


def test_the_same_conv_read_as_sections_binds_vllms_q_k_v_shares_on_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specbind.runtime.bind.preamble import NamedView
    from specbind.runtime.io.checkpoint import CheckpointDir

    root = _root(tmp_path, SECTIONS_BLOCK, MODEL + SECTIONS)
    rules = load_specs(root).models["conv-test"].names
    values = {"k_heads": K, "v_heads": V, "k_dim": DK, "v_dim": DV}
    view = NamedView(CheckpointDir(_checkpoint(tmp_path)), "layers.{index}.", rules, None,
                     lambda: values)  # fmt: skip
    w = _fused_conv().astype(np.float64)
    q, k, v = w[: K * DK], w[K * DK : 2 * K * DK], w[2 * K * DK :]
    mod = _module(root, monkeypatch)
    for tp in (1, 2):
        for r in range(tp):
            got = _bind(mod, tp, r, view)
            share = [x[r * len(x) // tp : (r + 1) * len(x) // tp] for x in (q, k, v)]
            assert np.array_equal(got, np.concatenate(share)), (tp, r)  # [q_r; k_r; v_r]


def test_the_fused_conv_declared_interleaved_binds_each_key_heads_rows_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers import raw

    from specbind.runtime.io.source import DictSource

    block = FUSED_BLOCK.replace(
        "shard: {rows: k_heads}", "shard: {rows: k_heads, interleave: true}"
    )
    root = _root(tmp_path, block, MODEL)
    w = _fused_conv()
    src = DictSource({"layers.0.linear_attn.conv1d.weight": raw(w)})
    mod = _module(root, monkeypatch)
    for r in range(2):
        got = _bind(mod, 2, r, src)
        half = len(w) // 2  # key heads [2r, 2r + 2), each 2·DK + 2·DV rows, one after another
        assert np.array_equal(got, w[r * half : (r + 1) * half].astype(np.float64)), r


def test_interleave_belongs_to_a_stored_tensors_shard_only(tmp_path: Path) -> None:
    block = SECTIONS_BLOCK + "  scaled:\n    tensor: conv1d_q.weight\n    scale: 2\n"
    block = block.replace(
        "    scale: 2\n", "    scale: 2\n    shard: {rows: k_heads, interleave: true}\n"
    )
    err = _refusal(tmp_path, block, MODEL + SECTIONS)
    assert err.path == "outputs.scaled" and "schema" in err.message, err


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        (
            "k_heads * (2 * k_dim + v_heads / k_heads * v_dim)",
            "2 * k_dim * k_heads + v_dim * v_heads",
        ),
        ("heads * (hidden / heads)", "hidden"),
        ("(a + b) ** 2 - a * a - b * b", "2 * a * b"),
        ("-(a - a)", "0"),
    ],
)
def test_an_expansion_multiplies_out_and_cancels(text: str, expanded: str) -> None:
    assert poly.render(poly.expand(algebra.parse(text), poly.symbol)) == expanded


@pytest.mark.parametrize("text", ["a // b", "a % b", "a ** b", "a / (a + b)"])
def test_what_does_not_expand_says_so(text: str) -> None:
    with pytest.raises(poly.NotPolynomial):
        poly.expand(algebra.parse(text), poly.symbol)


_LEAF = st.sampled_from(["a", "b", "c", "1", "2", "3"])
_EXPR = st.recursive(
    _LEAF,
    lambda inner: st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})"
    ),
    max_leaves=8,
)


@settings(max_examples=examples(0.5))  # cheap, small space
@given(_EXPR, st.integers(1, 9), st.integers(1, 9), st.integers(1, 9))
def test_an_expansion_is_the_expression_wherever_the_expression_evaluates(
    text: str, a: int, b: int, c: int
) -> None:
    from specbind.core.errors import GeometryError

    e, env = algebra.parse(text), {"a": a, "b": b, "c": c}
    try:
        want = algebra.evaluate(e, env)
    except GeometryError:  # not exact here, or a zero divisor: nothing to compare
        return
    try:
        p = poly.expand(e, poly.symbol)
    except poly.NotPolynomial:  # a division by a sum
        assert "/ (" in text
        return
    assert poly.value(p, env) == want
