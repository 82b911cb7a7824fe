"""Every config field that decides a parameter vLLM's own model class builds is read by
specbind: per vLLM layout's row (tests/support/vllm_rows.py), each bool or whole-number field
of the checkpoint's config.json is flipped alone, vLLM's class is built from it (its registry's
class by architectures, on the meta device: tests/vllm/fields_worker.py), and where the
parameters it builds change, the checkpoint with only that config field flipped must be
refused by ``bind_for_engine`` for vLLM. A bind that accepts it would hand vLLM fields its
class does not hold: the field is one the spec neither reads nor holds to a value.

Claims, per row:
- vLLM builds the row's own config (the review starts from a build that works);
- every field whose flip changes vLLM's parameters, flipped alone in config.json, is refused:
  by ``bind_for_engine`` before vLLM builds the model, or by ``engine.fill`` at load, where the
  bound fields are not the parameters vLLM's class builds from that config (names, shapes,
  dtypes); the table says which;
- the table of every candidate field, what vLLM does with the flip (decides, the same
  parameters, refuses the config) and what specbind does, is printed with ``-s``.
The transformers side of the same review is tests/families/test_config_fields.py. Results are
cached by content with the proofs' (tests/support/vllm_fields.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import vllm_venv
from vllm_rows import ROWS

pytestmark = pytest.mark.interop

Review = tuple[dict[str, Any], Any]


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory: pytest.TempPathFactory) -> Review:
    why = vllm_venv.why_missing()
    if why is not None:
        pytest.skip(why)
    pytest.importorskip("transformers", exc_type=ImportError)
    import vllm_fields

    return vllm_fields.review(ROWS, tmp_path_factory.mktemp("vllm-fields"))


@pytest.mark.parametrize("model", [pytest.param(r.model, id=r.id) for r in ROWS])
def test_every_field_that_decides_a_vllm_parameter_flipped_alone_is_refused_by_the_bind(
    reviewed: Review, model: str, record_property: Any
) -> None:
    results, report = reviewed
    record_property("vllm_fields", report.line())
    result = results[model]
    assert result["base"] is None, f"vLLM cannot build {model}'s own config: {result['base']}"
    unflipped = result["bind"]["(unflipped)"]
    assert unflipped is None, f"{model}'s own checkpoint, unflipped, is refused: {unflipped}"
    table, bound = [], []
    for field, said in sorted(result.items()):
        if field in ("base", "bind", "built", "base_built"):
            continue
        if said is None:
            table.append(f"  {field}: vLLM builds the same parameters")
        elif said.startswith("refused"):
            table.append(f"  {field}: vLLM refuses the flip ({said[len('refused: ') :][:80]})")
        else:
            refusal = result["bind"][field]
            how = {"bind": "refuses it before vLLM builds", "fill": "refuses it at load"}
            table.append(f"  {field}: {said}; specbind "
                         f"{how[refusal.split(':')[0]] if refusal else 'binds what vLLM holds'}")  # fmt: skip
            # the harness's folder, not the flip, would be refused (its files linked outside)
            assert "outside the checkpoint" not in (refusal or ""), refusal
            if refusal is None:  # the unflipped tensors filled vLLM's class for another config
                bound.append(f"{field} ({said})")
    print(f"\n{model}:", *table, sep="\n")
    assert len(table) >= 5, f"{model}: only {len(table)} candidate fields"
    assert not bound, (
        f"{model}: flipped alone, these fields change vLLM's parameters yet bind: {bound}"
    )


def test_the_review_reaches_the_fields_that_decide_vllms_falcon_layout(reviewed: Review) -> None:
    """Falcon's shape-deciding flags are among the fields vLLM itself decides on, so the claim
    above covers them by measurement, not by a list."""
    falcon = reviewed[0]["falcon"]
    for field in ("multi_query", "new_decoder_architecture", "parallel_attn", "bias"):
        assert (falcon.get(field) or "").startswith("decides"), (field, falcon.get(field))
        assert falcon["bind"][field] is not None, field
