"""A JSON null in config.json means what the family's own transformers config class makes of it.

transformers 5.19+ writes ``"head_dim": null`` into the config.json of a Mixtral, Ministral or
HunYuan-dense model built without one, and its modeling code then uses hidden / heads. Other
classes refuse a null ``head_dim`` (Qwen3's strict dataclass) or build no model from it. For
every family row whose spec reads ``head_dim`` from config.json, the truth is taken from
transformers itself: its config class and model built from the null (layer 0's attention
``head_dim``, or the refusal), never from a list; specbind must read the same number, or refuse
where transformers refuses. The three families above are also bound whole from a checkpoint
their own class wrote, null and all, and every bound field equals the module's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_rows_dense import ROWS as DENSE
from family_rows_moe import ROWS as MOE
from family_table import Family
from hf_random import write_random

from specbind.core.errors import SpecbindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.layout.config import values_from_config

ROWS = [  # attention head_dim (Mamba2's head_dim is its SSM heads')
    r
    for r in (*DENSE, *MOE)
    if any(f.name == "head_dim" and f.config == "head_dim" for f in MODELS[r.model].geometry_fields)
    and "num_attention_heads" in r.config
]
WRITE_NULL = ("mixtral", "ministral", "hunyuan-dense")  # transformers 5.19+ writes the null


def _transformers_head_dim(row: Family, config: dict[str, Any]) -> int | None:
    """the first attention layer's head_dim as transformers builds the model from ``config``; None
    when its config class or model refuses the config."""
    import transformers

    try:
        cfg = getattr(transformers, row.config_class).from_dict(config)
        model = getattr(transformers, row.hf_class)(cfg)
    except Exception:  # any refusal of transformers' is what is measured
        return None
    for layer in model.get_submodule(row.layers_path):  # the first attention layer's
        for m in layer.modules():
            hd = getattr(m, "head_dim", None)
            if type(hd) is int:
                return hd
    raise AssertionError(f"{row.model}: no attention head_dim in any layer")


def _specbind_head_dim(row: Family, config: dict[str, Any]) -> int | None:
    try:
        return values_from_config(MODELS[row.model], config)["head_dim"]
    except SpecbindError as e:
        assert "\n" not in str(e) and "head_dim" in str(e), str(e)
        return None


def _unset(row: Family) -> dict[str, Any]:
    """The row's config without head_dim, hidden = heads x 6 (an even rotary width, so only
    the null can be what a class refuses)."""
    config = {k: v for k, v in row.config.items() if k != "head_dim"}
    config["hidden_size"] = config["num_attention_heads"] * 6
    return config


def _written_config(row: Family) -> dict[str, Any]:
    """config.json as the family's config class writes it from ``_unset``."""
    import transformers

    config: dict[str, Any] = json.loads(
        getattr(transformers, row.config_class)(**_unset(row)).to_json_string()
    )
    return config


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_a_null_head_dim_reads_as_the_families_transformers_class_reads_it(row: Family) -> None:
    """The truth, from transformers: a null its config class refuses is refused; a null its
    class itself writes for a head_dim not given is that absence (what specbind reads without
    the field); a null the model builds from is the model's head_dim; any other is refused."""
    import transformers

    written = _written_config(row)
    config = written | {"head_dim": None}
    absent = {k: v for k, v in written.items() if k != "head_dim"}
    got = _specbind_head_dim(row, config)
    try:
        getattr(transformers, row.config_class).from_dict(config)
    except Exception:  # the class refusing a null is what is measured
        assert got is None, f"{row.model}: transformers' config class refuses a null head_dim"
        return
    if written.get("head_dim", 0) is None:  # the class's own spelling of "not given"
        assert got is not None and got == _specbind_head_dim(row, absent), (
            f"{row.model}: its class writes null for a head_dim not given; specbind reads {got}"
        )
    want = _transformers_head_dim(row, config)
    if want is not None:
        assert got == want, f"{row.model}: transformers builds head_dim {want}, specbind {got}"
    elif row.model not in WRITE_NULL:
        assert got is None, f"{row.model}: transformers builds no model from a null head_dim"
    if row.model in WRITE_NULL:
        assert got is not None


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_an_absent_head_dim_reads_as_the_families_transformers_class_reads_it(row: Family) -> None:
    """config.json without head_dim (hidden = heads x 6): specbind reads the head_dim the
    family's own model class builds from it. Several classes default to a constant, not to
    hidden / heads (Qwen3, GLM-4, ERNIE 4.5, Seed-OSS and Helium 128; Gemma 256): a spec
    that took hidden / heads would refuse their real checkpoints that omit the field."""
    absent = {k: v for k, v in _written_config(row).items() if k != "head_dim"}
    want = _transformers_head_dim(row, absent)
    if want is None and row.model in WRITE_NULL:  # no model is built: vLLM's hidden / heads
        want = absent["hidden_size"] // absent["num_attention_heads"]
    try:
        got = values_from_config(MODELS[row.model], absent)["head_dim"]
    except SpecbindError as e:  # only a constraint the spec states may refuse the geometry
        assert "constraint" in str(e) and want is not None, f"{row.model}: {e}"
        assert f"head_dim={want}" in str(e), f"{row.model}: refused, but not at {want}: {e}"
        return
    assert got == want, f"{row.model}: transformers builds head_dim {want}, specbind reads {got}"


@pytest.mark.parametrize("name", WRITE_NULL)
def test_a_checkpoint_whose_config_its_own_class_wrote_with_a_null_head_dim_binds_as_the_module(
    name: str, tmp_path: Path
) -> None:
    """The weights written by the family's model class (head_dim given: transformers 5.23's
    Ministral and HunYuan models cannot be built from the null their config class writes),
    config.json as the config class writes it when head_dim is not given; every bound q, k, v
    and o equals the module transformers loads (with the head_dim vLLM reads the null as)."""
    import shutil

    import torch
    import transformers

    (row,) = [r for r in ROWS if r.model == name]
    unset = _unset(row)
    heads, kv = unset["num_attention_heads"], unset["num_key_value_heads"]
    given, path = tmp_path / "given", tmp_path / name
    write_random(
        getattr(transformers, row.hf_class), getattr(transformers, row.config_class),
        unset | {"head_dim": 6}, given, re.compile(row.f32),
    )  # fmt: skip
    shutil.copytree(given, path)
    (path / "config.json").write_text(json.dumps(_written_config(row)))
    assert json.loads((path / "config.json").read_text())["head_dim"] is None, "the class wrote it"
    bound = bind_checkpoint(CheckpointDir(path), MODELS[row.model], progress=False).fields()
    model = getattr(transformers, row.hf_class).from_pretrained(given, dtype=torch.float64)
    attn = model.get_submodule(row.layers_path)[1].self_attn
    for field, module, rows in (("q_proj", attn.q_proj, heads * 6), ("k_proj", attn.k_proj, kv * 6),
                                ("v_proj", attn.v_proj, kv * 6), ("o_proj", attn.o_proj, None)):  # fmt: skip
        want = module.weight.detach().numpy()
        assert rows is None or want.shape[0] == rows
        got = np.asarray(bound[f"layers.1.attention.{field}"][1]).astype(np.float64)
        assert np.array_equal(got, want), field


def test_null_is_absent_without_the_default_a_null_stands_for_is_refused_at_generate(
    tmp_path: Path,
) -> None:
    import shutil

    from specbind.core.errors import SpecError
    from specbind.generator.render import load_specs

    repo = Path(__file__).resolve().parent.parent.parent
    for d in ("blocks", "schema"):
        shutil.copytree(repo / "specs" / d, tmp_path / "specs" / d)
    (tmp_path / "specs" / "models").mkdir()
    shutil.copy(repo / "specs/models/llama.yaml", tmp_path / "specs/models/llama.yaml")
    (tmp_path / "specs/models/kid.yaml").write_text(
        "model: kid\nextends: llama\nmodel_types: [kid]\ngeometry:\n  head_dim: {default: null}\n"
    )
    with pytest.raises(SpecError) as e:
        load_specs(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "geometry.head_dim.null_is_absent" in msg, msg
    assert "`null_is_absent` needs the `default` a null then stands for" in msg
