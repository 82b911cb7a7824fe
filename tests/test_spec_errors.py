"""Bad specs are refused with one error naming the file, the path inside it and the line."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from specbind.core.errors import SpecError
from specbind.generator.render import generate, load_specs

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    shutil.copytree(
        REPO / "generated", tmp_path / "generated", ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path


def edit(root: Path, rel: str, old: str, new: str) -> None:
    p = root / "specs" / rel
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new, 1))


def line_of(root: Path, rel: str, needle: str) -> int:
    """The first line containing ``needle``; ``^text`` matches a whole (stripped) line."""
    lines = (root / "specs" / rel).read_text().splitlines()
    if needle.startswith("^"):
        return next(i + 1 for i, line in enumerate(lines) if line.strip() == needle[1:])
    return next(i + 1 for i, line in enumerate(lines) if needle in line)


KDA = "blocks/kda.yaml"
DSA = "blocks/dsa.yaml"
MODEL = "models/glm-5.3-flash.yaml"
MOE = "blocks/moe.yaml"

# (spec file, old text, new text, line needle, path in the error, message fragment)
CASES = [
    (
        KDA,
        "dtype: BF16, shape: [Q, X],    shard: {rows: H}, linear: true}",
        "dtype: BF61, shape: [Q, X], shard: {rows: H}, linear: true}",
        "q_proj.weight:",
        "tensors.q_proj.weight.dtype",
        "schema",
    ),
    (
        KDA,
        "shape: [D, X],    shard: replicated, linear: true}",
        "shape: [D, Y],    shard: replicated, linear: true}",
        "f_a_proj.weight:",
        "tensors.f_a_proj.weight.shape[1]",
        "unknown symbol(s) Y",
    ),
    (
        KDA,
        "shape: [H, X],    shard: {rows: H}, linear: true}",
        "shape: [H, __import__('os')], shard: {rows: H}, linear: true}",
        "  b_proj.weight:",
        "tensors.b_proj.weight.shape[1]",
        "schema",
    ),
    (
        KDA,
        "shape: [H, X],    shard: {rows: H}, linear: true}",
        "shape: [H, X / 0], shard: {rows: H}, linear: true}",
        "  b_proj.weight:",
        "tensors.b_proj.weight.shape[1]",
        "division by zero",
    ),
    (
        KDA,
        "shape: [H, X],    shard: {rows: H}, linear: true}",
        "shape: [H, X - X], shard: {rows: H}, linear: true}",
        "  b_proj.weight:",
        "tensors.b_proj.weight.shape[1]",
        "evaluates to 0",
    ),
    (
        KDA,
        "shape: [H, X],    shard: {rows: H}, linear: true}",
        "shape: [H, X],    shard: {rows: D}, linear: true}",
        "  b_proj.weight:",
        "tensors.b_proj.weight.shard",
        "does not split into whole D units",
    ),
    (
        KDA,
        "  o_norm: o_norm.weight\n",
        "  o_norm: o_norm.wieght\n",
        "o_norm: o_norm.wieght",
        "outputs.o_norm",
        "unknown tensor 'o_norm.wieght'",
    ),
    (
        KDA,
        "  o_norm: o_norm.weight\n",
        "",
        "o_norm.weight:",
        "tensors.o_norm.weight",
        "read by no output",
    ),
    (
        KDA,
        "  b_proj: b_proj.weight\n",
        "  b_proj: b_proj.weight\n  b_proj: q_proj.weight\n",
        "b_proj: q_proj.weight",
        "outputs.b_proj",
        "duplicate key 'b_proj'",
    ),
    (
        KDA,
        "  f_a: f_a_proj.weight\n",
        '  "f_a\\nimport os": f_a_proj.weight\n',
        "import os",
        "outputs['f_a\\nimport os']",
        "schema",
    ),
    (
        KDA,
        "  f_a: f_a_proj.weight\n",
        "  class: f_a_proj.weight\n",
        "class: f_a_proj",
        "outputs.class",
        "not a usable identifier",
    ),
    (
        KDA,
        "    squeeze: 1\n",
        "    squeeze: 2\n",
        "squeeze: 2",
        "outputs.conv.squeeze",
        "not a literal 1",
    ),
    (
        KDA,
        "check: 8 * C * D + 4 * C * C <= 49152",
        "check: 8 * C * D + 4 * C * C <= 4915",
        "<= 4915",
        "constraints[1].check",
        "constraint scan_shared_memory fails",
    ),
    (
        KDA,
        "check: 8 * C * D + 4 * C * C <= 49152",
        "check: open(C) <= 49152",
        "open(C)",
        "constraints[1].check",
        "Call is not allowed",
    ),
    (
        KDA,
        "block: kda\n",
        "block: kda\nextra: &a [1, 2]\nmore: *a\n",
        "extra:",
        "",
        "anchor 'a' is not allowed",
    ),
    (
        KDA,
        "block: kda\n",
        "block: !!python/object/apply:os.system ['true']\n",
        "block:",
        "",
        "invalid YAML",
    ),
    (
        DSA,
        "    optional: true\n",
        "    optional: yes please\n",
        "optional: yes",
        "groups.indexer.optional",
        "schema",
    ),
    (
        DSA,
        "group: indexer, linear: true}\n  indexer.wk.weight",
        "group: indexr, linear: true}\n  indexer.wk.weight",
        "indexer.wq_b.weight:",
        "tensors.indexer.wq_b.weight.group",
        "not declared",
    ),
    (
        DSA,
        "    einsum: hrc,hrk->hck\n",
        "    einsum: hrc,hrk->ck\n",
        "einsum: hrc,hrk->ck",
        "outputs.q_absorb.einsum",
        "sums over the shard unit",
    ),
    (
        DSA,
        "    einsum: ihr,hrc->ihc\n",
        "    einsum: ihr,hrc->ihcz\n",
        "einsum: ihr,hrc->ihcz",
        "outputs.o_absorb.einsum",
        "output letters must be distinct and come from the operands",
    ),
    (
        DSA,
        "    einsum: ihr,hrc->ihc\n",
        "    einsum: ihr,hrcd->ihc\n",
        "einsum: ihr,hrcd->ihc",
        "outputs.o_absorb.einsum",
        "the second operand has rank 3, not 4",
    ),
    (
        DSA,
        "        view: [H, N, QL]\n",
        "        view: [H, N, 2 * QL]\n",
        "view: [H, N, 2 * QL]",
        "outputs.q_absorb.operands[1].view",
        "has 50331648 elements",
    ),
    (
        DSA,
        "        slice: {axis: 1, start: 0, stop: N}",
        "        slice: {axis: 1, start: 0, stop: N + V + 1}",
        "stop: N + V + 1",
        "outputs.q_absorb.operands[0].slice",
        "slice [0:1025] does not fit dim 1024",
    ),
    (
        DSA,
        "        view: [X, H, V]\n",
        "        view: [H, X, V]\n",
        "view: [H, X, V]",
        "outputs.o_absorb.operands[0].view",
        "must put the shard unit 'H' alone at axis 1",
    ),
    (
        DSA,
        "    scale: IH ** -0.5\n",
        "    scale: IHX ** -0.5\n",
        "scale: IHX",
        "outputs.weights_proj.scale",
        "unknown symbol(s) IHX",
    ),
    (
        DSA,
        "    scale: IH ** -0.5\n",
        "    scale: IH ** -0.5 if IH else 1\n",
        "scale: IH ** -0.5 if",
        "outputs.weights_proj.scale",
        "IfExp is not allowed in a scale",
    ),
    (
        DSA,
        "    shard: {cols: H}\n",
        "    shard: {rows: H}  # was cols\n",
        "# was cols",
        "outputs.o_absorb.shard",
        "needs the unit's letter first",
    ),
    (
        DSA,
        "    view: [X, H * KVL]\n",
        "    view: [H * KVL, X]\n",
        "view: [H * KVL, X]",
        "outputs.o_absorb.view",
        "does not merge consecutive axes of [i, h, c]",
    ),
    (
        DSA,
        "    einsum: ihr,hrc->ihc\n",
        "    einsum: ihr,hrc->hic\n",
        "view: [X, H * KVL]",
        "outputs.o_absorb.view",
        "does not merge consecutive axes of [h, i, c]",
    ),
    (
        MOE,
        "  e: {count: E, shard: experts}\n",
        "  e: {count: E, shard: replicated}\n",
        "  e: {count: E, shard: replicated}",
        "families.e.shard",
        "schema:",
    ),
    (
        # N and V swapped in the K-half slice: both are 256 at the real geometry, so only a
        # geometry where no two symbols are equal shows the einsum's r letters disagree.
        DSA,
        "        slice: {axis: 1, start: 0, stop: N}      # the K half of each head's block\n",
        "        slice: {axis: 1, start: 0, stop: V}      # the K half of each head's block\n",
        "    einsum: hrc,hrk->hck",
        "outputs.q_absorb.einsum",
        "at a geometry where no two symbols are equal",
    ),
    (
        KDA,
        "  k_conv1d.weight:     {dtype: BF16, stored: [F32], shape: [Q, 1, K], shard: {rows: H}}",
        "  k_conv1d.weight:     {dtype: BF16, stored: [F32], shape: [Q, 1, K], shard: replicated}",
        "concat: [q_conv1d.weight",
        "outputs.conv.concat",
        "concat joins tensors of different shard rules",
    ),
    (
        KDA,
        "  k_conv1d.weight:     {dtype: BF16, stored: [F32], shape: [Q, 1, K], shard: {rows: H}}",
        "  k_conv1d.weight:     {dtype: BF16, stored: [F32], shape: [Q, 1, K + 1], shard: {rows: H}}",
        "concat: [q_conv1d.weight",
        "outputs.conv.concat",
        "differ off that axis",
    ),
    (
        MODEL,
        "  linear_conv:      {config: linear_conv_kernel_dim, value: 4}\n",
        "",
        "symbols: {X: hidden, H: linear_heads",
        "blocks[1].symbols.K",
        "unknown geometry symbol 'linear_conv'",
    ),
    (
        MODEL,
        "  - block: kda\n",
        "  - block: kdb\n",
        "block: kdb",
        "blocks[1].block",
        "unknown block 'kdb'",
    ),
]


@pytest.mark.parametrize(("rel", "old", "new", "needle", "path", "fragment"), CASES)
def test_a_bad_spec_names_file_path_and_line_and_leaves_generated_untouched(
    root: Path, rel: str, old: str, new: str, needle: str, path: str, fragment: str
) -> None:
    before = {p: p.read_bytes() for p in (root / "generated").rglob("*") if p.is_file()}
    edit(root, rel, old, new)
    with pytest.raises(SpecError) as e:
        generate(root, root / "generated")
    err = e.value
    assert err.file == f"specs/{rel}"
    assert err.path == path
    assert err.line == line_of(root, rel, needle)
    assert fragment in err.message
    assert "\n" not in str(err)
    after = {p: p.read_bytes() for p in (root / "generated").rglob("*") if p.is_file()}
    assert after == before


def test_the_real_specs_load(root: Path) -> None:
    specs = load_specs(root)
    assert set(specs.blocks) == {
        "kda",
        "dsa",
        "moe",
        "dense",
        "layer_norms",
        "mhc",
        "mtp_head",
        "lm_globals",
        "mla",
        "mla_indexed",
        "gqa",
        "mamba2",
        "mixer_attention",
        "mixer_mlp",
        "mixer_moe",
        "pre_norm",
        "backbone_globals",
        "gqa_attention",
        "mla_lora",
    }
    assert set(specs.models) == {
        "glm-5.3-flash", "kimi-linear", "deepseek-v3.2", "llama", "qwen3-moe", "nemotron-h",
        "phi3", "deepseek-v3",
    }  # fmt: skip


def _no_markers(root: Path) -> None:
    edit(root, KDA, "markers:\n  all_required: true\n", "markers:\n  all_of: []\n")


def _a_file_named_badly(root: Path) -> None:
    (root / "specs" / "blocks" / "Bad Name.yaml").write_text("block: x\n")


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [(_no_markers, "schema"), (_a_file_named_badly, "spec file names")],
)
def test_structural_problems_are_refused(
    root: Path, mutate: Callable[[Path], None], fragment: str
) -> None:
    mutate(root)
    with pytest.raises(SpecError, match=fragment):
        load_specs(root)


def test_a_cols_layout_whose_unit_does_not_lead_the_split_axis_is_refused(root: Path) -> None:
    """o_absorb as [X, KVL * H]: the same shapes at every tp, but rank r's columns would not be
    its heads' columns of the TP=1 result."""
    edit(root, DSA, "    einsum: ihr,hrc->ihc\n", "    einsum: ihr,hrc->ich\n")
    edit(root, DSA, "    view: [X, H * KVL]\n", "    view: [X, KVL * H]\n")
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.path == "outputs.o_absorb.shard"
    assert (
        "a cols layout needs the unit's letter 'h' to lead result axis 1, which holds [c, h]"
        in e.value.message
    )


def test_a_scale_that_is_not_finite_at_the_model_geometry_is_refused(root: Path) -> None:
    edit(
        root,
        DSA,
        "    scale: IH ** -0.5\n",
        "    scale: IH ** 60 * IH ** 60 * IH ** 60 * IH ** 60\n",
    )
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.path == "outputs.weights_proj.scale"
    assert "scale is inf, not finite" in e.value.message
