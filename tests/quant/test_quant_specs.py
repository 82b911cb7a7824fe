"""Bad quantization specs (scheme files, ``linear``/``shared_scales`` in blocks, the model's name
map) are refused in one line naming the file, the path inside it and the line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specbind.core.errors import SpecError
from specbind.generator.render import load_specs

REPO = Path(__file__).resolve().parents[2]
NVFP4 = "schemes/nvfp4-modelopt.yaml"
FP8 = "schemes/fp8-block.yaml"

# (spec file, old text, new text, line needle, path in the error, message fragment)
CASES = [
    (
        NVFP4,
        "{dtype: U8,      shape: [O, I / 2],  role: weight}",
        "{dtype: U8,      shape: [O, I / 4],  role: weight}",
        "role: weight}",
        "companions.weight.shape",
        "the packed weight of 2 element(s) per byte is [O, I / 2]",
    ),
    (
        NVFP4,
        "group: [16], global: multiply}",
        "group: [32], global: multiply}",
        "dequant:",
        "dequant.group",
        "an NVFP4 group of [32] needs the block scale [O, I / group], not [O, I / 16]",
    ),
    (
        NVFP4,
        "{dtype: F32,     shape: [],          role: global_scale}",
        "{dtype: F32,     shape: [ceil(O / 2)], role: global_scale}",
        "role: global_scale}",
        "companions.weight_scale_2.shape",
        "ceil is allowed only on a block scale",
    ),
    (
        NVFP4,
        "swizzle: weight_scale",
        "swizzle: input_scale",
        "swizzle:",
        "swizzle",
        "'input_scale' is not the scheme's block scale",
    ),
    (
        FP8,
        "global: none}",
        "global: multiply}",
        "dequant:",
        "dequant.global",
        "global: multiply and the companions disagree on a global_scale",
    ),
    (
        NVFP4,
        "shape: [O, I / 16], role: block_scale}",
        "shape: [O, I / 16], role: block_scale, name: q_proj.weight}",
        "role: block_scale",
        "companions.weight_scale.name",  # a name is only a {param}_suffix template
        "schema",
    ),
    (
        "blocks/kda.yaml",
        "shape: [proj_dim, 1, conv_kernel]\n    shard: {rows: linear_heads}\n  k_conv1d",
        "shape: [proj_dim, 1, conv_kernel]\n    shard: {rows: linear_heads}\n    linear: true  # bad\n  k_conv1d",
        "linear: true  # bad",
        "tensors.q_conv1d.weight.linear",
        "a linear weight is a 2-D [O, I] tensor named MODULE.weight",
    ),
    (
        "blocks/kda.yaml",
        "tensors: [q_proj.weight, k_proj.weight, v_proj.weight]",
        "tensors: [q_proj.weight, k_proj.weight, A_log]",
        "tensors: [q_proj.weight",
        "shared_scales[0].tensors[2]",
        "'A_log' is not a linear tensor of this block",
    ),
    (
        "models/glm-5.3-flash.yaml",
        "    segments: 3\n",
        "",
        "to: [self_attn.q_conv1d.weight",
        "names[3].segments",
        "3 names need segments: 3 (one row segment each)",
    ),
]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    return tmp_path


@pytest.mark.parametrize(("rel", "old", "new", "needle", "path", "fragment"), CASES)
def test_a_bad_quantization_spec_is_refused_naming_file_path_and_line(
    root: Path, rel: str, old: str, new: str, needle: str, path: str, fragment: str
) -> None:
    p = root / "specs" / rel
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new, 1))
    with pytest.raises(SpecError) as e:
        load_specs(root)
    lines = p.read_text().splitlines()
    line = next(i + 1 for i, s in enumerate(lines) if needle in s)
    assert e.value.file == f"specs/{rel}"
    assert e.value.path == path
    assert fragment in e.value.message
    assert e.value.line is not None and abs(e.value.line - line) <= 1


def test_a_scheme_file_names_no_model_tensor() -> None:
    text = "\n".join(p.read_text() for p in (REPO / "specs" / "schemes").glob("*.yaml"))
    for tensor in ("q_proj", "gate_proj", "experts", "self_attn", "mlp."):
        assert tensor not in text
