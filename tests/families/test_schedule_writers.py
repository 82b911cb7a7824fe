"""Layer schedules read from every form the writers use: each family whose spec declares a
schedule or a per-layer list, written by its own transformers class with every schedule field
left to that class (its defaults, and what it writes from them), is audited with no problem
and every tensor accounted for.

transformers 5.23's KimiLinearConfig, for one, writes ``mlp_layer_types`` and no
``first_k_dense_replace``; a schedule that read the missing count as its default 0 refused the
class's own checkpoint (``layer 0: config.json first_k_dense_replace is absent, read as 0 ...
but the layer's tensors are dense``). A count the file does hold is still cross-checked beside
the list (``tests/spec/test_layer_schedules.py``); here, a count that contradicts the list the
class wrote is refused naming the layer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from family_rows_dense import ROWS as DENSE
from family_rows_moe import ROWS as MOE
from family_table import Family
from hf_random import write_random
from kimi_model import CONFIG as KIMI_CONFIG

from specbind.api import open as open_checkpoint
from specbind.generated import MODELS

KIMI = Family(
    model="kimi-linear", hf_class="KimiLinearForCausalLM", config_class="KimiLinearConfig",
    config=KIMI_CONFIG, layer={}, globals={}, tps=(1,), semantics=(),
    f32=r".*(A_log|dt_bias|e_score_correction_bias)",
)  # fmt: skip


def _schedule_fields(model: str) -> set[str]:
    """The top-level config.json fields the spec's schedules and per-layer lists read."""
    out: set[str] = set()
    for slot in MODELS[model].slots:
        out.update(lst.config for lst in slot.all_lists())
        for rule in slot.schedule:
            for c in rule.when:
                out.update(x for x in (c.config, c.offset_config) if x is not None)
    return {f for f in out if "." not in f}


ROWS = [r for r in (*DENSE, *MOE, KIMI) if _schedule_fields(r.model)]


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_a_checkpoint_its_own_class_writes_with_its_default_schedule_audits_clean(
    row: Family, tmp_path: Path
) -> None:
    import transformers

    left = _schedule_fields(row.model)
    config = {k: v for k, v in row.config.items() if k not in left}
    config["num_hidden_layers"] = max(int(row.config.get("num_hidden_layers", 2)), 3)
    path = tmp_path / row.model
    write_random(
        getattr(transformers, row.hf_class), getattr(transformers, row.config_class), config,
        path, re.compile(row.f32),
    )  # fmt: skip
    rep = open_checkpoint(path).audit()
    assert rep["problems"] == [], (row.model, rep["problems"])
    assert rep["coverage"]["unaccounted"] == 0


def test_a_kimi_count_that_contradicts_the_list_its_class_wrote_is_refused_naming_the_layer(
    tmp_path: Path,
) -> None:
    import transformers

    config = {k: v for k, v in KIMI_CONFIG.items() if k != "first_k_dense_replace"}
    path = tmp_path / "k"
    write_random(
        transformers.KimiLinearForCausalLM, transformers.KimiLinearConfig, config, path,
        re.compile(KIMI.f32),
    )  # fmt: skip
    written = json.loads((path / "config.json").read_text())
    assert "first_k_dense_replace" not in written, "the class writes the list alone"
    assert written["mlp_layer_types"][:2] == ["dense", "sparse"]
    (path / "config.json").write_text(json.dumps(written | {"first_k_dense_replace": 2}))
    problems = open_checkpoint(path).audit()["problems"]
    assert any(
        p.startswith("layer 1: config.json first_k_dense_replace is 2") and "tensors are moe" in p
        for p in problems
    ), problems
