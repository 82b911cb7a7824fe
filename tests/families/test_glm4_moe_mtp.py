"""GLM-4.5 MoE's MTP layer (specs/models/glm4-moe.yaml): the hub checkpoint holds layer
num_hidden_layers (enorm, hnorm, eh_proj, shared_head.norm, full attention and MoE), which
transformers neither loads nor saves.

Claims:
* a checkpoint holding the MTP layer (``specbind synth``, the spec's own names) binds it on
  every rank of tp 2 as an MTP layer (enorm, hnorm, eh_proj, shared_head norm, its attention,
  its MoE shaped as a decoder MoE layer's share), and audit accounts for every tensor;
* a checkpoint transformers writes, whose config.json still counts the MTP layer, is refused in
  one line naming the option that binds the decoder alone; with ``mtp=False`` it binds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbind.audit import audit
from specbind.core.errors import BindError
from specbind.generated import MODELS
from specbind.runtime.bind import bind_checkpoint
from specbind.runtime.checkpoint import CheckpointDir

TABLE = MODELS["glm4-moe"]


def test_a_checkpoint_holding_the_mtp_layer_binds_it_on_every_rank(tmp_path: Path) -> None:
    from specbind.synth import synth, tiny_values

    synth(TABLE, tmp_path / "ck", tiny_values(TABLE), layers=3)
    ck = CheckpointDir(tmp_path / "ck")
    rep = audit(ck, TABLE, progress=False)
    assert rep["problems"] == [] and rep["coverage"]["unaccounted"] == 0
    mtp = 3  # num_hidden_layers: the MTP layer follows the decoder
    for r in range(2):
        bound = bind_checkpoint(ck, TABLE, tp_size=2, tp_rank=r, progress=False)
        layer = bound.layers[-1]
        assert layer.index == mtp and layer.role == "mtp"
        fields = bound.fields()
        for f in ("enorm", "hnorm", "eh_proj", "shared_head_norm"):
            assert f"layers.{mtp}.mtp.{f}" in fields, f
        assert f"layers.{mtp}.mlp.w13" in fields and f"layers.{mtp}.attention.q_proj" in fields
        # the MTP layer's MoE splits as a decoder MoE layer's does
        assert fields[f"layers.{mtp}.mlp.w13"][1].shape == fields["layers.1.mlp.w13"][1].shape


def test_a_transformers_checkpoint_counting_an_mtp_layer_is_refused_then_binds_decoder_only(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch", exc_type=ImportError)
    pytest.importorskip("transformers", exc_type=ImportError)
    from family_proof import write_family
    from family_rows_moe import GLM4_MOE

    path = write_family(
        GLM4_MOE, tmp_path / "ck", GLM4_MOE.config | {"num_nextn_predict_layers": 1}
    )
    assert json.loads((path / "config.json").read_text())["num_nextn_predict_layers"] == 1
    with pytest.raises(BindError) as e:
        bind_checkpoint(CheckpointDir(path), TABLE, progress=False)
    assert "mtp" in str(e.value).lower() and "\n" not in str(e.value)
    bound = bind_checkpoint(CheckpointDir(path), TABLE, mtp=False, progress=False)
    assert [x.index for x in bound.layers] == [0, 1, 2]
