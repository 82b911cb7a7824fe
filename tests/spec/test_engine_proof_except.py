"""``proof.except``: the blocks of a proven engine layout its proof cannot reach (the engine's own
loader cannot build a checkpoint holding them; measured).

Claims: they name blocks the layout binds; the supported-models table says which and why; a
bind whose layers hold one warns naming it, and one whose layers hold none does not.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specbind.core.errors import SpecError
from specbind.generator.render import render_all

REPO = Path(__file__).resolve().parents[2]


def test_an_except_block_must_be_a_block_the_layout_binds(tmp_path: Path) -> None:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    p = tmp_path / "specs" / "engines" / "vllm" / "nemotron-h.yaml"
    text = p.read_text()
    assert "blocks: [mixer_moe]" in text
    p.write_text(text.replace("blocks: [mixer_moe]", "blocks: [moe]"))
    with pytest.raises(SpecError) as e:
        render_all(tmp_path)
    assert "specs/engines/vllm/nemotron-h.yaml" in str(e.value)
    assert "block 'moe' is not a block this layout binds" in str(e.value)


def test_the_models_table_says_which_blocks_the_proof_does_not_reach() -> None:
    from specbind.models_table import engine_status, supported

    (e,) = next(r for r in supported() if r["model"] == "nemotron-h")["engines"]
    assert e["except"]["blocks"] == ["mixer_moe"]
    status = engine_status(e)
    assert status.startswith("proved at tp 1, 2 by tests/vllm/test_vllm_proofs.py; not mixer_moe:")
    assert "is_act_and_mul=False" in status


def test_a_bind_holding_a_block_the_proof_does_not_reach_warns_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from specbind.cli import main
    from specbind.engine import bind_for_engine

    ckpt = tmp_path / "nemotron"
    assert main(["synth", "--model", "nemotron-h", str(ckpt)]) == 0
    with caplog.at_level("WARNING", logger="specbind.engine"):
        fields = bind_for_engine(ckpt, "vllm")
    assert any(".experts." in n for n in fields), "the synth checkpoint holds an MoE layer"
    (rec,) = [r for r in caplog.records if r.name == "specbind.engine"]
    assert "hold mixer_moe, which the proof of the vllm layout of nemotron-h" in rec.getMessage()
    caplog.clear()
    llama = tmp_path / "llama"
    assert main(["synth", "--model", "llama", str(llama)]) == 0
    with caplog.at_level("WARNING", logger="specbind.engine"):
        bind_for_engine(llama, "vllm")
    assert not [r for r in caplog.records if r.name == "specbind.engine"]
