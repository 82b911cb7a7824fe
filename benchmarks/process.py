"""Whole-process rows of ``python -m benchmarks``: specbind and the baseline, each a fresh
process.

Two rows per tp, both at (tp, rank 0, ep 1): **whole**, every block of the slice (attention,
the dense and MoE MLPs, the layer norms, mHC, the embedding, final norm and LM head: the row
issue #23's target reads), and **attention**, the attention slot of every slice layer alone.

Each side is a ``python -c``: the imports and the load, ending with every byte of the rank's
fields in memory the process owns (a zero-copy view of the map counts only once copied), timed
from start to exit, interleaved (specbind, baseline, specbind, ...), at least 5 rounds, min
and median.
- specbind (``SPECBIND``): its API and NumPy only, none of the bench's imports; a bind into an
  ``Arena`` (``into=``): each field made in the process's own memory or copied there once, each
  byte of the rank written once.
- baseline (``BASELINE``): NumPy, ml_dtypes and ``baselines/vllm_style.py`` loaded by its path,
  so it pays none of specbind's imports (it imports nothing of specbind, and no package
  ``__init__`` runs on the way to it); the blocks to load are handed to it; each block's
  fields go into the arena as soon as the block is loaded (as vLLM's ``weight_loader`` copies
  each loaded tensor into its parameter), then are dropped, and the map pages it read are
  released (``Loader.release``).
Memory: neither side holds two copies of the rank: the baseline's peak is its arena
(``ARENA``: one buffer per block, each field at a 64-byte aligned offset) plus one block;
specbind's is its ``Arena`` (a 6.2 GB rank at tp 1 on the full-geometry slice).

Equal work is checked, not assumed: before timing, ``check`` binds the rank with specbind and
compares each slot, as it is bound, with the baseline's load of the same block
(``equal.check_equal``: byte for byte, a computed field within rounding), one slot of each in
memory at a time; the baseline process then loads exactly the blocks compared. Each process
prints how many bytes of fields it holds in its own memory (``copied``) and its peak RSS;
every run of both sides must print the same count or the row raises.
Target (issue #23): specbind / baseline <= 0.5 at tp 1 and 2, <= 0.65 at tp 8, on the whole row.

Transparent huge pages (``thp``): each mode is a pair of sides interleaved in the same rounds.
``off``: each child process starts with ``prctl(PR_SET_THP_DISABLE, 1)`` (set between fork and
exec, and kept across exec), so neither side's memory is faulted in 2 MiB pages: NumPy advises
huge pages on its large allocations (the baseline's buffers), specbind's arena does not, and
whether the kernel has free huge pages at hand is luck. ``default``: the machine's own setting
(``/sys/kernel/mm/transparent_hugepage/enabled``, recorded in the row). The row's top-level
figures are the first mode's (``off`` unless asked otherwise); every mode's are in ``modes``.
Trap: ``prctl`` is Linux's; elsewhere ``off`` is refused in one line rather than run as the
default.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from specbind.core.errors import SpecbindError

# The baseline's arena: one buffer per block (what the block's fields need, each field at a
# 64-byte aligned offset), allocated when the block is loaded.
ARENA = """
from pathlib import Path
import numpy as np

class Arena:
    def __init__(self):
        self.buffers = []
        self.copied = 0

    def take(self, fields):
        at = [0]
        for a in fields:
            at.append(-(-(at[-1] + a.nbytes) // 64) * 64)
        buf = np.empty(at[-1], dtype=np.uint8)
        for a, x in zip(fields, at):
            np.copyto(buf[x : x + a.nbytes].view(a.dtype).reshape(a.shape), a)
            self.copied += a.nbytes
        self.buffers.append(buf)

arena = Arena()
"""

# The specbind side: a bind straight into the caller's memory (``into=Arena``): every field is
# made in the arena or copied into it once, so the process ends holding every byte of the rank
# in memory of its own. ``copied`` counts only fields the arena holds, so a field left outside
# it (a view of the map) fails the byte check.
SPECBIND = """
from pathlib import Path
from specbind.generated import MODELS
from specbind.runtime.binder.backends import Arena as Into
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

into = Into()
r = bind_checkpoint(
    CheckpointDir(Path({ckpt!r})), MODELS[{model!r}], tp_size={tp}, kinds={kinds!r},
    progress=False, into=into,
)
copied = sum(a.nbytes for _, a in r.fields().values() if into.holds(a))
"""

BASELINE = """
import importlib.util
spec = importlib.util.spec_from_file_location("vllm_style", {loader!r})
vllm_style = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vllm_style)
loader = vllm_style.Loader(Path({ckpt!r}))
for i, block in {blocks!r}:
    arena.take(list(loader.load(block, i, {tp}, 0).values()))
    loader.release()
copied = arena.copied
"""

# What each process prints: the bytes of fields it holds in its own memory, its peak RSS in MiB.
REPORT = """
hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")]
print(copied, (hwm or [0])[0] // 1024)
"""

LOADER = Path(__file__).resolve().parent / "baselines" / "vllm_style.py"


def check(
    ckpt: Path, table: Any, tp: int, rank: int = 0, ep: int = 1, ep_rank: int = 0,
    kinds: Collection[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """specbind's rank beside the baseline's, slot by slot as specbind binds it (``kinds``:
    those blocks' slots; None: every slot and the model-level tensors). Raises on the first
    difference; returns the (layer, block) pairs compared (-1: the model-level block), the
    field count and, per computed field that needed more than 1 BF16 ulp, how many elements."""
    from benchmarks.baselines.vllm_style import Loader
    from benchmarks.equal import check_equal, computed_fields
    from specbind.runtime.bind.bind import GLOBALS, SlotResult, bind_checkpoint
    from specbind.runtime.io.checkpoint import CheckpointDir

    loader = Loader(ckpt)
    blocks: list[tuple[int, str]] = []
    wide: dict[str, int] = {}
    fields = [0]

    class Compare:
        def start(self, expected: object) -> None:
            pass

        def slot(self, where: str, bound: SlotResult) -> None:
            index = GLOBALS if where == "globals" else int(where.split(".")[1])
            ours = {f"{where}.{k}": v for k, v in bound.weights.arrays().items()}
            got = loader.load(bound.block, index, tp, rank, ep, ep_rank)
            theirs = {f"{where}.{k}": v for k, v in got.items()}
            wide.update(check_equal(ours, theirs, computed_fields(table, [bound.block])))
            del got, theirs
            loader.release()
            blocks.append((index, bound.block))
            fields[0] += len(ours)

    bind_checkpoint(
        CheckpointDir(ckpt), table, tp_size=tp, tp_rank=rank, ep_size=ep, ep_rank=ep_rank,
        progress=False, kinds=kinds, sink=Compare(),
    )  # fmt: skip
    return {"blocks": blocks, "fields": fields[0], "beyond_one_ulp": wide}


THP_MODES = ("off", "default")
PR_SET_THP_DISABLE = 41  # linux/prctl.h


def thp_setting() -> str:
    """The machine's transparent-huge-page mode (the bracketed word), or "unknown"."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "unknown"
    return next((w[1:-1] for w in text.split() if w.startswith("[")), "unknown")


def _thp_off() -> None:
    """In the child, before exec: no transparent huge pages for it (inherited across exec)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE) failed")


def child_thp_disabled(mode: str) -> bool:
    """Whether a child started as the ``mode`` sides are says huge pages are disabled for it
    (``prctl(PR_GET_THP_DISABLE)``, asked in the child after its exec)."""
    code = "import ctypes; print(ctypes.CDLL(None).prctl(42, 0, 0, 0, 0))"  # PR_GET_THP_DISABLE
    pre = _thp_off if mode == "off" else None
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=pre, check=True
    )
    return out.stdout.strip() == "1"


def _process(
    code: str, method: str, seen: set[str], rss: list[int], thp: str = "default"
) -> Callable[[], object]:
    if thp not in THP_MODES:
        raise SpecbindError(f"bench: thp mode {thp!r} is not one of {', '.join(THP_MODES)}")
    if thp == "off" and not sys.platform.startswith("linux"):
        raise SpecbindError("bench: thp 'off' needs Linux (prctl PR_SET_THP_DISABLE)")
    pre = _thp_off if thp == "off" else None

    def run() -> object:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=pre
        )
        if proc.returncode != 0:
            raise SpecbindError(f"bench {method} process failed: {proc.stderr.strip()[-300:]}")
        copied, peak = proc.stdout.split()
        seen.add(copied)
        rss.append(int(peak))
        return proc

    return run


def row(
    ckpt: Path, table: Any, tp: int, repeat: int, part: str = "whole",
    thp: tuple[str, ...] = THP_MODES,
) -> dict[str, Any]:  # fmt: skip
    """``part`` ("whole": every block; "attention": the attention slot) at (tp, rank 0, ep 1):
    checked equal, then each side timed as a fresh process, under each ``thp`` mode (all of
    them interleaved in the same rounds); the top-level figures are ``thp[0]``'s."""
    from benchmarks.common import interleaved, parts

    if not thp:
        raise SpecbindError("bench: no thp mode to run the whole-process row under")
    kinds = None if part == "whole" else sorted(parts(table)[part])
    checked = check(ckpt, table, tp, kinds=kinds)
    codes = {
        "specbind": SPECBIND.format(model=table.name, ckpt=str(ckpt), tp=tp, kinds=kinds),
        "baseline": ARENA
        + BASELINE.format(loader=str(LOADER), ckpt=str(ckpt), blocks=checked["blocks"], tp=tp),
    }
    keys = [(m, mode) for mode in thp for m in codes]
    seen: dict[tuple[str, str], set[str]] = {k: set() for k in keys}
    rss: dict[tuple[str, str], list[int]] = {k: [] for k in keys}
    fns = {
        f"{m} thp {mode}": _process(codes[m] + REPORT, m, seen[m, mode], rss[m, mode], mode)
        for m, mode in keys
    }
    t = interleaved(fns, repeat, f"{part} tp {tp}, whole processes")
    counts = set().union(*seen.values())
    if len(counts) != 1:  # equal work: the same bytes, every run
        got = {f"{m} thp {mode}": sorted(v) for (m, mode), v in seen.items()}
        raise SpecbindError(
            f"bench {part} tp {tp}: the whole-process sides copied out different byte counts: {got}"
        )
    modes = {}
    for mode in thp:
        s, b = t[f"specbind thp {mode}"], t[f"baseline thp {mode}"]
        modes[mode] = {
            "specbind_s": statistics.median(s), "specbind_min_s": min(s),
            "baseline_s": statistics.median(b), "baseline_min_s": min(b),
            "ratio": statistics.median(s) / statistics.median(b), "ratio_min": min(s) / min(b),
            "rss_specbind_mb": max(rss["specbind", mode]),
            "rss_baseline_mb": max(rss["baseline", mode]),
        }  # fmt: skip
    return {
        "part": part, "tp": tp, "repeat": repeat, "fields": checked["fields"],
        **modes[thp[0]], "thp": thp[0], "modes": modes, "thp_setting": thp_setting(),
        "bytes": int(next(iter(counts))), "beyond_one_ulp": checked["beyond_one_ulp"],
    }  # fmt: skip


HEAD = (
    "| tp | THP | fields | GB each side copied | specbind process s (min) | baseline process s "
    "(min) | specbind / baseline (min) | peak RSS specbind MB | baseline MB |"
)


def render(rows: list[dict[str, Any]]) -> list[str]:
    """One line per row and THP mode (``off``: huge pages disabled in both sides' processes;
    ``default (madvise)``: the machine's own setting)."""
    lines = [HEAD, "|" + "---:|" * (HEAD.count("|") - 1)]
    for r in rows:
        modes = r.get("modes") or {r.get("thp", "default"): r}
        for mode, x in modes.items():
            shown = f"default ({r.get('thp_setting', 'unknown')})" if mode == "default" else mode
            lines.append(
                f"| {r['tp']} | {shown} | {r['fields']} | {r['bytes'] / 1e9:.3f} | "
                f"{x['specbind_s']:.3f} ({x['specbind_min_s']:.3f}) | {x['baseline_s']:.3f} "
                f"({x['baseline_min_s']:.3f}) | {x['ratio']:.2f} ({x['ratio_min']:.2f}) | "
                f"{x['rss_specbind_mb']} | {x['rss_baseline_mb']} |"
            )
    return lines
