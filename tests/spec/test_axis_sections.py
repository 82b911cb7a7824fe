"""Sections of any axis, and no coefficient shortcut (generator/derivation.py, the model's
``names:`` ``axis:``, runtime/bind/preamble.py), on a spec root of one block and one model:

* a sharded axis that is a whole multiple of its unit (``2 * inter``, or ``inter + inter``) is
  refused at generate in one line naming the spec file, the tensor and the axis, unless the
  spec says how its parts lie (sections of that axis, or ``interleave: true``): shapes cannot
  tell Llama 4's halves ``[gate | up]`` from gpt-oss's interleaved pairs, and a contiguous
  share is right for one and wrong for the other;
* sections of the last axis (a stacked ``[E, X, 2I]``, a 2-D ``[X, 2I]``) bind rank r's field
  as the concatenation of each section's share, ``[gate_r | up_r]``, checked against slices
  computed here with numpy, at tp 1, 2 and 4 and with ep;
* a sections rule whose axis the section's tensor lacks, or whose sizes do not add up to the
  stored axis, is refused naming it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from specbind.core.errors import CheckpointError, SpecError
from specbind.generator.render import generate, load_specs

E, X, INTER = 3, 5, 4  # experts, hidden, intermediate: no two equal

STACKED_HALVES = """\
block: halves
prefix: mlp.
symbols:
  hidden: hidden size
  experts: routed experts
  inter: intermediate size of one expert
families:
  e: {count: experts, shard: experts}
markers: {all_required: true}
tensors:
  experts.gate_proj: {dtype: BF16, shape: [experts, hidden, inter], stacked: e, shard: {cols: inter}}
  experts.up_proj: {dtype: BF16, shape: [experts, hidden, inter], stacked: e, shard: {cols: inter}}
outputs:
  w13: {concat: [experts.gate_proj, experts.up_proj], axis: 2}
"""

STACKED_FUSED = """\
block: halves
prefix: mlp.
symbols:
  hidden: hidden size
  experts: routed experts
  inter: intermediate size of one expert
families:
  e: {count: experts, shard: experts}
markers: {all_required: true}
tensors:
  experts.gate_up_proj:
    {dtype: BF16, shape: [experts, hidden, 2 * inter], stacked: e, shard: {cols: inter}}
outputs:
  w13: experts.gate_up_proj
"""

PLAIN_HALVES = """\
block: halves
prefix: mlp.
symbols:
  hidden: hidden size
  inter: intermediate size
markers: {all_required: true}
tensors:
  gate.weight: {dtype: BF16, shape: [hidden, inter], shard: {cols: inter}}
  up.weight: {dtype: BF16, shape: [hidden, inter], shard: {cols: inter}}
outputs:
  w13: {concat: [gate.weight, up.weight], axis: 1}
"""

PLAIN_FUSED = """\
block: halves
prefix: mlp.
symbols:
  hidden: hidden size
  inter: intermediate size
markers: {all_required: true}
tensors:
  gate_up.weight: {dtype: BF16, shape: [hidden, 2 * inter], shard: {cols: inter}}
outputs:
  w13: gate_up.weight
"""

MODEL = f"""\
model: halves-test
layers:
  pattern: "layers.{{index}}."
  slots: {{mlp: {{blocks: [halves]}}}}
geometry:
  hidden:  {{config: hidden_size,       value: {X}}}
  experts: {{config: num_local_experts, value: {E}}}
  inter:   {{config: intermediate_size, value: {INTER}}}
blocks:
  - block: halves
"""

STACKED_SECTIONS = """\
names:
  - from: mlp.experts.gate_up_proj
    to: [mlp.experts.gate_proj, mlp.experts.up_proj]
    sections: [inter, inter]
    axis: -1
    why: the stored experts hold [gate | up] halves of their last axis
"""

PLAIN_SECTIONS = """\
names:
  - from: mlp.gate_up.weight
    to: [mlp.gate.weight, mlp.up.weight]
    sections: [inter, inter]
    axis: 1
    why: the stored weight holds [gate | up] halves of its columns
"""


def _root(tmp_path: Path, block: str, model: str) -> Path:
    root = tmp_path / "root"
    (root / "specs" / "blocks").mkdir(parents=True)
    (root / "specs" / "models").mkdir()
    (root / "specs" / "blocks" / "halves.yaml").write_text(block)
    (root / "specs" / "models" / "halves-test.yaml").write_text(model)
    return root


def _refusal(tmp_path: Path, block: str, model: str) -> SpecError:
    with pytest.raises(SpecError) as e:
        load_specs(_root(tmp_path, block, model))
    assert "\n" not in str(e.value)
    return e.value


@pytest.mark.parametrize(
    ("block", "spelled", "tensor", "axis"),
    [
        (STACKED_FUSED, "2 * inter", "experts.gate_up_proj", 2),
        (STACKED_FUSED, "inter + inter", "experts.gate_up_proj", 2),
        (PLAIN_FUSED, "2 * inter", "gate_up.weight", 1),
        (PLAIN_FUSED, "inter * 2", "gate_up.weight", 1),
    ],
    ids=["stacked-2x", "stacked-sum", "2d-cols-2x", "2d-cols-x2"],
)
def test_a_cols_shard_of_a_whole_multiple_of_its_unit_is_refused_naming_file_tensor_and_axis(
    tmp_path: Path, block: str, spelled: str, tensor: str, axis: int
) -> None:
    """Before this rule, each bound rank 0 all of gate and rank 1 all of up (Llama 4)."""
    err = _refusal(tmp_path, block.replace("2 * inter", spelled), MODEL)
    assert err.file == "specs/blocks/halves.yaml", err
    assert err.path == f"tensors.{tensor}.shard", err
    assert f"{tensor} shards axis {axis} on inter" in err.message, err
    assert "2 * inter" in err.message and "2 parts" in err.message, err
    assert f"sections of axis {axis}" in err.message and "interleave: true" in err.message


def test_the_same_axis_declared_interleaved_is_accepted(tmp_path: Path) -> None:
    block = STACKED_FUSED.replace("shard: {cols: inter}", "shard: {cols: inter, interleave: true}")
    assert "halves-test" in load_specs(_root(tmp_path, block, MODEL)).models


def test_a_sum_of_per_head_terms_is_refused_without_interleave(tmp_path: Path) -> None:
    """MLA's ``heads * (nope + rope)`` rows: every term over heads, yet two parts per head."""
    block = PLAIN_FUSED.replace("[hidden, 2 * inter], shard: {cols: inter}",
                                "[hidden, inter * (hidden + 1)], shard: {cols: inter}")  # fmt: skip
    err = _refusal(tmp_path, block, MODEL)
    assert err.path == "tensors.gate_up.weight.shard"
    assert "a sum of 2 terms" in err.message and "hidden * inter + inter" in err.message


def _gate_up() -> np.ndarray:
    """[E, X, 2I]: every element different (gate then up on the last axis)."""
    w = np.arange(E * X * 2 * INTER, dtype=np.float32).reshape(E, X, 2 * INTER)
    return w.astype(ml_dtypes.bfloat16)


def _checkpoint(tmp_path: Path, tensors: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    d = tmp_path / "ck"
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text("{}")
    return d


def _module(root: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    generate(root, root / "generated")
    spec = importlib.util.spec_from_file_location("halves_gen", root / "generated" / "halves.py")
    assert spec is not None and spec.loader is not None
    mod: Any = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "halves_gen", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _view(root: Path, ck: Path) -> Any:
    from specbind.runtime.bind.preamble import NamedView
    from specbind.runtime.io.checkpoint import CheckpointDir

    rules = load_specs(root).models["halves-test"].names
    values = {"hidden": X, "experts": E, "inter": INTER}
    return NamedView(CheckpointDir(ck), "layers.{index}.", rules, None, lambda: values)


def _bind(mod: Any, view: Any, tp: int, rank: int, ep: int = 1, ep_rank: int = 0) -> Any:
    from specbind.runtime.layout.slots import LayerSource

    names = [n.removeprefix("layers.0.") for n in view.names()]
    layer = LayerSource(view, "layers.0.", names)
    fields = {f.name for f in __import__("dataclasses").fields(mod.HalvesGeometry)}
    sizes = {"hidden": X, "experts": E, "inter": INTER, "tp": tp, "ep": ep}
    g = mod.HalvesGeometry(**{k: v for k, v in sizes.items() if k in fields})
    kw = {"ep_rank": ep_rank} if "ep" in fields else {}
    got, _ = mod.bind_halves(g, 0, layer, rank, **kw)
    return np.asarray(got.w13, np.float64)


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1), (4, 1), (2, 3)])
def test_sections_of_the_last_axis_of_stacked_experts_bind_gate_r_then_up_r(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tp: int, ep: int
) -> None:
    root = _root(tmp_path, STACKED_HALVES, MODEL + STACKED_SECTIONS)
    w = _gate_up()
    view = _view(root, _checkpoint(tmp_path, {"layers.0.mlp.experts.gate_up_proj": w}))
    mod = _module(root, monkeypatch)
    whole = w.astype(np.float64)
    gate, up = whole[..., :INTER], whole[..., INTER:]  # Llama 4: gate = [..., :I], up = [I:]
    share = INTER // tp
    for e_rank in range(ep):
        lo, n = e_rank * (E // ep) + min(e_rank, E % ep), E // ep + (e_rank < E % ep)
        for r in range(tp):
            cols = slice(r * share, (r + 1) * share)
            want = np.concatenate([gate[lo : lo + n, :, cols], up[lo : lo + n, :, cols]], -1)
            got = _bind(mod, view, tp, r, ep, e_rank)
            assert got.shape == (n, X, 2 * share), (tp, r, e_rank, got.shape)
            assert np.array_equal(got, want), (tp, r, e_rank)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sections_of_the_columns_of_a_2d_weight_bind_a_r_then_b_r(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tp: int
) -> None:
    root = _root(tmp_path, PLAIN_HALVES, MODEL + PLAIN_SECTIONS)
    w = _gate_up()[0]  # [X, 2I]
    view = _view(root, _checkpoint(tmp_path, {"layers.0.mlp.gate_up.weight": w}))
    mod = _module(root, monkeypatch)
    whole, share = w.astype(np.float64), INTER // tp
    for r in range(tp):
        cols = slice(r * share, (r + 1) * share)
        want = np.concatenate([whole[:, :INTER][:, cols], whole[:, INTER:][:, cols]], 1)
        assert np.array_equal(_bind(mod, view, tp, r), want), (tp, r)


def test_a_section_axis_its_tensor_lacks_is_refused_naming_it(tmp_path: Path) -> None:
    err = _refusal(tmp_path, PLAIN_HALVES, MODEL + PLAIN_SECTIONS.replace("axis: 1", "axis: 2"))
    assert err.file == "specs/models/halves-test.yaml" and err.path == "names[0].axis", err
    assert "splits axis 2" in err.message and "2 axes" in err.message


def test_sections_of_an_axis_that_do_not_add_up_are_refused_at_bind(tmp_path: Path) -> None:
    root = _root(tmp_path, STACKED_HALVES, MODEL + STACKED_SECTIONS)
    w = _gate_up()[..., :-1]  # one column short
    view = _view(root, _checkpoint(tmp_path, {"layers.0.mlp.experts.gate_up_proj": w}))
    with pytest.raises(CheckpointError) as e:
        view.get("layers.0.mlp.experts.up_proj")
    assert str(e.value) == (
        f"layers.0.mlp.experts.gate_up_proj has {2 * INTER - 1} on axis -1, but its sections "
        f"are inter ({INTER}) + inter ({INTER}) = {2 * INTER}"
    )
