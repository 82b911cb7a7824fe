"""``generate`` refuses, in one line naming the file, the path and the line, two kinds of spec
text it once accepted: an engine layout whose ``proof:`` names a test file the suite does not
hold, and a power in a geometry expression that no dimension is (``hidden ** 64 ** 2``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from specbind.core.errors import SpecError
from specbind.generator.render import render_all

REPO = Path(__file__).resolve().parents[2]
LLAMA = "specs/models/llama.yaml"
LAYOUT = "specs/engines/vllm/llama.yaml"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The specs, and the suite's test files every engine layout names as its proof."""
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    for layout in (REPO / "specs" / "engines").glob("*/**/*.yaml"):
        proof = (yaml.safe_load(layout.read_text()) or {}).get("proof") or {}
        if proof.get("test"):
            (tmp_path / proof["test"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / proof["test"], tmp_path / proof["test"])
    return tmp_path


def edit(root: Path, file: str, old: str, new: str) -> int:
    """Replace ``old`` by ``new`` in ``file``; the 1-based line it is on."""
    p = root / file
    text = p.read_text()
    assert text.count(old) == 1, old
    p.write_text(text.replace(old, new))
    return text[: text.index(old)].count("\n") + 1


def refusal(root: Path) -> str:
    with pytest.raises(SpecError) as e:
        render_all(root)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_proof_naming_a_test_file_the_suite_lacks_is_refused_at_generate(root: Path) -> None:
    line = edit(
        root, LAYOUT, "test: tests/vllm/test_vllm_proofs.py", "test: tests/vllm/test_gone.py"
    )
    assert refusal(root) == (
        f"{LAYOUT}:{line} at proof.test: tests/vllm/test_gone.py is not a file of the suite: "
        "the proof names the test that runs the layout against the engine's own loader"
    )


@pytest.mark.parametrize(
    ("default", "why"),
    [
        ("hidden ** 64 ** 2", "the exponent '64 ** 2' of ** is not an integer literal (at most 8)"),
        ("hidden ** heads", "the exponent 'heads' of ** is not an integer literal (at most 8)"),
        ("2 ** (hidden // heads)", "the exponent 'hidden // heads' of ** is not an integer"),
        ("hidden ** 64", "the exponent 64 of ** is over 8: no dimension is so high a power"),
    ],
)
def test_a_huge_power_in_a_default_is_refused_at_generate_naming_the_line(
    root: Path, default: str, why: str
) -> None:
    line = edit(root, LLAMA, "default: hidden / heads,", f"default: {default},")
    assert refusal(root).startswith(f"{LLAMA}:{line} at geometry.head_dim.default: {why}")


def test_a_small_power_in_a_default_still_generates(root: Path) -> None:
    """The bound is on the exponent only: ``(hidden // heads) ** 1`` is the same default."""
    edit(root, LLAMA, "default: hidden / heads,", "default: (hidden / heads) ** 1,")
    render_all(root)
