"""An engine's layout of a quantization scheme (``specs/engines/<engine>/schemes/<scheme>.yaml``),
checked at generate time against the scheme it names.

Claims: each of the scheme's companions is held or refused, once, and no other is named; the
packed weight is never refused; ``dtype: F32`` widens only a BF16 or F16 companion; the scheme
and the proof's models exist; an ``unavailable:`` file holds the reason alone; a file lives
under its scheme's name. Each refusal is one ``SpecError`` naming the file, path and line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from specbind.core.errors import SpecError
from specbind.generated.schemes import SCHEMES
from specbind.generator import engines, yamlio

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "specs" / "engines" / "vllm" / "schemes" / "fp8-channel-compressed-tensors.yaml"
BY_NAME = {s.name: s for s in SCHEMES}
MODELS = {
    yaml.safe_load(p.read_text())["model"] for p in (REPO / "specs" / "models").glob("*.yaml")
}


def _parse(text: str, name: str = "fp8-channel-compressed-tensors") -> engines.SchemeLayout:
    doc = yamlio.loads(text, f"specs/engines/vllm/schemes/{name}.yaml")
    return engines.parse_scheme_layout(doc, "vllm", BY_NAME, MODELS)


def _refusal(text: str) -> str:
    with pytest.raises(SpecError) as e:
        _parse(text)
    msg = str(e.value)
    assert msg.startswith("specs/engines/vllm/schemes/") and "\n" not in msg, msg
    return msg


def test_the_real_layout_parses_with_its_scale_widened_to_f32() -> None:
    sl = _parse(REAL.read_text())
    assert sl.dtypes == {"weight_scale": "F32"} and "input_scale" in sl.refused


def test_a_companion_neither_held_nor_refused_is_refused_naming_it() -> None:
    text = re.sub(r"refused:\n(  .*\n)+(?=made_by_engine)", "", REAL.read_text())
    assert "\nrefused:" not in text
    msg = _refusal(text)
    assert "'input_scale'" in msg and "neither held nor refused" in msg, msg


def test_a_companion_the_scheme_does_not_store_is_refused_naming_it() -> None:
    text = REAL.read_text().replace(
        "  weight_scale:\n", "  weight_zero_point: {why: x}\n  weight_scale:\n"
    )
    msg = _refusal(text)
    assert "no companion 'weight_zero_point'" in msg, msg


def test_a_companion_both_held_and_refused_is_refused() -> None:
    text = REAL.read_text().replace("refused:\n", "refused:\n  weight_scale: not served\n")
    assert "also held" in _refusal(text)


def test_widening_an_fp8_weight_to_f32_is_refused_naming_its_stored_dtype() -> None:
    text = REAL.read_text().replace(
        "companions:\n  weight:\n", "companions:\n  weight:\n    dtype: F32\n"
    )
    msg = _refusal(text)
    assert "F8_E4M3" in msg and "companions.weight.dtype" in msg, msg


def test_an_unknown_scheme_or_proof_model_is_refused() -> None:
    assert "unknown scheme" in _refusal(REAL.read_text().replace(
        "scheme: fp8-channel-compressed-tensors", "scheme: fp8-channel-nowhere"))  # fmt: skip
    assert "unknown model 'nomodel'" in _refusal(
        REAL.read_text().replace("models: [llama,", "models: [nomodel,")
    )


def test_an_unavailable_scheme_layout_holds_the_reason_alone() -> None:
    ok = _parse("engine: vllm\nscheme: fp8-channel-compressed-tensors\nunavailable: it fails\n")
    assert ok.unavailable == "it fails" and not ok.dtypes
    msg = _refusal(
        "engine: vllm\nscheme: fp8-channel-compressed-tensors\nunavailable: it fails\n"
        "proof: {test: tests/x.py, claim: c, tp: [1], models: [llama]}\n"
    )
    assert "schema" in msg, msg


def test_a_scheme_layout_lives_under_its_schemes_name(tmp_path: Path) -> None:
    folder = tmp_path / "specs" / "engines" / "vllm" / "schemes"
    folder.mkdir(parents=True)
    (folder / "int8-channel-compressed-tensors.yaml").write_text(REAL.read_text())
    (tmp_path / "tests" / "vllm").mkdir(parents=True)
    (tmp_path / "tests" / "vllm" / "test_vllm_quant_proofs.py").write_text("")
    with pytest.raises(SpecError) as e:
        engines.load_scheme_layouts(tmp_path, BY_NAME, MODELS)
    assert "lives in specs/engines/vllm/schemes/fp8-channel-compressed-tensors.yaml" in str(e.value)


def test_a_companion_the_engine_holds_of_a_fused_linears_last_partner_is_listed() -> None:
    real = REAL.parent / "int-group-compressed-tensors.yaml"
    sl = _parse(real.read_text(), "int-group-compressed-tensors")
    assert sl.last == ("weight_shape",) and not sl.dtypes
    bad = real.read_text().replace("    fused: last\n", "    fused: first\n")
    with pytest.raises(SpecError) as e:
        _parse(bad, "int-group-compressed-tensors")
    assert "companions.weight_shape.fused" in str(e.value), e.value
