"""What the bench modules share: how a model splits into the parts a row binds, which slots a
checkpoint fills with them, the interleaved timing loop and the peak-RSS reading.

Invariant: nothing here imports another bench module, so each bench module imports this one
and the command (``main``) imports them all, with no cycle.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from specbind.core.errors import SpecbindError
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.layout.slots import layout

REPO = Path(__file__).resolve().parent.parent  # the clone: the lab is never installed


def lab_env() -> dict[str, str]:
    """This environment with the clone first on ``PYTHONPATH``: a child process that imports
    ``benchmarks`` (``python -c "from benchmarks.x import ..."``) finds it from any working
    directory, as it found ``specbind.bench`` when the lab shipped inside the package."""
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def parts(table: ModelTable[Any]) -> dict[str, frozenset[str]]:
    """The blocks each comparison binds: ``attention``, every block of the slot of that name;
    ``experts``, the blocks of any slot with a tensor family (the routed experts)."""
    slots = {s.name: s for s in table.slots}
    if "attention" not in slots:
        raise SpecbindError(
            f"bench: model {table.name} has no 'attention' slot (slots: {', '.join(slots)})"
        )
    experts = frozenset(
        b
        for s in table.slots
        for b in s.blocks
        if any(r.family is not None for r in table.block(b).tensors)
    )
    if not experts:
        raise SpecbindError(f"bench: no block of model {table.name} has experts")
    return {"attention": frozenset(slots["attention"].blocks), "experts": experts}


def filled(
    ckpt: CheckpointDir, table: ModelTable[Any], kinds: Collection[str]
) -> Iterator[tuple[int, str, str]]:
    """(layer index, slot, block) of every slot the layout fills with one of ``kinds``."""
    lay = layout(table, ckpt.names(), ckpt.config)
    for index, x in lay.layers.items():
        for slot, fill in x.slots.items():
            if fill.block is not None and fill.block.name in kinds:
                yield index, slot, fill.block.name


def interleaved(
    fns: Mapping[str, Callable[[], object]], repeat: int, desc: str | None = None
) -> dict[str, list[float]]:
    """Seconds of each of ``fns`` over ``repeat`` rounds, after one warm-up round; each round
    runs every function once, in turn, so a busy spell falls on all of them alike. With
    ``desc``, a progress bar of the runs on stderr when it is a terminal."""
    from specbind.runtime.io.progress import bar

    steps = iter(bar(range((repeat + 1) * len(fns)), None if desc else False, desc or "", "run"))
    for fn in fns.values():
        next(steps, None)
        fn()  # warm-up: page in, allocate, let BLAS spin up its threads
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            next(steps, None)
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    for _ in steps:  # close the bar
        pass
    return times


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM). Not ``ru_maxrss``: Linux carries that across
    ``execve``, so a child started by a 250 MB parent would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux


_START = time.monotonic()


def say(what: str) -> None:
    """One line on stderr: what the bench starts now, after how long (a slow step is never
    silent, whether or not stderr is a terminal)."""
    print(f"bench [{time.monotonic() - _START:6.1f} s]: {what}", file=sys.stderr, flush=True)
