"""The tp census: for each vLLM layout's row (and the census rows beside them), every tp in
1..8 that ``bind_for_engine`` accepts is a tp vLLM itself takes, and the reverse.

vLLM's side (tests/vllm/census_worker.py): its config checks, then its own ``get_model`` with
its default loader as the last rank of that tp (the model class its registry picks, the
constructor, every weight loader); the bind's side: ``bind_for_engine`` of the same rank. A tp
the bind accepts and vLLM refuses is a silent wrong bind waiting (the layout needs the engine's
constraint); one vLLM takes and the bind refuses is a real checkpoint wrongly refused, unless
the refusal is a constraint of ``stage: forward`` (vLLM builds and loads the model there and its
forward cannot run it: the layout cites where). The failure lists the census of every layout. Results are cached by content with the
proofs' (tests/support/vllm_census.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import vllm_venv
from vllm_rows import CENSUS_ROWS, ROWS, VllmRow

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def taken(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any]:
    why = vllm_venv.why_missing()
    if why is not None:
        pytest.skip(why)
    pytest.importorskip("transformers", exc_type=ImportError)
    import vllm_census

    return vllm_census.census((*ROWS, *CENSUS_ROWS), tmp_path_factory.mktemp("vllm-census"))


def _line(row: str, result: dict[str, Any]) -> str:
    def tps(side: str) -> str:
        return ",".join(t for t, e in sorted(result[side].items()) if e is None) or "none"

    return f"{row}: bind {tps('bind')} / vLLM {tps('engine')}"


def _forward_constraints(row: VllmRow) -> set[str]:
    """The names of the row's layout's constraints of ``stage: forward``."""
    import yaml

    path = vllm_venv.REPO / "specs" / "engines" / "vllm" / f"{row.model}.yaml"
    data = yaml.safe_load(path.read_text())
    return {c["name"] for c in data.get("constraints") or [] if c.get("stage") == "forward"}


def test_every_tp_the_bind_accepts_vllm_takes_and_every_tp_vllm_takes_the_bind_accepts(
    taken: tuple[dict[str, Any], Any], record_property: Any
) -> None:
    results, report = taken
    record_property("vllm_census", report.line())
    census = [_line(r, results[r]) for r in sorted(results)]
    record_property("census", "; ".join(census))
    bad = []
    rows = {r.id: r for r in (*ROWS, *CENSUS_ROWS)}
    for row, result in sorted(results.items()):
        forward = _forward_constraints(rows[row])
        for tp, refusal in sorted(result["bind"].items()):
            engine = result["engine"][tp]
            if (
                refusal is not None
                and engine is None
                and any(f"constraint {name} (" in refusal for name in forward)
            ):
                continue  # vLLM builds it there, and its forward cannot run it (cited)
            if (refusal is None) != (engine is None):
                said = f"vLLM: {engine}" if engine else f"bind: {refusal}"
                bad.append(f"{row} tp {tp}: bind {'accepts' if refusal is None else 'refuses'}, "
                           f"vLLM {'takes' if engine is None else 'refuses'} ({said[:240]})")  # fmt: skip
    assert not bad, "\n".join([*bad, "census (tps taken):", *census])


def test_the_census_reaches_the_constrained_cases_at_the_tps_their_constraints_decide(
    taken: tuple[dict[str, Any], Any],
) -> None:
    """The cases the layouts' constraints close: vLLM refuses them, and so does the bind,
    naming the constraint (not some other check)."""
    results, _ = taken
    for row, tp, name in [
        ("qwen2-moe-2-experts", "4", "experts_per_rank"),
        ("ernie4-5-moe-2-experts", "4", "experts_per_rank"),
        ("qwen3-moe-2-experts", "4", "experts_per_rank"),
        ("cohere", "4", "qk_norm_kv_rows"),
        ("gpt-oss", "4", "kv_heads_split"),
    ]:
        assert results[row]["engine"][tp] is not None, (row, tp)
        assert f"constraint {name}" in (results[row]["bind"][tp] or ""), (row, tp)
        assert results[row]["engine"]["2"] is None and results[row]["bind"]["2"] is None, row
