"""Bad specs are refused with one error naming the file, the path inside it and the line."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from specbind.core.errors import SpecError
from specbind.generator.render import generate, load_specs

REPO = Path(__file__).resolve().parents[2]


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
        "  q_proj.weight:\n    dtype: BF16\n",
        "  q_proj.weight:\n    dtype: BF61\n",
        "dtype: BF61",
        "tensors.q_proj.weight.dtype",
        "schema",
    ),
    (
        KDA,
        "shape: [linear_head_dim, hidden]\n",
        "shape: [linear_head_dim, Y]\n",
        "shape: [linear_head_dim, Y]",
        "tensors.f_a_proj.weight.shape[1]",
        "unknown symbol(s) Y",
    ),
    (
        KDA,
        "shape: [linear_heads, hidden]\n",
        "shape: [linear_heads, __import__('os')]\n",
        "__import__",
        "tensors.b_proj.weight.shape[1]",
        "schema",
    ),
    (
        KDA,
        "shape: [linear_heads, hidden]\n",
        "shape: [linear_heads, hidden / 0]\n",
        "hidden / 0",
        "tensors.b_proj.weight.shape[1]",
        "division by zero",
    ),
    (
        KDA,
        "shape: [linear_heads, hidden]\n",
        "shape: [linear_heads, hidden - hidden]\n",
        "hidden - hidden",
        "tensors.b_proj.weight.shape[1]",
        "evaluates to 0",
    ),
    (
        KDA,
        "shape: [linear_heads, hidden]\n    shard: {rows: linear_heads}\n",
        "shape: [linear_heads, hidden]\n    shard: {rows: linear_head_dim}\n",
        "shard: {rows: linear_head_dim}",
        "tensors.b_proj.weight.shard",
        "does not split into whole linear_head_dim units",
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
        "check: 8 * scan_chunk * linear_head_dim + 4 * scan_chunk * scan_chunk <= 49152",
        "check: 8 * scan_chunk * linear_head_dim + 4 * scan_chunk * scan_chunk <= 4915",
        "<= 4915",
        "constraints[1].check",
        "constraint scan_shared_memory fails",
    ),
    (
        KDA,
        "check: 8 * scan_chunk * linear_head_dim + 4 * scan_chunk * scan_chunk <= 49152",
        "check: open(scan_chunk) <= 49152",
        "open(scan_chunk)",
        "constraints[1].check",
        "call of 'open': only max(...) and min(...) are allowed",
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
        "    group: indexer\n    linear: true\n  indexer.wk.weight",
        "    group: indexr\n    linear: true\n  indexer.wk.weight",
        "group: indexr",
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
        "        view: [heads, qk_nope_head_dim, q_lora_rank]\n",
        "        view: [heads, qk_nope_head_dim, 2 * q_lora_rank]\n",
        "view: [heads, qk_nope_head_dim, 2 * q_lora_rank]",
        "outputs.q_absorb.operands[1].view",
        "has 50331648 elements",
    ),
    (
        DSA,
        "        slice: {axis: 1, start: 0, stop: qk_nope_head_dim}",
        "        slice: {axis: 1, start: 0, stop: qk_nope_head_dim + v_head_dim + 1}",
        "stop: qk_nope_head_dim + v_head_dim + 1",
        "outputs.q_absorb.operands[0].slice",
        "slice [0:1025] does not fit dim 1024",
    ),
    (
        DSA,
        "        view: [hidden, heads, v_head_dim]\n",
        "        view: [heads, hidden, v_head_dim]\n",
        "view: [heads, hidden, v_head_dim]",
        "outputs.o_absorb.operands[0].view",
        "must put the shard unit 'heads' alone at axis 1",
    ),
    (
        DSA,
        "    scale: index_heads ** -0.5\n",
        "    scale: index_headsX ** -0.5\n",
        "scale: index_headsX",
        "outputs.weights_proj.scale",
        "unknown symbol(s) index_headsX",
    ),
    (
        DSA,
        "    scale: index_heads ** -0.5\n",
        "    scale: index_heads ** -0.5 if index_heads else 1\n",
        "scale: index_heads ** -0.5 if",
        "outputs.weights_proj.scale",
        "IfExp is not allowed in a scale",
    ),
    (
        DSA,
        "    dtype: BF16\n    shard: {cols: heads}\n",
        "    dtype: BF16\n    shard: {rows: heads}  # was cols\n",
        "# was cols",
        "outputs.o_absorb.shard",
        "needs the unit's letter first",
    ),
    (
        DSA,
        "    view: [hidden, heads * kv_lora_rank]\n",
        "    view: [heads * kv_lora_rank, hidden]\n",
        "view: [heads * kv_lora_rank, hidden]",
        "outputs.o_absorb.view",
        "does not merge consecutive axes of [i, h, c]",
    ),
    (
        DSA,
        "    einsum: ihr,hrc->ihc\n",
        "    einsum: ihr,hrc->hic\n",
        "view: [hidden, heads * kv_lora_rank]",
        "outputs.o_absorb.view",
        "does not merge consecutive axes of [h, i, c]",
    ),
    (
        MOE,
        "  e: {count: experts, shard: experts}\n",
        "  e: {count: experts, shard: replicated}\n",
        "  e: {count: experts, shard: replicated}",
        "families.e.shard",
        "schema:",
    ),
    (
        # qk_nope_head_dim and v_head_dim swapped in the K-half slice: both are 256 at the real geometry, so only a
        # geometry where no two symbols are equal shows the einsum's r letters disagree.
        DSA,
        "        slice: {axis: 1, start: 0, stop: qk_nope_head_dim}      # the K half of each head's block\n",
        "        slice: {axis: 1, start: 0, stop: v_head_dim}      # the K half of each head's block\n",
        "    einsum: hrc,hrk->hck",
        "outputs.q_absorb.einsum",
        "at a geometry where no two symbols are equal",
    ),
    (
        KDA,
        "  k_conv1d.weight:\n    dtype: BF16\n    stored: [F32]\n    shape: [proj_dim, 1, conv_kernel]\n"
        "    shard: {rows: linear_heads}",
        "  k_conv1d.weight:\n    dtype: BF16\n    stored: [F32]\n    shape: [proj_dim, 1, conv_kernel]\n"
        "    shard: replicated",
        "concat: [q_conv1d.weight",
        "outputs.conv.concat",
        "concat joins tensors of different shard rules",
    ),
    (
        KDA,
        "  k_conv1d.weight:\n    dtype: BF16\n    stored: [F32]\n    shape: [proj_dim, 1, conv_kernel]\n",
        "  k_conv1d.weight:\n    dtype: BF16\n    stored: [F32]\n    shape: [proj_dim, 1, conv_kernel + 1]\n",
        "concat: [q_conv1d.weight",
        "outputs.conv.concat",
        "differ off that axis",
    ),
    (
        MODEL,
        "  linear_conv:      {config: linear_conv_kernel_dim, value: 4}\n",
        "",
        "symbols: {conv_kernel: linear_conv",
        "blocks[1].symbols.conv_kernel",
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
    (
        "models/llama.yaml",  # checked like `expr:`: 128 is no multiple of 3
        "{config: head_dim, default: hidden / heads, null_is_absent: true, value: 128}",
        "{config: head_dim, default: hidden * 3, null_is_absent: true, value: 128}",
        "default: hidden * 3",
        "geometry.head_dim.default",
        "head_dim: default hidden * 3 can never be its value 128 (no whole values of hidden "
        "give 128)",
    ),
    (
        "models/llama.yaml",  # a null read as absent already has its reading: the default
        "{config: head_dim, default: hidden / heads, null_is_absent: true, value: 128}",
        "{config: head_dim, default: 128, null_is_absent: true, null_default: hidden, value: 128}",
        "null_default: hidden",
        "geometry.head_dim.null_default",
        "`null_default` needs a `config` field, and says what `null_is_absent` would",
    ),
    (
        "models/llama.yaml",
        "{config: head_dim, default: hidden / heads, null_is_absent: true, value: 128}",
        "{config: head_dim, default: 128, null_default: hidden / kv_head, value: 128}",
        "null_default: hidden / kv_head",
        "geometry.head_dim.null_default",
        "kv_head",
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
    # at least these: the families added since (tests/families/) grow both sets on their own
    assert set(specs.blocks) >= {
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
        "mamba2",
        "mixer_attention",
        "mixer_mlp",
        "mixer_moe",
        "pre_norm",
        "gqa_attention",
        "gqa",
        "sink_attention",
        "stacked_moe",
        "mla_lora",
    }
    assert set(specs.models) >= {
        "glm-5.3-flash", "kimi-linear", "deepseek-v3.2", "nemotron-h", "phi3", "llama", "qwen3-moe",
        "gpt-oss", "deepseek-v3",
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
    """o_absorb as [hidden, kv_lora_rank * heads]: the same shapes at every tp, but rank r's columns would not be
    its heads' columns of the TP=1 result."""
    edit(root, DSA, "    einsum: ihr,hrc->ihc\n", "    einsum: ihr,hrc->ich\n")
    edit(
        root,
        DSA,
        "    view: [hidden, heads * kv_lora_rank]\n",
        "    view: [hidden, kv_lora_rank * heads]\n",
    )
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
        "    scale: index_heads ** -0.5\n",
        "    scale: index_heads ** 60 * index_heads ** 60 * index_heads ** 60 * index_heads ** 60\n",
    )
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.path == "outputs.weights_proj.scale"
    assert "scale is inf, not finite" in e.value.message


def test_a_block_symbol_left_out_of_the_map_binds_the_geometry_symbol_of_its_own_name(
    root: Path,
) -> None:
    uses = {u.block: u.symbols for u in load_specs(root).models["glm-5.3-flash"].blocks}
    assert uses["dsa"]["kv_lora_rank"] == "kv_lora_rank"
    assert uses["moe"]["expert_intermediate"] == "moe_intermediate"


def test_a_block_symbol_with_no_geometry_symbol_of_its_name_must_be_mapped(root: Path) -> None:
    edit(root, MODEL, "    symbols: {expert_intermediate: moe_intermediate}\n", "")
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.path == "blocks[2].symbols"
    assert "block moe symbols not bound: expert_intermediate" in e.value.message


@pytest.mark.parametrize(
    ("default", "value", "reals", "verdict"),
    [
        # Qwen3-MoE: hidden / heads is 64 at its real geometry, 128 at hidden 4096: accepted
        ("hidden / heads", 128, {"hidden": 2048, "heads": 32}, True),
        ("hidden * 3", 128, {"hidden": 2048, "heads": 32}, False),
        ("hidden * heads * 3", 129, {"hidden": 2048, "heads": 32}, True),  # 43 * 1 * 3
        ("heads * heads * 3", 129, {"hidden": 2048, "heads": 32}, False),  # 43 is no square
        ("hidden - heads", 128, {"hidden": 2048, "heads": 32}, True),
        ("hidden // heads", 128, {"hidden": 2048, "heads": 32}, None),  # cannot tell: accepted
    ],
)
def test_a_default_is_refused_only_where_no_geometry_gives_its_value(
    default: str, value: int, reals: dict[str, int], verdict: bool | None
) -> None:
    from specbind.core import algebra
    from specbind.core.polynomial import can_equal

    lows = dict.fromkeys(reals, 1)
    assert can_equal(algebra.parse(default), value, lows, reals) is verdict
