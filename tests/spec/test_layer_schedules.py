"""Layer schedules from config.json, cross-checked against the stored layers by ``audit``, ``bind``
and the Python API: dense-first counts, sparse steps and periods, explicit index lists (0- or
1-based), per-layer lists and strings (one character per layer); and groups that follow a
config flag.

Claims:
* a synthetic checkpoint whose config.json schedule disagrees with its layers is refused by
  ``audit`` (a problem) and by ``bind`` and ``Checkpoint.bind`` (a ``BindError``), with one line
  naming the layer, the config field and its value, the block the schedule says and the block
  the layer holds; the same checkpoint with its own config binds;
* a checkpoint written to a schedule other than the spec's synthetic one (Qwen3-MoE with
  ``decoder_sparse_step`` 2 and ``mlp_only_layers``) binds: the rules are the engines', not
  one fixture's;
* an ill-typed schedule field is one ``model:`` problem naming it, never a traceback;
* a group that follows a flag is refused present where the flag is false and absent where it
  is true (naming the missing tensors), and binds where they agree;
* the generator refuses a schedule naming a block outside its slot, a last rule with
  conditions, and a synthetic config its own schedule contradicts; it reads a flag group.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specbind import api
from specbind.audit import audit
from specbind.core.errors import BindError, SpecError
from specbind.core.ir import LayerGroupRule, ScheduleCondition, ScheduleRule
from specbind.core.record import replace
from specbind.generated import MODELS
from specbind.generator import yamlio
from specbind.generator.block_spec import parse_block
from specbind.generator.model_spec import parse_model
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth, tiny_values

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Each model's synthetic checkpoint (its spec's schedule, no MTP), written once."""
    base = tmp_path_factory.mktemp("schedules")
    made: dict[str, Path] = {}

    def get(model: str) -> Path:
        if model not in made:
            table = MODELS[model]
            made[model] = base / model
            synth(table, made[model], tiny_values(table), layers=4, mtp=False, shards=1)
        return made[model]

    return get


def with_config(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of checkpoint ``src`` whose config.json ``edit`` changed."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def refused_everywhere(path: Path, table: ModelTable[Any], want: str) -> None:
    """audit lists ``want`` among its problems; bind and the API refuse with it first."""
    rep = audit(CheckpointDir(path), table, progress=False)
    assert any(want in p for p in rep["problems"]), rep["problems"]
    with pytest.raises(BindError) as e:
        bind_checkpoint(CheckpointDir(path), table, progress=False)
    assert want in str(e.value) and "\n" not in str(e.value)
    if table is MODELS[table.name]:
        with pytest.raises(BindError) as by_api:
            api.open(path, model=table.name).bind()
        assert want in str(by_api.value)


def binds(path: Path, table: ModelTable[Any]) -> None:
    rep = audit(CheckpointDir(path), table, progress=False)
    assert rep["problems"] == []
    bind_checkpoint(CheckpointDir(path), table, progress=False)


def _set(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda cfg: cfg.update(fields)


def _truncate(field: str, n: int) -> Callable[[dict[str, Any]], None]:
    return lambda cfg: cfg.update({field: cfg[field][:n]})


MISMATCHES = [
    (
        "dense_first_count",
        "deepseek-v3",
        _set(first_k_dense_replace=1),
        "layer 0: config.json first_k_dense_replace is 1 (layer 0 < 1), so its mlp is dense by "
        "the schedule, but the layer's tensors are moe",
    ),
    (
        "moe_layer_freq",
        "deepseek-v3",
        _set(moe_layer_freq=2),
        "layer 1: config.json moe_layer_freq is 2 (layer 1 is not a multiple of 2), so its mlp "
        "is dense by the schedule, but the layer's tensors are moe",
    ),
    (
        "dense_first_count_beside_a_list",
        "deepseek-v3.2",
        _set(first_k_dense_replace=3),
        "layer 2: config.json first_k_dense_replace is 3 (layer 2 < 3), so its mlp is dense",
    ),
    (
        "sparse_step",
        "qwen3-moe",
        _set(decoder_sparse_step=2),
        "layer 0: config.json decoder_sparse_step is 2 (layer 0 + 1 = 1 is not a multiple of 2), "
        "so its mlp is dense by the schedule, but the layer's tensors are moe",
    ),
    (
        "explicit_list",
        "qwen3-moe",
        _set(mlp_only_layers=[1]),
        "layer 1: config.json mlp_only_layers is [1] (layer 1 is in it), so its mlp is dense by "
        "the schedule, but the layer's tensors are moe",
    ),
    (
        "one_based_list_in_a_nested_object",
        "kimi-linear",
        _set(linear_attn_config={"kda_layers": [1, 2, 3, 4]}),
        "layer 2: config.json linear_attn_config.kda_layers is [1, 2, 3, 4] (layer 2 + 1 = 3 is "
        "in it), so its attention is kda by the schedule, but the layer's tensors are mla",
    ),
    (
        "pattern_string",
        "nemotron-h",
        _set(hybrid_override_pattern="M*E-"),
        "layer 1: config.json hybrid_override_pattern[1] is '*' (a mixer_attention mixer), but "
        "the layer's tensors are mixer_moe",
    ),
    (
        "pattern_string_too_short",
        "nemotron-h",
        _set(hybrid_override_pattern="ME*"),
        "layer 3: config.json hybrid_override_pattern has 3 characters, none for layer 3, but "
        "layer 3 is a decoder layer",
    ),
    (
        "per_layer_list_too_short",
        "deepseek-v3.2",
        _truncate("mlp_layer_types", 2),
        "layer 2: config.json mlp_layer_types has 2 entries, none for layer 2",
    ),
    (
        "a_step_of_zero",
        "qwen3-moe",
        _set(decoder_sparse_step=0),
        "model: config.json decoder_sparse_step is 0, expected a whole number of at least 1",
    ),
    (
        "a_count_that_is_not_a_number",
        "deepseek-v3",
        _set(first_k_dense_replace="3"),
        "model: config.json first_k_dense_replace is '3', expected a whole number of layers",
    ),
]


@pytest.mark.parametrize(
    ("model", "edit", "want"), [c[1:] for c in MISMATCHES], ids=[c[0] for c in MISMATCHES]
)
def test_a_config_schedule_that_disagrees_with_the_layers_is_refused_by_audit_and_bind(
    written: Callable[[str], Path],
    tmp_path: Path,
    model: str,
    edit: Callable[[dict[str, Any]], None],
    want: str,
) -> None:
    path = with_config(written(model), tmp_path / "ck", edit)
    refused_everywhere(path, MODELS[model], want)


@pytest.mark.parametrize("model", sorted({c[1] for c in MISMATCHES}))
def test_the_same_checkpoint_with_its_own_config_binds(
    written: Callable[[str], Path], model: str
) -> None:
    binds(written(model), MODELS[model])


def test_a_checkpoint_written_to_another_schedule_binds_and_its_mistakes_are_refused(
    tmp_path: Path,
) -> None:
    table = MODELS["qwen3-moe"]
    assert table.synth is not None
    cfg = json.loads(table.synth.config_json) | {"decoder_sparse_step": 2, "mlp_only_layers": [3]}
    other = replace(table, synth=replace(table.synth, config_json=json.dumps(cfg)))
    # written to this schedule by synth itself: MoE where (i + 1) % 2 == 0 but layer 3 ...
    path = tmp_path / "ck"
    summary = synth(other, path, tiny_values(table), layers=4, mtp=False, shards=1)
    assert [p["blocks"]["mlp"] for p in summary["layers"]] == ["dense", "moe", "dense", "dense"]
    binds(path, table)
    # ... and read back against the released schedule, layer 0 is the first wrong one
    wrong = with_config(path, tmp_path / "wrong", _set(decoder_sparse_step=1))
    refused_everywhere(
        wrong,
        table,
        "layer 0: config.json mlp_only_layers is [3] (layer 0 is not in it); decoder_sparse_step "
        "is 1 (layer 0 + 1 = 1 is a multiple of 1), so its mlp is moe by the schedule, but the "
        "layer's tensors are dense",
    )


def test_a_period_with_an_offset_field_is_cross_checked(
    written: Callable[[str], Path], tmp_path: Path
) -> None:
    """Jamba's form, (i - expert_layer_offset) % expert_layer_period == 0, over Qwen3-MoE."""
    table = MODELS["qwen3-moe"]
    rule = ScheduleCondition("every", "expert_layer_period", offset_config="expert_layer_offset")
    mlp = next(s for s in table.slots if s.name == "mlp")
    sched = (ScheduleRule("dense", (rule,)), ScheduleRule("moe"))
    jamba = replace(
        table, slots=tuple(replace(s, schedule=sched) if s is mlp else s for s in table.slots)
    )
    # every layer of the checkpoint is MoE: a period of 2 at offset 1 makes layer 1 dense
    path = with_config(
        written("qwen3-moe"), tmp_path / "ck", _set(expert_layer_period=2, expert_layer_offset=1)
    )
    refused_everywhere(
        path,
        jamba,
        "layer 1: config.json expert_layer_period is 2 and expert_layer_offset is 1 (layer 1 - 1 "
        "= 0 is a multiple of 2), so its mlp is dense by the schedule, but the layer's tensors "
        "are moe",
    )
    # no offset field and no default: the schedule is not decided, nothing is refused
    undecided = with_config(written("qwen3-moe"), tmp_path / "u", _set(expert_layer_period=2))
    binds(undecided, jamba)


def _flag_table(model: str, **rule: Any) -> ModelTable[Any]:
    return replace(MODELS[model], layer_groups=(LayerGroupRule("qk_norm", **rule),))


def test_a_layer_without_the_groups_its_config_flag_says_is_refused_naming_the_tensors(
    written: Callable[[str], Path], tmp_path: Path
) -> None:
    table = _flag_table("llama", flag="use_qk_norm")
    path = with_config(written("llama"), tmp_path / "ck", _set(use_qk_norm=True))
    refused_everywhere(
        path,
        table,
        "layer 0: config.json use_qk_norm is true, but the layer has no qk_norm tensors "
        "(missing ['layers.0.self_attn.q_norm.weight', 'layers.0.self_attn.k_norm.weight'])",
    )
    binds(with_config(written("llama"), tmp_path / "ok", _set(use_qk_norm=False)), table)
    # a file without the flag: cross-checked only where the spec says what that means
    binds(written("llama"), table)
    refused_everywhere(
        written("llama"),
        _flag_table("llama", flag="use_qk_norm", missing=True),
        "layer 0: config.json has no use_qk_norm (a layer then carries qk_norm), but the layer "
        "has no qk_norm tensors",
    )


def test_a_layer_with_groups_its_config_flag_turns_off_is_refused(
    written: Callable[[str], Path], tmp_path: Path
) -> None:
    table = _flag_table("qwen3-moe", flag="use_qk_norm")
    path = with_config(written("qwen3-moe"), tmp_path / "ck", _set(use_qk_norm=False))
    refused_everywhere(
        path, table, "layer 0: config.json use_qk_norm is false, but the layer carries qk_norm"
    )
    binds(with_config(written("qwen3-moe"), tmp_path / "ok", _set(use_qk_norm=True)), table)
    odd = with_config(written("qwen3-moe"), tmp_path / "odd", _set(use_qk_norm=1))
    refused_everywhere(odd, table, "config.json: use_qk_norm is 1, expected one of true, false")


# --- the generator ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def blocks() -> dict[str, Any]:
    found = {}
    for p in sorted((REPO / "specs" / "blocks").glob("*.yaml")):
        b = parse_block(yamlio.load(p, f"specs/blocks/{p.name}"))
        found[b.name] = b
    return found


def _parse(model: str, old: str, new: str, blocks: dict[str, Any]) -> Any:
    rel = f"specs/models/{model}.yaml"
    text = (REPO / rel).read_text()
    assert old in text, old
    return parse_model(yamlio.loads(text.replace(old, new, 1), rel), blocks)


QWEN_SCHEDULE = "        - block: dense\n"
GENERATE_REFUSALS = [
    (
        "qwen3-moe",
        QWEN_SCHEDULE,
        "        - block: layer_norms\n",
        "layers.slots.mlp.schedule[1].block",
        "'layer_norms' is not a block of this slot",
    ),
    (
        "qwen3-moe",
        QWEN_SCHEDULE,
        "        - block: dense\n          when: [{from: first_k_dense_replace}]\n",
        "layers.slots.mlp.schedule[1].when",
        "the last rule takes no `when`",
    ),
    (
        "deepseek-v3.2",
        "    first_k_dense_replace: 2\n",
        "    first_k_dense_replace: 1\n",
        "synth.lists.mlp_layer_types",
        "synthetic layer 1: mlp_layer_types gives mlp dense, but the schedule gives moe",
    ),
    (
        "qwen3-moe",
        "{every: decoder_sparse_step, offset: -1, default: 1}",
        "{every: decoder_sparse_step, offset: -1, default: [1]}",
        "layers.slots.mlp.schedule[0].when[1].default",
        "`every` reads a whole number",
    ),
]


@pytest.mark.parametrize(
    ("model", "old", "new", "where", "fragment"),
    GENERATE_REFUSALS,
    ids=["block_outside_the_slot", "last_rule_with_when", "synth_contradicts", "default_type"],
)
def test_the_generator_refuses_a_schedule_that_cannot_hold(
    blocks: dict[str, Any], model: str, old: str, new: str, where: str, fragment: str
) -> None:
    with pytest.raises(SpecError) as e:
        _parse(model, old, new, blocks)
    assert e.value.path == where
    assert fragment in e.value.message


def test_the_generator_reads_a_group_that_follows_a_config_flag(blocks: dict[str, Any]) -> None:
    m = _parse(
        "llama",
        "    norms: {blocks: [layer_norms]}\n",
        "    norms: {blocks: [layer_norms]}\n  groups:\n"
        "    qk_norm: {flag: use_qk_norm, missing: absent}\n",
        blocks,
    )
    assert m.layer_groups == (LayerGroupRule("qk_norm", flag="use_qk_norm", missing=False),)
