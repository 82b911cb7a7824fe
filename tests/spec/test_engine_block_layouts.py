"""An engine's layouts per block (specs/engines/<engine>/blocks/<block>.yaml), reused by every
model: a model's layout names only the blocks its engine holds otherwise, so a Llama-like
family's layout is a few lines. Checked at generate time, like a model's own entries."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from specbind.core.errors import SpecError
from specbind.generator.render import render_all

REPO = Path(__file__).resolve().parent.parent.parent
VLLM = Path("specs") / "engines" / "vllm"


@pytest.fixture
def specs(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    return tmp_path


def _refusal(root: Path) -> str:
    with pytest.raises(SpecError) as e:
        render_all(root)
    return str(e.value)


def _edit(root: Path, file: str, old: str, new: str) -> None:
    p = root / VLLM / file
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new, 1))


def _parameters(module: str) -> str:
    """The generated layout's PARAMETERS table, as text."""
    m = re.search(r"^PARAMETERS: .*?^}\n", module, re.M | re.S)
    assert m is not None
    return m.group(0)


def test_a_model_layout_naming_no_blocks_binds_every_block_by_the_engines_block_layouts(
    specs: Path,
) -> None:
    layout = (REPO / VLLM / "llama.yaml").read_text()
    assert "blocks:" not in layout and len(layout.splitlines()) <= 10
    ours = render_all(REPO)["engines/vllm_llama.py"]
    # the same blocks written out in the model's own layout bind to the same engine tables
    own = "blocks:\n"
    for b in ("gqa", "dense", "layer_norms", "lm_globals"):
        text = (REPO / VLLM / "blocks" / f"{b}.yaml").read_text()
        body = text[text.index("\noutputs:\n" if "\noutputs:\n" in text else "\nparameters:\n") :]
        own += f"  {b}:\n" + "".join(
            "    " + x if x.strip() else x for x in body.lstrip("\n").splitlines(keepends=True)
        )
    (specs / VLLM / "llama.yaml").write_text(layout + own)
    theirs = render_all(specs)["engines/vllm_llama.py"]
    assert _parameters(ours) == _parameters(theirs)
    assert ours.split("\n", 1)[1] == theirs.split("\n", 1)[1]  # all but the header's source
    assert "self_attn.qkv_proj.weight" in _parameters(ours)


def test_a_models_own_block_entry_replaces_that_block_layout_for_that_model_alone(
    specs: Path,
) -> None:
    p = specs / VLLM / "llama.yaml"
    p.write_text(
        p.read_text() + "blocks:\n  dense:\n    parameters:\n"
        "      mlp.fc_in.weight: gate_up\n      mlp.fc_out.weight: down\n"
    )
    files = render_all(specs)
    llama, qwen = files["engines/vllm_llama.py"], files["engines/vllm_qwen3_moe.py"]
    assert '"gate_up": "mlp.fc_in.weight"' in _parameters(llama)
    assert '"gate_up": "mlp.gate_up_proj.weight"' in _parameters(qwen)
    assert '"qkv_proj": "self_attn.qkv_proj.weight"' in _parameters(llama)  # gqa: the engine's


def test_a_block_neither_the_model_nor_the_engine_lays_out_is_refused_naming_both_places(
    specs: Path,
) -> None:
    (specs / VLLM / "blocks" / "dense.yaml").unlink()
    msg = _refusal(specs)
    assert "no engine parameters for block(s) dense" in msg, msg
    assert "specs/engines/vllm/blocks/<block>.yaml" in msg, msg


def test_a_block_layouts_shapes_are_in_the_blocks_symbols_not_a_models(specs: Path) -> None:
    # moe's expert size is expert_intermediate; the models call it moe_intermediate
    _edit(specs, "blocks/moe.yaml", "shape: [experts, hidden, expert_intermediate / tp]",
          "shape: [experts, hidden, moe_intermediate / tp]")  # fmt: skip
    msg = _refusal(specs)
    assert "specs/engines/vllm/blocks/moe.yaml" in msg and "moe_intermediate" in msg, msg
    assert "unknown symbol" in msg, msg


def test_a_wrong_block_layout_shape_is_refused_naming_its_file_the_model_and_the_tp(
    specs: Path,
) -> None:
    _edit(specs, "blocks/dense.yaml", "shape: [hidden, intermediate / tp]",
          "shape: [hidden, intermediate]")  # fmt: skip
    msg = _refusal(specs)
    assert msg.startswith("specs/engines/vllm/blocks/dense.yaml:"), msg
    assert "mlp.down_proj.weight of " in msg and "tp 2" in msg, msg
    assert "the engine's shape is" in msg, msg


def test_a_block_layout_of_an_unknown_block_or_under_another_name_is_refused(
    specs: Path,
) -> None:
    d = specs / VLLM / "blocks"
    (d / "dense.yaml").rename(d / "mlp.yaml")
    assert "lives in specs/engines/vllm/blocks/dense.yaml" in _refusal(specs)
    text = (d / "mlp.yaml").read_text()
    (d / "mlp.yaml").write_text(text.replace("block: dense", "block: mlp"))
    (d / "dense.yaml").write_text(text)
    assert "unknown block 'mlp'" in _refusal(specs)
