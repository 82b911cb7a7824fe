"""Every config field that decides a parameter's shape or presence is read and cross-checked.

For each family row (its own transformers classes, a tiny config), each field transformers'
modeling code reads is flipped (``tests/support/config_fields.py``); where the flip changes
the parameters the class builds, the field decides a parameter, and the checkpoint the class
wrote from the row's config, with only config.json's field flipped, must be refused: a spec
that neither reads the field nor holds it to a value would bind it as if nothing changed. The
table of each family's fields and the spec's handling of each (read: the spec reads it as
geometry, a flag, a group, a schedule, a count or a requirement; irrelevant: the flip builds
the same parameters) is derived here from the specs and transformers, and printed with ``-s``.
vLLM-only readings (``VLLM_ONLY``) are each held by a constraint of the family's vLLM layout.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from config_fields import VLLM_ONLY, candidates, parameters
from family_proof import write_family
from family_rows_dense import ROWS as DENSE
from family_rows_moe import ROWS as MOE
from family_table import Family

from specbind.api import open as open_checkpoint
from specbind.core.errors import SpecbindError
from specbind.generated import MODELS

ROWS = (*DENSE, *MOE)


def spec_reads(model: str) -> set[str]:
    """Every config.json field the compiled model table reads, by any construct."""
    t = MODELS[model]
    out: set[str] = set(t.flags) | {q.config for q in t.requires}
    for f in t.geometry_fields:
        out |= {f.config, *f.also} - {None}
    for g in t.layer_groups:
        out |= {g.flag, g.config} - {""}
    for s in t.slots:
        out |= {lst.config for lst in s.all_lists()}
        out |= {x for r in s.schedule for c in r.when for x in (c.config, c.offset_config) if x}
    return out | {x for x in (t.layer_count, t.mtp_count) if x}


def _refused(path: Path) -> str | None:
    """audit's first problem (or its one-line refusal); None when it accepts the file."""
    try:
        problems = open_checkpoint(path).audit()["problems"]
    except SpecbindError as e:
        return str(e)
    return problems[0] if problems else None


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_every_field_that_decides_a_parameter_is_read_and_a_flip_of_it_is_refused(
    row: Family, tmp_path: Path
) -> None:
    mt = MODELS[row.model].model_types[0]
    base = parameters(row.hf_class, row.config_class, row.config)
    ckpt = write_family(row, tmp_path / "base")
    reads = spec_reads(row.model)
    table: list[tuple[str, str]] = []
    silent: list[str] = []
    overheld: list[str] = []
    for name, value, other in candidates(mt, row.hf_class, row.config_class, row.config):
        try:
            theirs = parameters(row.hf_class, row.config_class, dict(row.config) | {name: other})
        except Exception:  # the class refuses the flip: it says nothing about the field
            continue
        path = tmp_path / name
        shutil.copytree(ckpt, path)
        cfg = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps(cfg | {name: other}))
        said = _refused(path)
        if theirs == base:
            table.append((name, "irrelevant: the flip builds the same parameters"))
            if said is not None and name in {q.config for q in MODELS[row.model].requires}:
                overheld.append(f"{name}: {said}")  # held to a value that decides nothing
            continue
        how = "read" if name in reads else "NOT READ"
        # a read field may still bind flipped where the spec's reading says what the checkpoint
        # then is (tie_word_embeddings false with no lm_head: a base model, its head absent)
        table.append((name, f"{how}; {value} -> {other}: {'refused' if said else 'bound'}"))
        if said is None and name not in reads:
            silent.append(f"{name}: {json.dumps(value)} -> {json.dumps(other)}")
        assert said is None or "\n" not in said, said
    print(f"\n{row.model}:", *(f"  {n}: {h}" for n, h in table), sep="\n")
    assert not silent, f"{row.model}: a field deciding a parameter, flipped, still binds: {silent}"
    assert not overheld, f"{row.model}: a requirement on a field that decides nothing: {overheld}"


@pytest.mark.parametrize("model", sorted(VLLM_ONLY))
def test_a_field_vllm_reads_otherwise_is_held_by_a_constraint_of_its_vllm_layout(
    model: str,
) -> None:
    from specbind.engine_select import layout_for

    names = {c[0] for c in layout_for("vllm", model).constraints}
    for field, where, constraint in VLLM_ONLY[model]:
        assert field in spec_reads(model), field
        assert constraint in names, (model, field, where)
