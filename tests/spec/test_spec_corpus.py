"""The malformed-spec corpus (tests/corpus/specs): each file is refused with one error that names
the file, the path inside it and the line, leaves generated/ untouched, and executes nothing.

Each corpus file states what it expects in its first two lines (``# expect:``, ``# path:``)
and marks the line the error must name with ``# <- error``. A case whose refusal needs a model
(a derivation only the model's geometry says) has one of the same name under ``models/``,
copied in beside the real models; the error is still the block's.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import patience
import pytest

from specbind.core.errors import SpecError
from specbind.generator.render import generate

REPO = Path(__file__).resolve().parents[2]
CORPUS = sorted((REPO / "tests" / "corpus" / "specs").glob("*.yaml"))
PWNED = Path("/tmp/specbind-pwned")


def expectation(path: Path) -> tuple[str, str, int | None]:
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    expect = lines[0].removeprefix("# expect: ")
    where = lines[1].removeprefix("# path:").strip()
    marked = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith("# <- error")]
    return expect, where, marked[0] if marked else None


def test_the_corpus_has_at_least_forty_malformed_specs() -> None:
    assert len(CORPUS) >= 40


@pytest.mark.parametrize("case", CORPUS, ids=[p.stem for p in CORPUS])
def test_a_malformed_spec_is_refused_naming_file_path_and_line(root: Path, case: Path) -> None:
    expect, where, line = expectation(case)
    shutil.copy(case, root / "specs" / "blocks" / "bad.yaml")
    model = case.parent / "models" / case.name
    if model.exists():
        shutil.copy(model, root / "specs" / "models" / "bad.yaml")
    before = {p: p.read_bytes() for p in (root / "generated").rglob("*") if p.is_file()}
    PWNED.unlink(missing_ok=True)
    with pytest.raises(SpecError) as e:
        generate(root, root / "generated")
    err = e.value
    assert err.file == "specs/blocks/bad.yaml"
    assert expect in err.message, err.message
    assert err.path == where
    if line is not None:
        assert err.line == line
    assert "\n" not in str(err)
    after = {p: p.read_bytes() for p in (root / "generated").rglob("*") if p.is_file()}
    assert after == before, "generated/ must be untouched"
    assert not PWNED.exists(), "nothing from the spec may execute"


def test_an_oversized_spec_is_refused_before_parsing(root: Path) -> None:
    (root / "specs" / "blocks" / "bad.yaml").write_text("block: bad\n" + "# padding\n" * 200_000)
    with pytest.raises(SpecError, match=r"over the 1048576 cap"):
        generate(root, root / "generated")


@pytest.mark.parametrize(
    "stem", ["billion_laughs_alias_bomb", "python_object_apply_tag", "tensor_name_with_jinja"]
)
def test_the_cli_refuses_a_malformed_spec_in_one_line(root: Path, stem: str) -> None:
    shutil.copy(
        CORPUS[[p.stem for p in CORPUS].index(stem)], root / "specs" / "blocks" / "bad.yaml"
    )
    proc = patience.run([sys.executable, "-m", "specbind", "generate", "--root", str(root)],
                        capture_output=True, text=True, cpu=60)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        "specbind: error: specs/blocks/bad.yaml:"
    )
    assert "Traceback" not in proc.stderr
