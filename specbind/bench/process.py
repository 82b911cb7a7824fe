"""Whole-process rows of ``specbind bench``: specbind and the baseline each as a fresh process.

Each side is a ``python -c``: the imports, the load of the attention slot of every slice layer
at (tp, rank 0), and a copy of every output byte into an arena (so both end with the rank's
weights materialised, every byte touched); specbind through its API (``bind_checkpoint``,
then the same copy; none of the bench's imports), the baseline importing only NumPy, ml_dtypes
and ``baselines/vllm_style.py`` (the layers and blocks to load are handed to it, so it pays
none of specbind's imports); timed from start to exit, interleaved (specbind, baseline,
specbind, ...), at least 5 rounds, min and median. Equal work is checked, not assumed: each
process prints how many bytes it copied out (every byte of every field, read from the map or
the computed array and written to the arena: a zero-copy view counts only once copied), and
every run of both sides must print the same count (that the bytes are equal is checked by the
in-process rows, ``equal.check_equal``, on the same slice).
This is the API in a fresh process, not the ``specbind bind`` CLI: the CLI binds every slot
of the slice (the MoE and dense MLPs, the norms, the model-level tensors) and the baseline
has hand-written loaders for the attention and MoE blocks only.
Target (issue #15): specbind / baseline <= 0.5 at tp 1 and 2, <= 0.65 at tp 8.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specbind.core.errors import SpecbindError

BASELINE = """
from pathlib import Path
import numpy as np
from specbind.bench.baselines.vllm_style import Loader
loader = Loader(Path({ckpt!r}))
out = [a for i, block in {layers!r} for a in loader.load(block, i, {tp}, 0).values()]
arena = np.empty(sum(a.nbytes for a in out), dtype=np.uint8)
pos = 0
for a in out:
    arena[pos : pos + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    pos += a.nbytes
print(pos)
"""


SPECBIND = """
from pathlib import Path
import numpy as np
from specbind.generated import MODELS
from specbind.runtime.bind import bind_checkpoint
from specbind.runtime.checkpoint import CheckpointDir
table = MODELS[{model!r}]
ck = CheckpointDir(Path({ckpt!r}))
r = bind_checkpoint(ck, table, tp_size={tp}, kinds={kinds!r}, progress=False)
out = [a for _, a in r.fields().values()]
arena = np.empty(sum(a.nbytes for a in out), dtype=np.uint8)
pos = 0
for a in out:
    arena[pos : pos + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    pos += a.nbytes
print(pos)
"""


def _process(
    method: str, ckpt: Path, tp: int, layers: list[tuple[int, str]], table: Any,
    seen: set[str],
) -> Callable[[], object]:  # fmt: skip
    if method == "specbind":  # the API and NumPy only: none of the bench's own imports
        kinds = sorted({b for _, b in layers})
        code = SPECBIND.format(model=table.name, ckpt=str(ckpt), tp=tp, kinds=kinds)
    else:  # numpy, ml_dtypes and the loader only: none of specbind's imports
        code = BASELINE.format(ckpt=str(ckpt), layers=layers, tp=tp)

    def run() -> object:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SpecbindError(f"bench {method} process failed: {proc.stderr.strip()[-300:]}")
        seen.add(proc.stdout.strip())
        return proc

    return run


def row(ckpt: Path, table: Any, tp: int, repeat: int) -> dict[str, Any]:
    from specbind.bench.common import filled, interleaved, parts
    from specbind.runtime.checkpoint import CheckpointDir

    layers = [(i, b) for i, _, b in filled(CheckpointDir(ckpt), table, parts(table)["attention"])]
    seen: dict[str, set[str]] = {"specbind": set(), "baseline": set()}
    fns = {m: _process(m, ckpt, tp, layers, table, seen[m]) for m in seen}
    t = interleaved(fns, repeat, f"attention tp {tp}, whole processes")
    if len(seen["specbind"] | seen["baseline"]) != 1:  # equal work: the same bytes, every run
        raise SpecbindError(
            f"bench tp {tp}: the whole-process sides copied out different byte counts: "
            f"specbind {sorted(seen['specbind'])}, baseline {sorted(seen['baseline'])}"
        )
    s, b = t["specbind"], t["baseline"]
    return {
        "tp": tp, "repeat": repeat,
        "specbind_s": statistics.median(s), "specbind_min_s": min(s),
        "baseline_s": statistics.median(b), "baseline_min_s": min(b),
        "ratio": statistics.median(s) / statistics.median(b), "ratio_min": min(s) / min(b),
        "bytes": int(next(iter(seen["specbind"]))),
    }  # fmt: skip


HEAD = "| tp | specbind process s (min) | baseline process s (min) | specbind / baseline (min) |"


def render(rows: list[dict[str, Any]]) -> list[str]:
    lines = [HEAD, "|" + "---:|" * (HEAD.count("|") - 1)]
    for x in rows:
        lines.append(
            f"| {x['tp']} | {x['specbind_s']:.3f} ({x['specbind_min_s']:.3f}) | "
            f"{x['baseline_s']:.3f} ({x['baseline_min_s']:.3f}) | {x['ratio']:.2f} "
            f"({x['ratio_min']:.2f}) |"
        )
    return lines
