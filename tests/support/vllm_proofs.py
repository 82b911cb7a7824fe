"""The driver of the vLLM parameter proofs: checkpoints written, results cached by content, the
rest run by two workers in the vLLM venv (tests/vllm/proof_worker.py).

``prove(rows, tmp)`` returns {(model, tp): {"auto": load, "specbind": load}}, each load either
{"ranks": [[(name, shape, dtype, sha256), ...] per tp rank], "buffers": [the same of
every buffer, per tp rank], "loaded": [every parameter as the loader left it, before vLLM's
post-processing, per tp rank]} or {"error": line}, plus a
``Report`` of what came from the cache and what ran (wall and CPU seconds).

How the work is split: two workers (the two cores CI has). Phase 0: the tp 1 loads, dealt
between them, each worker its own one-rank group. Phase 1: every tp 2 load, the workers being
its ranks 0 and 1. So vLLM is imported twice in all, whatever the number of families.

No wall deadline: each worker says which load it is in, and the run stops only when no load
has finished for one load's budget (tests/support/vllm_workers.py), naming the family there.

The cache (tests/support/vllm_cache.py) keys each (row, tp) on everything that can change its
result; a load that ended in an error is cached too (a measured refusal is a result), a worker
that died is not (nothing of its run is stored).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import vllm_cache
import vllm_venv
import vllm_workers
from free_port import free_port
from vllm_rows import VllmRow

WORKER = vllm_venv.REPO / "tests" / "vllm" / "proof_worker.py"


@dataclass
class Report:
    cached: list[str] = field(default_factory=list)  # "model tpN" read from the cache
    ran: list[str] = field(default_factory=list)
    wall: float = 0.0
    cpu: float = 0.0  # user + system seconds of the workers
    folder: Path = field(default_factory=vllm_cache.folder)
    what: str = "vLLM parameter proofs"

    def line(self) -> str:
        parts = []
        if self.cached:
            parts.append(
                f"{len(self.cached)} from the cache {self.folder} ({', '.join(self.cached)})"
            )
        if self.ran:
            parts.append(
                f"{len(self.ran)} run in {self.wall:.0f} s wall, {self.cpu:.0f} s CPU "
                f"({', '.join(self.ran)})"
            )
        return f"{self.what}: " + "; ".join(parts)


def write(row: VllmRow, path: Path, seed: int = 0) -> None:
    """The row's checkpoint, written by its own transformers classes."""
    import transformers
    from hf_random import write_random

    write_random(
        getattr(transformers, row.hf_class), getattr(transformers, row.config_class),
        dict(row.config), path, row.f32, seed,
    )  # fmt: skip
    if row.config_json:
        config = json.loads((path / "config.json").read_text())
        config.update(row.config_json)
        (path / "config.json").write_text(json.dumps(config, indent=2))


def cached_rows(
    rows: tuple[VllmRow, ...], kind: str, version: int, tmp: Path, worker: Path, what: str,
    job: Callable[[Path], dict[str, Any]],
    finish: Callable[[Path, dict[str, Any], Any], dict[str, Any]],
) -> tuple[dict[str, Any], Report]:  # fmt: skip
    """Each row's result, from the cache (keyed by ``kind``) or made now: the row's
    checkpoint written, one worker job per row (``job``: its fields beside key and ckpt) dealt
    between the vLLM workers, then ``finish(ckpt, job, engine result)`` stored."""
    report = Report(what=what)
    keys = {r.id: vllm_cache.key(r, version, kind) for r in rows}
    out = vllm_cache.hits(keys, report.cached)
    todo = [r for r in rows if r.id not in out]
    jobs: dict[str, dict[str, Any]] = {}
    for r in todo:
        write(r, tmp / r.id)
        jobs[r.id] = {"key": r.id, "ckpt": str(tmp / r.id), **job(tmp / r.id)}
    engine = vllm_workers.dealt(worker, list(jobs.values()), tmp, what, report) if todo else {}
    for r in todo:
        out[r.id] = finish(tmp / r.id, jobs[r.id], engine[r.id])
        vllm_cache.store(keys[r.id], out[r.id])
        report.ran.append(r.id)
    return out, report


def prove(
    rows: tuple[VllmRow, ...], tmp: Path
) -> tuple[dict[tuple[str, int], dict[str, Any]], Report]:
    report = Report()
    out: dict[tuple[str, int], dict[str, Any]] = {}
    keys = {(r.model, tp): vllm_cache.key(r, tp) for r in rows for tp in r.tps}
    for (model, tp), k in keys.items():
        hit = vllm_cache.load(k)
        if hit is not None:
            out[(model, tp)] = hit
            report.cached.append(f"{model} tp{tp}")
    todo = [(r, tp) for r in rows for tp in r.tps if (r.model, tp) not in out]
    if not todo:
        return out, report
    ckpts: dict[str, Path] = {}
    for r in {r.model: r for r, _ in todo}.values():
        ckpts[r.model] = tmp / r.model
        write(r, ckpts[r.model])
    out |= run_loads([(r.model, tp) for r, tp in todo], ckpts, tmp, report)
    for r, tp in todo:
        vllm_cache.store(keys[(r.model, tp)], out[(r.model, tp)])
        report.ran.append(f"{r.model} tp{tp}")
    return out, report


def run_loads(
    todo: list[tuple[str, int]], ckpts: dict[str, Path], tmp: Path, report: Report
) -> dict[tuple[str, int], dict[str, Any]]:
    """Each (name, tp) of ``todo`` loaded from its folder ``ckpts[name]`` under both loaders by
    the two workers (tp 1 dealt between them, tp 2 their ranks 0 and 1); nothing cached here."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    tp1 = [m for m, tp in todo if tp == 1]
    tp2 = [m for m, tp in todo if tp == 2]
    other = sorted({tp for _, tp in todo} - {1, 2})
    if other:
        raise AssertionError(f"the vLLM proofs run tp 1 and 2 only (two workers), not {other}")
    n = vllm_workers.WORKERS if tp2 or len(tp1) > 1 else 1
    port2 = free_port()
    specs = []
    for i in range(n):
        share = tp1[i::n]
        phases = [
            {"tp": 1, "rank": 0, "port": free_port(), "loads": _loads(share, ckpts)},
            {"tp": 2, "rank": i, "port": port2, "loads": _loads(tp2, ckpts)},
        ]
        spec = tmp / f"worker{i}.json"
        spec.write_text(json.dumps({"phases": phases}))
        specs.append(spec)
    results = _run(specs, report)
    for model in tp1:
        out[(model, 1)] = _merge([res.get("0", {}) for res in results], model, 1)
    for model in tp2:
        out[(model, 2)] = _merge([res.get("1", {}) for res in results], model, 2)
    return out


def _loads(models: list[str], ckpts: dict[str, Path]) -> list[dict[str, str]]:
    return [{"key": m, "ckpt": str(ckpts[m])} for m in models]


def _run(specs: list[Path], report: Report) -> list[dict[str, Any]]:
    """The workers, run with a budget per load (vllm_workers: no wall deadline for the run)."""
    results, cost = vllm_workers.run(WORKER, specs, "the vLLM proofs")
    report.wall, report.cpu = cost.wall, cost.cpu
    return results


def _merge(per_worker: list[dict[str, Any]], model: str, tp: int) -> dict[str, Any]:
    """One (model, tp)'s loads from the workers that ran it: tp 1 from the one worker that
    held it, tp 2 one rank per worker (rank i = worker i)."""
    held = [w[model] for w in per_worker if model in w]
    if len(held) != tp:
        raise AssertionError(f"{model} at tp {tp}: {len(held)} worker(s) reported it")
    out: dict[str, Any] = {}
    for fmt in ("auto", "specbind"):
        errors = [h[fmt]["error"] for h in held if "error" in h[fmt]]
        if errors:
            out[fmt] = {"error": errors[0]}
        else:
            out[fmt] = {
                "ranks": [h[fmt]["params"] for h in held],
                "buffers": [h[fmt]["buffers"] for h in held],
                "loaded": [h[fmt]["loaded"] for h in held],
            }
    return out
