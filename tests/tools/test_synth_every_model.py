"""Every generated model's own synthetic checkpoint (``specbind synth`` at its spec's
``synth:`` geometry) audits clean and binds: the spec's names, prefixes, ties and synth
config agree with each other, for each family a spec adds.

Claims, per model with a ``synth:`` section: nothing unaccounted, something bound and no
problem in audit; a bind at tp 1 returns every decoder layer written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specbind.audit import audit
from specbind.generated import MODELS
from specbind.runtime.bind import bind_checkpoint
from specbind.runtime.checkpoint import CheckpointDir
from specbind.synth import synth, tiny_values

NAMES = [n for n, t in MODELS.items() if t.synth is not None]


def test_the_new_families_have_synth_sections() -> None:
    assert len(NAMES) >= 30, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_a_models_synth_checkpoint_audits_clean_and_binds(name: str, tmp_path: Path) -> None:
    table = MODELS[name]
    assert table.synth is not None
    layers = table.synth.layers
    synth(table, tmp_path / "ck", tiny_values(table), layers=layers)
    rep = audit(CheckpointDir(tmp_path / "ck"), table, progress=False)
    assert rep["problems"] == [], rep["problems"]
    assert rep["coverage"]["unaccounted"] == 0 and rep["coverage"]["bound"] > 0, rep["coverage"]
    b = bind_checkpoint(CheckpointDir(tmp_path / "ck"), table, progress=False)
    assert len(b.layers) >= layers
