"""The fixed cost of a ``specbind`` process: start to first work, beside ``import numpy``.

The row times, as whole processes interleaved (A B A B ...), ``python -c "import numpy,
ml_dtypes"`` (the floor: specbind cannot start faster than the two libraries it binds with) and
``python -m specbind bind <a missing directory>``: every import ``bind`` needs, the argument
parse, the model table (its block modules are imported when first used, so none here), then a
one-line refusal at the first thing ``bind`` reads — start to first work, plus exit. Target: at
most 1.2x the floor (issue #23; 1.3x in issue #15). ``import numpy`` alone is timed beside them:
the floor is only as low as its libraries let it be, and a release that imports slowly (ml_dtypes
0.7.0 took ~0.8 s, four times numpy) lifts the floor and flatters the ratio; the row shows it.
Trap: with ``PYTHONDONTWRITEBYTECODE`` set on an editable install every start recompiles
specbind (15-20 ms); that is a property of the install, not of specbind, and the row reports
whether bytecode was cached so a slow figure can be read for what it is.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specbind.core.errors import SpecbindError

FLOOR = [sys.executable, "-c", "import numpy, ml_dtypes"]
NUMPY = [sys.executable, "-c", "import numpy"]


def _process(cmd: list[str]) -> Callable[[], object]:
    def run() -> object:
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    return run


def _bytecode_cached() -> bool:
    """Every specbind module's bytecode is cached and no older than its source."""
    from importlib.util import cache_from_source

    root = Path(__file__).resolve().parent.parent
    for src in (
        p for d in ("core", "generator", "runtime", "generated") for p in (root / d).glob("*.py")
    ):
        pyc = Path(cache_from_source(str(src)))
        if not pyc.exists() or pyc.stat().st_mtime < src.stat().st_mtime:
            return False
    return True


def run(repeat: int) -> dict[str, Any]:
    from benchmarks.common import interleaved

    with tempfile.TemporaryDirectory() as tmp:
        missing = str(Path(tmp) / "no-such-checkpoint")
        ours = [sys.executable, "-m", "specbind", "bind", missing]
        probe = subprocess.run(ours, capture_output=True, text=True)
        if probe.returncode != 2 or "no such directory" not in probe.stderr:  # not the path meant
            raise SpecbindError(f"fixed-cost probe did not refuse as expected: {probe.stderr!r}")
        times = interleaved(
            {"floor": _process(FLOOR), "specbind": _process(ours), "numpy": _process(NUMPY)},
            repeat,
        )
    f, s, n = times["floor"], times["specbind"], times["numpy"]
    return {
        "floor_cmd": " ".join(FLOOR[1:]),
        "specbind_cmd": "python -m specbind bind <missing dir>",
        "repeat": repeat,
        "floor_min_s": min(f), "floor_median_s": statistics.median(f),
        "specbind_min_s": min(s), "specbind_median_s": statistics.median(s),
        "numpy_min_s": min(n), "numpy_median_s": statistics.median(n),
        "ratio_min": min(s) / min(f),
        "ratio_median": statistics.median(s) / statistics.median(f),
        "bytecode_cached": _bytecode_cached(),
        "dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
    }  # fmt: skip


def render(r: dict[str, Any]) -> str:
    return (
        f"fixed cost (start to first work, {r['repeat']} interleaved process runs): "
        f"specbind {r['specbind_median_s']:.3f} s (min {r['specbind_min_s']:.3f}) vs "
        f"`{r['floor_cmd']}` {r['floor_median_s']:.3f} s (min {r['floor_min_s']:.3f}; "
        f"`import numpy` alone {r['numpy_median_s']:.3f} s): "
        f"ratio {r['ratio_median']:.2f} (min {r['ratio_min']:.2f}); bytecode cached: "
        f"{r['bytecode_cached']}"
    )
