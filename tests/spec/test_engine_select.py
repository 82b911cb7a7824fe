"""Layouts chosen as the engine chooses its class: by config.json ``architectures`` (vLLM's
registry), the model type's layout where none is listed (``specbind.engine_select``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specbind.core.errors import SpecbindError, SpecError
from specbind.engine import bind_for_engine
from specbind.generator.render import render_all

REPO = Path(__file__).resolve().parents[2]
NATIVE = ("model.layers.0.block_sparse_moe.gate.weight", "lm_head.bias")  # vLLM's PhiMoE
BACKEND = "model.layers.0.mlp.router.weight"  # vLLM's Transformers backend of transformers'


@pytest.fixture(scope="module")
def phimoe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specbind.cli import main

    ckpt = tmp_path_factory.mktemp("phimoe") / "ckpt"
    assert main(["synth", "--model", "phimoe", str(ckpt)]) == 0
    return ckpt


def _saying(src: Path, dst: Path, architectures: object) -> Path:
    """A copy of ``src`` whose config.json says ``architectures`` (absent where ``...``)."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.pop("architectures", None)
    if architectures is not ...:
        config["architectures"] = architectures
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_a_hub_phi_3_5_moe_binds_vllms_native_phimoe_names_and_its_head_bias(
    phimoe: Path, tmp_path: Path
) -> None:
    fields = bind_for_engine(_saying(phimoe, tmp_path / "hub", ["PhiMoEForCausalLM"]), "vllm")
    assert all(n in fields for n in NATIVE) and BACKEND not in fields
    assert fields["lm_head.bias"].array.shape[0] % 64 == 0  # ParallelLMHead's padded rows


def test_transformers_phimoe_architecture_binds_vllms_transformers_backend_names(
    phimoe: Path, tmp_path: Path
) -> None:
    fields = bind_for_engine(_saying(phimoe, tmp_path / "hf", ["PhimoeForCausalLM"]), "vllm")
    assert BACKEND in fields and NATIVE[0] not in fields


@pytest.mark.parametrize("architectures", [..., None, "PhiMoEForCausalLM", [3, None]])
def test_a_config_listing_no_known_architecture_falls_back_to_the_model_types_layout(
    phimoe: Path, tmp_path: Path, architectures: object
) -> None:
    fields = bind_for_engine(_saying(phimoe, tmp_path / "x", architectures), "vllm")
    assert BACKEND in fields  # specs/engines/vllm/phimoe.yaml, the model type's


def test_the_first_listed_architecture_a_layout_serves_picks_it(
    phimoe: Path, tmp_path: Path
) -> None:
    ckpt = _saying(phimoe, tmp_path / "two", ["SomethingElse", "PhiMoEForCausalLM"])
    assert NATIVE[0] in bind_for_engine(ckpt, "vllm")


def test_an_architecture_another_models_layout_serves_is_refused_naming_both(
    phimoe: Path, tmp_path: Path
) -> None:
    ckpt = _saying(phimoe, tmp_path / "glm", ["GlmForCausalLM"])
    with pytest.raises(SpecbindError) as e:
        bind_for_engine(ckpt, "vllm")
    assert str(e.value) == (
        "config.json architectures names GlmForCausalLM, which vllm serves by its layout of glm "
        "(specs/engines/vllm/glm.yaml), but the checkpoint is read as phimoe: vllm would build "
        "the other model's class"
    )


def _root(tmp: Path) -> Path:
    shutil.copytree(REPO / "specs", tmp / "specs")
    return tmp


def test_a_second_layout_of_a_model_must_say_its_architectures(tmp_path: Path) -> None:
    root = _root(tmp_path)
    p = root / "specs" / "engines" / "vllm" / "phimoe-native.yaml"
    p.write_text(p.read_text().replace("architectures: [PhiMoEForCausalLM]\n", ""))
    with pytest.raises(SpecError, match=r"phimoe-native\.yaml.*a second layout of phimoe is "
                       r"chosen by the checkpoint's architectures"):  # fmt: skip
        render_all(root)


def test_one_architecture_served_by_two_layouts_is_refused(tmp_path: Path) -> None:
    root = _root(tmp_path)
    p = root / "specs" / "engines" / "vllm" / "phimoe.yaml"
    p.write_text(
        p.read_text().replace("[PhimoeForCausalLM]", "[PhimoeForCausalLM, GlmForCausalLM]")
    )
    with pytest.raises(SpecError, match=r"architecture 'GlmForCausalLM' is also served by"):
        render_all(root)


def test_a_layout_file_named_after_no_model_of_its_own_is_refused(tmp_path: Path) -> None:
    root = _root(tmp_path)
    src = root / "specs" / "engines" / "vllm" / "phimoe-native.yaml"
    src.rename(src.with_name("glm-native.yaml"))
    with pytest.raises(SpecError, match=r"lives in specs/engines/vllm/phimoe\.yaml \(or"):
        render_all(root)
