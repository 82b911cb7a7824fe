"""Run the vLLM venv's workers (the proofs', the token runs') with a deadline that scales with
the work: no wall deadline for the run, a bound on each load instead.

A worker prints ``specbind-progress: load <family> <format>`` (flushed) to its log before each
load (``progress``). The run is stopped only when no worker has printed such a line for
``budget`` seconds: the loads of a slow machine take longer and the run with them, but one
load that hangs (or a tp group whose peer never comes) stops it after one load's budget, and
the error names the load each worker was in (its last progress line). One load is one
family's model built once (import of vLLM included, for a worker's first): minutes on a
loaded 2-core machine, never ``budget``.

Trap: the budget is measured across the workers, not per worker: a worker waiting at a tp 2
rendezvous for its peer prints nothing while the peer works through its own loads.
"""

from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import vllm_venv

MARK = "specbind-progress: "
BUDGET = 900.0  # seconds one load may take (no worker printing a progress line meanwhile)
POLL = 0.5


def progress(what: str) -> None:
    """In a worker: say which load begins (the driver names it if the run stops there)."""
    print(f"{MARK}{what}", flush=True)


@dataclass
class Cost:
    wall: float = 0.0
    cpu: float = 0.0  # user + system seconds of the workers


def last_progress(log: Path) -> str | None:
    """The last progress line of a worker's log (what it was doing), or None."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    lines = [ln[len(MARK) :].strip() for ln in text.splitlines() if ln.startswith(MARK)]
    return lines[-1] if lines else None


def run(
    worker: Path, specs: list[Path], what: str, budget: float | None = None
) -> tuple[list[dict[str, Any]], Cost]:
    """Run ``worker SPEC OUT`` per spec, one process each; return each OUT's JSON and the cost.
    A worker that fails, or a run stalled for ``budget`` seconds (``BUDGET``), raises one
    ``AssertionError`` naming the load each worker was in and the tail of its log."""
    budget = BUDGET if budget is None else budget
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    logs = [s.with_suffix(".log") for s in specs]
    files = [p.open("w") for p in logs]
    procs = [
        vllm_venv.popen([str(worker), str(s), str(s.with_suffix(".out.json"))], s.parent, f)
        for s, f in zip(specs, files, strict=True)
    ]
    seen = [last_progress(p) for p in logs]
    moved = time.perf_counter()
    stalled = None
    while any(p.poll() is None for p in procs):
        now = [last_progress(p) for p in logs]
        if now != seen:
            seen, moved = now, time.perf_counter()
        elif time.perf_counter() - moved > budget:
            stalled = time.perf_counter() - moved
            for p in procs:
                p.kill()
            break
        time.sleep(POLL)
    for p, f in zip(procs, files, strict=True):
        p.wait()
        f.close()
    cost = Cost(wall=time.perf_counter() - t0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cost.cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if stalled is not None:
        where = "; ".join(
            f"worker {i} in load {last_progress(p) or '(none begun: importing vLLM)'}"
            for i, p in enumerate(logs)
        )
        raise AssertionError(
            f"{what}: no load finished for {stalled:.0f} s (the budget of one load is "
            f"{budget:.0f} s): stopped with {where}\n{_tail(logs)}"
        )
    results = []
    for i, (p, s, log) in enumerate(zip(procs, specs, logs, strict=True)):
        done = s.with_suffix(".out.json")
        if p.returncode != 0 or not done.exists():
            raise AssertionError(
                f"{what}: worker {i} failed (exit {p.returncode}) in load "
                f"{last_progress(log) or '(none begun)'}:\n{_tail([log])}"
            )
        results.append(json.loads(done.read_text()))
    return results, cost


def _tail(logs: list[Path]) -> str:
    out = []
    for log in logs:
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        out.append(f"--- {log.name}\n" + "\n".join(lines[-15:]))
    return "\n".join(out)
