"""The vLLM workers' bounds (tests/support/vllm_workers.py): no wall deadline for a run, a CPU
budget per load and a stall bound instead, and a stopped run names the load each worker was
in. No vLLM needed: the workers here are small Python scripts that print the progress lines
the real ones print."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest
import vllm_proofs
import vllm_venv
import vllm_workers


def _worker(tmp: Path, body: str) -> Path:
    """A worker script: ``body`` runs with ``progress`` and the SPEC's ``loads`` at hand."""
    path = tmp / "worker.py"
    path.write_text(
        "import json, sys, time\n"
        f"sys.path.insert(0, {str(vllm_venv.REPO / 'tests' / 'support')!r})\n"
        "from vllm_workers import progress\n"
        "loads = json.load(open(sys.argv[1]))['loads']\n" + textwrap.dedent(body)
    )
    return path


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers run by this interpreter instead of the vLLM venv's."""
    monkeypatch.setattr(vllm_venv, "python", lambda: Path(sys.executable))


def _specs(tmp: Path, shares: list[list[str]]) -> list[Path]:
    out = []
    for i, share in enumerate(shares):
        spec = tmp / f"w{i}.json"
        spec.write_text(json.dumps({"loads": share}))
        out.append(spec)
    return out


@pytest.mark.usefixtures("here")
def test_a_proof_run_that_hangs_in_a_load_is_stopped_naming_the_family_it_stopped_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proofs' driver (vllm_proofs._run), the stall bound at 3 s: a worker that hangs in
    its second family (using no CPU) is stopped in seconds, and the error names that family
    and format (and where the other worker was), not only an exit code."""
    worker = _worker(
        tmp_path,
        """
        for key in loads:
            for fmt in ("auto", "specbind"):
                progress(f"{key} {fmt}")
                time.sleep(60 if key == "granitemoehybrid" and fmt == "specbind" else 0.1)
        json.dump({}, open(sys.argv[2], "w"))
        """,
    )
    monkeypatch.setattr(vllm_proofs, "WORKER", worker)
    monkeypatch.setattr(vllm_workers, "STALL", 3.0)
    specs = _specs(tmp_path, [["mamba2", "granitemoehybrid", "olmo"], ["llama"]])
    t0 = time.perf_counter()
    with pytest.raises(AssertionError) as e:
        vllm_proofs._run(specs, vllm_proofs.Report())
    line = str(e.value).splitlines()[0]
    assert "no CPU" in line, line
    assert "worker 0 in load granitemoehybrid specbind" in line, line
    assert "worker 1 in load llama specbind" in line, line
    assert time.perf_counter() - t0 < 40


@pytest.mark.usefixtures("here")
def test_a_slow_run_whose_loads_each_finish_within_the_budget_is_not_stopped(
    tmp_path: Path,
) -> None:
    """Six loads of 1 s of wall time each (little CPU) under a CPU budget of 3 s per load and a
    stall bound of 3 s: the run takes longer than any one load's bounds and finishes (a slow
    machine gives a slow run, not an error)."""
    worker = _worker(
        tmp_path,
        """
        for key in loads:
            progress(key)
            time.sleep(1.0)
        json.dump({k: "done" for k in loads}, open(sys.argv[2], "w"))
        """,
    )
    specs = _specs(tmp_path, [["a", "b", "c", "d", "e", "f"]])
    results, cost = vllm_workers.run(worker, specs, "a slow run", budget=3.0, stall=3.0)
    assert results == [dict.fromkeys("abcdef", "done")]
    assert cost.wall > 6.0


@pytest.mark.usefixtures("here")
def test_a_worker_that_fails_names_the_load_it_failed_in(tmp_path: Path) -> None:
    worker = _worker(
        tmp_path,
        """
        progress("nemotron-h auto")
        raise SystemExit(3)
        """,
    )
    with pytest.raises(AssertionError, match=r"worker 0 failed \(exit 3\) in load nemotron-h auto"):
        vllm_workers.run(worker, _specs(tmp_path, [["x"]]), "the vLLM proofs", budget=30.0)


@pytest.mark.usefixtures("here")
def test_a_load_that_spins_past_its_cpu_budget_is_stopped_naming_it(tmp_path: Path) -> None:
    """A load that loops (using CPU, printing nothing) is stopped at its CPU budget, while the
    loads before it, each under it, went on: the bound is per load, not per run."""
    worker = _worker(
        tmp_path,
        """
        for key in loads:
            progress(f"{key} auto")
            end = time.process_time() + (1e9 if key == "olmoe" else 1.5)
            while time.process_time() < end:
                pass
        json.dump({}, open(sys.argv[2], "w"))
        """,
    )
    specs = _specs(tmp_path, [["llama", "qwen3", "olmoe", "olmo"]])
    with pytest.raises(AssertionError) as e:
        vllm_workers.run(worker, specs, "the vLLM token runs", budget=2.5, stall=60.0)
    line = str(e.value).splitlines()[0]
    assert "CPU" in line and "worker 0 in load olmoe auto" in line, line
