"""Sections and concat across shard units: one stored tensor read as unequal row sections,
each sharded by its own unit, and fused fields joining shares of different units.

Claims:
* the view reads a section as its own contiguous rows, zero-copy, sized by geometry
  expressions; sizes that do not add up to the stored rows are refused naming each size;
* the silent wrong binds are refused by name at generate time: a block declaring whole a
  tensor the model reads as sections, and a sharded dim that is not whole units at every
  geometry (``[heads·D + 2·kv_heads·D, X]`` on ``{rows: heads}``: right shape, wrong rows);
* a concat of sources sharded by different units joins only on their shard axis;
* a sections rule must give one size per name, and not together with ``segments``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import copy_with, read_file

from specbind.audit import audit
from specbind.core.errors import CheckpointError, SpecError
from specbind.core.ir import NameRule
from specbind.generated import MODELS
from specbind.generator.render import load_specs
from specbind.runtime.bind import bind_checkpoint
from specbind.runtime.checkpoint import CheckpointDir
from specbind.runtime.view import NamedView
from specbind.synth import synth, tiny_values

REPO = Path(__file__).resolve().parent.parent
MODEL = "models/nemotron-h.yaml"
MAMBA = "blocks/mamba2.yaml"
ATTENTION = "blocks/mixer_attention.yaml"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    return tmp_path


def edit(root: Path, rel: str, old: str, new: str) -> None:
    p = root / "specs" / rel
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new, 1))


def _fused(tmp_path: Path) -> Path:
    """A checkpoint holding one [a; b; c] tensor of rows 2, 3, 1 and the config they come from."""
    from safetensors.numpy import save_file

    d = tmp_path / "fused"
    d.mkdir()
    rows = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)  # row i holds 4i .. 4i + 3
    save_file({"layers.0.mix.w": rows}, str(d / "model.safetensors"))
    return d


def test_a_section_is_its_own_rows_sized_by_the_geometry(tmp_path: Path) -> None:
    rule = NameRule("mix.w", ("mix.a", "mix.b", "mix.c"), "fused", ("two", "two + one", "one"))
    view = NamedView(
        CheckpointDir(_fused(tmp_path)), "layers.{index}.", (rule,), None,
        lambda: {"one": 1, "two": 2},
    )  # fmt: skip
    got = {n: view.get(f"layers.0.mix.{n}") for n in "abc"}
    assert {n: t.shape for n, t in got.items() if t} == {"a": (2, 4), "b": (3, 4), "c": (1, 4)}
    b = got["b"]
    assert b is not None and np.frombuffer(b.data, np.float32)[0] == 8.0  # row 2 starts b


def test_sections_that_do_not_add_up_to_the_stored_rows_are_refused_naming_each(
    tmp_path: Path,
) -> None:
    rule = NameRule("mix.w", ("mix.a", "mix.b"), "fused", ("two", "two * two + one"))
    view = NamedView(
        CheckpointDir(_fused(tmp_path)),
        "layers.{index}.",
        (rule,),
        None,
        lambda: {"one": 1, "two": 2},
    )
    with pytest.raises(CheckpointError) as e:
        view.get("layers.0.mix.a")
    assert str(e.value) == (
        "layers.0.mix.w has 6 rows, but its sections are two (2) + two * two + one (5) = 7 rows"
    )


def test_a_checkpoint_whose_fused_in_proj_is_a_row_short_is_refused_at_bind(
    tmp_path: Path,
) -> None:
    table = MODELS["nemotron-h"]
    src = tmp_path / "src"
    synth(table, src, tiny_values(table), layers=1, mtp=False, shards=1)
    t = read_file(next(src.glob("*.safetensors")))
    # the synth writes each section by its own name; fuse them as the hub does, one row short
    parts = [f"layers.0.mixer.in_proj_{n}.weight" for n in ("z", "x", "B", "C", "dt")]
    fused = np.concatenate([t[p] for p in parts])
    edit = {p: None for p in parts} | {"layers.0.mixer.in_proj.weight": fused[:-1]}
    short = copy_with(src, tmp_path / "short", edit)
    with pytest.raises(CheckpointError) as e:
        bind_checkpoint(CheckpointDir(short), table)
    rows = fused.shape[0]
    said = (
        f"layers.0.mixer.in_proj.weight has {rows - 1} rows, but its sections are "
        f"mamba_heads * mamba_head_dim (80) + mamba_heads * mamba_head_dim (80) + "
        f"mamba_groups * ssm_state (48) + mamba_groups * ssm_state (48) + mamba_heads (16) "
        f"= {rows} rows"
    )
    assert str(e.value) == f"layer 0: {said}"
    assert said in audit(CheckpointDir(short), table, progress=False)["problems"], "audit agrees"


def test_a_tensor_the_model_reads_as_sections_declared_whole_is_refused(root: Path) -> None:
    edit(
        root, MAMBA, "  norm.weight:",
        "  in_proj.weight: {dtype: BF16, shape: [2 * inner + 2 * group_state + heads, hidden], "
        "shard: {rows: heads}}\n  norm.weight:",
    )  # fmt: skip
    edit(root, MAMBA, "  a_log: A_log", "  a_log: A_log\n  whole: in_proj.weight")
    with pytest.raises(SpecError) as e:
        load_specs(root)
    # the first model (by file name) reading the mamba2 block's in_proj as sections refuses
    assert e.value.file in (f"specs/{MODEL}", "specs/models/mamba2.yaml")
    assert e.value.path == "names[0].from"
    assert "declares it whole (shard rows: heads)" in e.value.message


def test_a_fused_qkv_sharded_whole_by_heads_is_refused_at_generate(root: Path) -> None:
    """The silent case: [q; k; v] on {rows: heads} splits into whole heads at many
    geometries, yet rank 0's rows would be all of q and part of k."""
    for p in "kv":
        edit(root, ATTENTION, f"  {p}_proj.weight:", f"  unused_{p}:")
    edit(root, ATTENTION, "shape: [heads * head_dim, hidden],",
         "shape: [heads * head_dim + 2 * kv_heads * head_dim, hidden],")  # fmt: skip
    text = (root / "specs" / ATTENTION).read_text().split("\n")
    text = [x for x in text if not x.startswith("  unused_")]
    text = [x.replace("{concat: [q_proj.weight, k_proj.weight, v_proj.weight], axis: 0}",
                      "q_proj.weight") for x in text]  # fmt: skip
    (root / "specs" / ATTENTION).write_text("\n".join(text))
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.path == "tensors.q_proj.weight.shard"
    assert "is not a whole number of heads units at every geometry" in e.value.message


def test_a_concat_across_units_off_their_shard_axis_is_refused(root: Path) -> None:
    edit(root, MAMBA, "conv1d_C.weight], axis: 0}", "conv1d_C.weight], axis: 2}")
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.path == "outputs.conv1d.axis"
    assert "must join on their shard axis 0, not 2" in e.value.message


def test_a_section_size_that_is_not_the_rows_its_block_declares_is_refused(root: Path) -> None:
    """B and dt swapped in the sizes: the sum is right, the rows are not."""
    edit(root, MODEL, "mamba_groups * ssm_state, mamba_groups * ssm_state, mamba_heads]",
         "mamba_heads, mamba_groups * ssm_state, mamba_groups * ssm_state]")  # fmt: skip
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.path == "names[0].sections[2]"
    assert "section mixer.in_proj_B.weight is mamba_heads = " in e.value.message
    assert "block 'mamba2' declares in_proj_B.weight with" in e.value.message


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("               mamba_groups * ssm_state, mamba_groups * ssm_state, mamba_heads]",
         "               mamba_groups * ssm_state, mamba_groups * ssm_state]",
         "4 sections for 5 names"),
        ("    why: the depthwise conv runs", "    segments: 3\n    why: the depthwise conv runs",
         "not both"),
    ],
    ids=["count", "with-segments"],
)  # fmt: skip
def test_a_bad_sections_rule_is_refused_naming_it(
    root: Path, old: str, new: str, fragment: str
) -> None:
    edit(root, MODEL, old, new)
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.file == f"specs/{MODEL}" and e.value.path.endswith("sections")
    assert fragment in e.value.message
