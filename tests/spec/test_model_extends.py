"""``extends:`` in a model spec: a model written as its base plus what differs
(generator/extends.py), and the one-line refusals of an extends that cannot mean anything.

Claims:
* the Mistral spec (Llama plus its model_type, vocab and synth config) parses to Llama's
  model with only its own name, doc, model_types, vocab value and synth config changed;
* a child overrides a block's symbol map, replaces a slot's block (the inherited block no
  slot names is dropped), removes an inherited key with null, appends a name rule, and an
  extends of an extends resolves through both;
* refusals, each one line naming the child's file and line: a base that is no model, a cycle,
  null for a key the base lacks, a geometry symbol the base lacks that nothing uses, and an
  error in an override (pointing at the child's line, not the base's).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from specbind.core.errors import SpecError
from specbind.generator.render import load_specs

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A specs tree of every block and schema and the Llama model alone."""
    for d in ("blocks", "schema"):
        shutil.copytree(REPO / "specs" / d, tmp_path / "specs" / d)
    (tmp_path / "specs" / "models").mkdir()
    shutil.copy(REPO / "specs/models/llama.yaml", tmp_path / "specs/models/llama.yaml")
    return tmp_path


def child(root: Path, name: str, body: str) -> None:
    (root / "specs" / "models" / f"{name}.yaml").write_text(body)


def refusal(root: Path) -> str:
    with pytest.raises(SpecError) as e:
        load_specs(root)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_mistral_is_llama_with_its_own_name_types_vocab_and_synth_config() -> None:
    models = load_specs(REPO).models
    llama, mistral = models["llama"], models["mistral"]
    assert mistral.extends == "llama" and llama.extends is None
    assert mistral.model_types == ("mistral",)
    assert {g.name: g.value for g in mistral.geometry} == llama.values() | {"vocab": 32768}
    assert mistral.synth is not None and llama.synth is not None
    assert '"MistralForCausalLM"' in mistral.synth.config_json
    same = {"pattern", "prefixes", "blocks", "slots", "globals", "names", "layer_count"}
    for f in same:
        assert getattr(mistral, f) == getattr(llama, f), f
    assert dataclasses.replace(mistral.synth, config_json=llama.synth.config_json) == llama.synth


def test_a_child_overrides_symbols_replaces_a_slot_removes_with_null_and_appends_names(
    root: Path,
) -> None:
    child(
        root,
        "kid",
        """model: kid
extends: llama
model_types: [kid]
layers:
  slots:
    attention: {blocks: [gqa_attention]}
geometry:
  head_dim: null
  heads: {value: 16}
blocks:
  - block: gqa_attention
    symbols: {hidden: hidden, heads: heads, kv_heads: kv_heads}
names:
  - from: attn.
    to: self_attn.
    why: this writer calls the attention attn
synth:
  tiny: {head_dim: null, hidden: 48}
""",
    )
    child(
        root,
        "grandkid",
        """model: grandkid
extends: kid
model_types: [grandkid]
blocks:
  - block: dense
    symbols: {intermediate: hidden}
""",
    )
    models = load_specs(root).models
    kid = models["kid"]
    assert [u.block for u in kid.blocks] == ["dense", "layer_norms", "lm_globals", "gqa_attention"]
    assert "head_dim" not in kid.values() and kid.values()["heads"] == 16
    assert [s.blocks for s in kid.slots if s.name == "attention"] == [("gqa_attention",)]
    assert [(r.source, r.to) for r in kid.names] == [("attn.", ("self_attn.",))]
    assert kid.synth is not None and dict(kid.synth.tiny)["hidden"] == 48
    assert "head_dim" not in dict(kid.synth.tiny)
    dense = next(u for u in models["grandkid"].blocks if u.block == "dense")
    assert dense.symbols == {"hidden": "hidden", "intermediate": "hidden"}
    assert models["grandkid"].values() == kid.values()


def test_a_base_that_is_no_model_is_refused_at_the_extends_line(root: Path) -> None:
    child(root, "kid", "model: kid\nmodel_types: [kid]\nextends: lama\n")
    msg = refusal(root)
    assert msg.startswith("specs/models/kid.yaml:3 at extends: extends 'lama': no such model")
    assert "models: llama" in msg


def test_a_cycle_of_extends_is_refused_naming_it(root: Path) -> None:
    child(root, "a", "model: a\nextends: b\nmodel_types: [a]\n")
    child(root, "b", "model: b\nextends: a\nmodel_types: [b]\n")
    msg = refusal(root)
    assert "extends forms a cycle: " in msg
    assert "a -> b -> a" in msg or "b -> a -> b" in msg


def test_null_for_a_key_the_base_lacks_is_refused(root: Path) -> None:
    child(root, "kid", "model: kid\nextends: llama\nmodel_types: [kid]\ngeometry:\n"
                       "  head_dims: null\n")  # fmt: skip
    msg = refusal(root)
    assert msg.startswith("specs/models/kid.yaml:5 at geometry.head_dims: ")
    assert "null removes an inherited entry, but llama has no geometry.head_dims" in msg


def test_a_misspelt_geometry_override_is_refused_naming_the_bases_symbols(root: Path) -> None:
    child(root, "kid", "model: kid\nextends: llama\nmodel_types: [kid]\ngeometry:\n"
                       "  vocab_size: {config: vocab_size, value: 64}\n")  # fmt: skip
    msg = refusal(root)
    assert msg.startswith("specs/models/kid.yaml:5 at geometry.vocab_size: ")
    assert "is not a symbol of llama, and no block, name rule or expression uses it" in msg
    assert "head_dim, heads, hidden, intermediate, kv_heads, vocab" in msg


def test_an_error_in_an_override_points_at_the_childs_line(root: Path) -> None:
    child(root, "kid", "model: kid\nextends: llama\nmodel_types: [kid]\ngeometry:\n"
                       "  vocab: {value: 64, colour: red}\n")  # fmt: skip
    msg = refusal(root)
    assert msg.startswith("specs/models/kid.yaml:5 at geometry.vocab: schema: "), msg
    assert "'colour' was unexpected" in msg


def test_a_child_claiming_its_bases_model_type_is_refused(root: Path) -> None:
    child(root, "kid", "model: kid\nextends: llama\nmodel_types: [llama]\n")
    msg = refusal(root)
    assert "at model_types: model_type 'llama' is also claimed by" in msg, msg


def test_an_inherited_computed_symbol_takes_its_value_at_the_childs_geometry(root: Path) -> None:
    base = root / "specs/models/llama.yaml"
    anchor = (
        "  head_dim:     {config: head_dim, default: hidden / heads, null_is_absent: true, "
        "value: 128}\n"
    )
    text = base.read_text()
    assert anchor in text
    base.write_text(
        text.replace(anchor, anchor + "  q_rows: {expr: heads * head_dim, value: 4096}\n")
    )
    child(root, "kid", "model: kid\nextends: llama\nmodel_types: [kid]\ngeometry:\n"
                       "  heads: {value: 64}\n")  # fmt: skip
    models = load_specs(root).models
    assert models["llama"].values()["q_rows"] == 4096
    assert models["kid"].values()["q_rows"] == 64 * 128
