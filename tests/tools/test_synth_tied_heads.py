"""``specbind synth`` of a model whose synth config ties the head (Gemma, Granite, Cohere, ...)
writes no ``lm_head.weight``: the head is the embedding, and bind refuses a stored copy.

Claims: for every generated model whose synth config sets its head's tie flag, the synthetic
checkpoint holds no head tensor and audits clean (nothing unaccounted, no problem); the
head binds from the embedding, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specbind.audit import audit
from specbind.generated import MODELS
from specbind.runtime.bind import bind_checkpoint
from specbind.runtime.checkpoint import CheckpointDir
from specbind.synth import synth, tiny_values


def _tied_heads(table: Any) -> list[str]:
    if table.synth is None or table.globals is None:
        return []
    flags = json.loads(table.synth.config_json)
    block = table.block(table.globals)
    return [t.name for t in block.tensors if t.tie is not None and flags.get(t.tie.config)]


TIED = [n for n, t in MODELS.items() if _tied_heads(t)]


def test_some_models_tie_their_synth_head() -> None:
    assert len(TIED) >= 3, TIED  # Gemma 1-3, Granite, Cohere, ... (a rename would empty this)


@pytest.mark.parametrize("name", TIED)
def test_a_tied_synth_checkpoint_stores_no_head_and_binds_it_from_the_embedding(
    name: str, tmp_path: Path
) -> None:
    table = MODELS[name]
    synth(table, tmp_path / "ck", tiny_values(table), layers=2)
    from safetensors import safe_open

    stored: set[str] = set()
    for f in (tmp_path / "ck").glob("*.safetensors"):
        with safe_open(f, "np") as h:
            stored |= set(h.keys())
    assert not set(_tied_heads(table)) & stored, sorted(stored)
    rep = audit(CheckpointDir(tmp_path / "ck"), table, progress=False)
    assert rep["problems"] == [] and rep["coverage"]["unaccounted"] == 0, rep["problems"]
    g = bind_checkpoint(CheckpointDir(tmp_path / "ck"), table, progress=False).globals
    assert g is not None
    a = g.weights.arrays()
    assert a["lm_head"].tobytes() == a["embed_tokens"].tobytes()
