"""Run the vLLM venv's workers (the proofs', the token runs') with bounds that scale with the
work: no wall deadline for the run, bounds on each load instead, counted in CPU time.

A worker prints ``specbind-progress: load <family> <format>`` (flushed) to its log before each
load (``progress``). The run is stopped only when the load in progress has used more than
``budget`` seconds of the workers' CPU time (a loop), or when the workers have used no CPU and
begun no load for ``stall`` seconds (a hang: a deadlock, a tp group whose peer never comes), read
by ``patience.Watch``; a new progress line starts the next load's budget. The loads of a
loaded machine take longer in wall time and the run with them, but their CPU time does not
grow: one load is one family's model built once (vLLM's import included, for a worker's
first), seconds to a minute of CPU, never ``budget``. The error names the load each worker
was in (its last progress line).

Trap: the budget is the workers' CPU together, not one worker's: a worker waiting at a tp 2
rendezvous for its peer uses none while the peer works through its own loads.
"""

from __future__ import annotations

import gc
import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import patience
import vllm_venv
from free_port import free_port

MARK = "specbind-progress: "
BUDGET = 600.0  # CPU seconds the workers may use together in one load
STALL = patience.STALL  # wall seconds without any CPU used before the run is called hung
POLL = 0.5
WORKERS = 2  # worker processes a run starts: the two cores CI has
# An engine's KV cache, in bytes (``kv_cache_memory_bytes``; tests/vllm/token_worker.py says why
# never VLLM_CPU_KVCACHE_SPACE): one sequence of 64 tokens needs well under 1 MiB at the rows'
# geometries.
KV_BYTES = 64 << 20


def settle() -> None:
    """In a worker, after a load's objects are dropped: collect them, then freeze what is left.

    Trap: a worker's heap is millions of long-lived objects (vLLM, torch and their imports),
    and every full collection walks them all: 0.36 s a ``gc.collect()`` here, and vLLM's own
    engine shutdown calls it about nine times. Measured on six families, the collections were
    half of a proof worker's CPU and more than half of a token worker's. ``gc.freeze()`` moves
    every object alive now out of the collector's view, so a later collection walks only what
    the next load makes. Call it only once the load is dropped (``del`` and this): an object
    frozen while alive is never collected if it later ends in a reference cycle. Measured on
    six families' loads, the results unchanged: a proof worker 27 s of CPU to 8 s, a census
    worker 31 s to 7 s."""
    gc.collect()
    gc.freeze()


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
    worker: Path, specs: list[Path], what: str, budget: float | None = None,
    stall: float | None = None,
) -> tuple[list[dict[str, Any]], Cost]:  # fmt: skip
    """Run ``worker SPEC OUT`` per spec, one process each; return each OUT's JSON and the cost.
    A worker that fails, a load over ``budget`` CPU seconds (``BUDGET``) or a run that used no
    CPU for ``stall`` seconds (``STALL``) raises one ``AssertionError`` naming the load each
    worker was in and the tail of its log."""
    budget = BUDGET if budget is None else budget
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    logs = [s.with_suffix(".log") for s in specs]
    files = [p.open("w") for p in logs]
    procs = [
        vllm_venv.popen([str(worker), str(s), str(s.with_suffix(".out.json"))], s.parent, f)
        for s, f in zip(specs, files, strict=True)
    ]
    watch = patience.Watch(procs, cpu=budget, stall=STALL if stall is None else stall)
    seen = [last_progress(p) for p in logs]
    stopped = None
    while any(p.poll() is None for p in procs):
        why = watch.why_stop()
        now = [last_progress(p) for p in logs]
        if now != seen:  # a load began: its budget starts from the CPU used so far
            seen, watch.cpu = now, (watch.total or 0.0) + budget
            watch.moved = time.monotonic()  # and progress is no hang
        elif why is not None:
            stopped = why
            patience._kill(procs)  # every process of each worker's tree
            break
        time.sleep(POLL)
    for p, f in zip(procs, files, strict=True):
        p.wait()
        f.close()
    cost = Cost(wall=time.perf_counter() - t0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cost.cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if stopped is not None:
        where = "; ".join(
            f"worker {i} in load {last_progress(p) or '(none begun: importing vLLM)'}"
            for i, p in enumerate(logs)
        )
        raise AssertionError(
            f"{what}: stopped, the workers {stopped.replace('used ', 'having used ', 1)} "
            f"(the bound of one load is {budget:g} s of CPU): {where}\n{_tail(logs)}"
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


def dealt(
    worker: Path, jobs: list[dict[str, Any]], tmp: Path, what: str, report: Any
) -> dict[str, Any]:
    """``jobs`` (each with a ``key``) dealt between two workers, each its own gloo port
    (``{"port": P, "jobs": [...]}``), run (``run``), and merged: {key: result}. The cost goes
    to ``report`` (``wall``, ``cpu``)."""
    specs = []
    for i in range(min(WORKERS, len(jobs))):
        spec = tmp / f"{worker.stem}{i}.json"
        spec.write_text(json.dumps({"port": free_port(), "jobs": jobs[i::WORKERS]}))
        specs.append(spec)
    results, cost = run(worker, specs, what)
    report.wall, report.cpu = cost.wall, cost.cpu
    return {k: v for res in results for k, v in res.items()}
