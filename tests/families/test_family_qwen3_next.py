"""Qwen3-Next's claims beyond the table-driven family proof (tests/families/
test_family_proofs.py proves every field of every rank): what the hub's checkpoint and
config.json carry that transformers' writer does not.

* the hub's MTP layer (``mtp.*``: the speculative draft model's, loaded by neither
  transformers' Qwen3NextForCausalLM nor vLLM's) is declared unbound: listed, never bound;
* the hub's config.json gives full_attention_interval, not layer_types: the interval then
  decides each layer's attention, and one that contradicts the names is refused naming the layer;
* the Gated DeltaNet's key heads are never replicated (vLLM views a rank's in_proj as whole
  key-head groups): a tp above them is refused naming the unit, though the KV heads would
  replicate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_proof import write_family
from family_rows_moe import QWEN3_NEXT
from helpers import copy_with

from specbind.audit import audit
from specbind.core.errors import GeometryError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

pytest.importorskip("torch", exc_type=ImportError)
pytest.importorskip("transformers", exc_type=ImportError)

pytestmark = pytest.mark.interop

TABLE = MODELS["qwen3-next"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_family(QWEN3_NEXT, tmp_path_factory.mktemp("qwen3-next") / "ck")


def _hub_config(path: Path, **fields: Any) -> Path:
    """``path``'s config.json as the hub writes it: no layer_types, ``fields`` added."""
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("layer_types")
    (path / "config.json").write_text(json.dumps(cfg | fields))
    return path


def test_the_hubs_mtp_layer_is_declared_unbound_and_never_read(ckpt: Path, tmp_path: Path) -> None:
    z = np.zeros((4, 48), np.float32)
    mtp = {"mtp.fc.weight": z, "mtp.layers.0.self_attn.q_proj.weight": z, "mtp.norm.weight": z[0]}
    got = bind_checkpoint(CheckpointDir(copy_with(ckpt, tmp_path / "m", mtp)), TABLE,
                          progress=False)  # fmt: skip
    assert got.unbound == {"mtp.": 3}
    assert not any(k.startswith("mtp") for k in got.fields())


def test_full_attention_interval_decides_the_attention_where_layer_types_is_absent(
    ckpt: Path, tmp_path: Path
) -> None:
    ok = _hub_config(copy_with(ckpt, tmp_path / "ok"), full_attention_interval=2)
    rep = audit(CheckpointDir(ok), TABLE, progress=False)
    assert rep["problems"] == [] and rep["coverage"]["unaccounted"] == 0
    bad = _hub_config(copy_with(ckpt, tmp_path / "bad"), full_attention_interval=4)
    assert audit(CheckpointDir(bad), TABLE, progress=False)["problems"] == [
        "layer 1: config.json full_attention_interval is 4 (layer 1 + 1 = 2 is not a multiple "
        "of 4), so its attention is gdn by the schedule, but the layer's tensors are gqa_gated"
    ]


def test_a_tp_above_the_key_heads_is_refused_though_kv_heads_would_replicate(ckpt: Path) -> None:
    with pytest.raises(GeometryError) as e:
        bind_checkpoint(CheckpointDir(ckpt), TABLE, tp_size=8, tp_rank=0, progress=False)
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert msg.startswith("gdn: linear_attn.in_proj_qkvz.weight shards rows on k_heads = 4 units")
    assert "k_heads is never replicated" in msg and msg.endswith("use a tp of at most 4")
