"""``specbind bench``: specbind beside the loader a user would write, in one run, as ratios.

On a cached full-geometry checkpoint slice (3 KDA + 1 DSA layers of GLM-5.3-Flash), on a warm
page cache, for each tp (rank 0):
- specbind: bind on the NumPy backend, then copy every bound field into a preallocated arena
  (what an upload does);
- baseline: ``benchmarks/vllm_style.py`` (safe_open + get_slice per tensor, NumPy for the rest),
  then the same arena copy; its outputs are checked against specbind's before timing;
- memcpy: a plain copy of the same shard bytes out of the page cache into the arena — the
  limit for a loader that moves this rank's bytes once and computes nothing;
- peak RSS of each in its own subprocess, so peaks do not mix;
plus absorb GFLOP/s beside NumPy matmul, and the wall time of ``specbind generate`` from nothing.
Medians over ``repeat`` runs after one warm-up. Nothing here is a pass/fail gate.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from core.dtypes import within_one_bf16_ulp
from core.errors import SpecbindError
from runtime.bench_absorb import median_seconds
from runtime.binding import Array
from runtime.checkpoint import Checkpoint
from runtime.model import ModelTable
from runtime.tp import shard_view

REPO = Path(__file__).resolve().parent.parent
LAYERS = 4  # layers 0-2 are KDA, layer 3 is DSA
ATTENTION = frozenset({"kda", "dsa"})  # what the hand-written baseline loads


def cache_dir(given: str | None) -> Path:
    """Where the checkpoint slice is kept: ``given`` (``--cache``), else
    ``$XDG_CACHE_HOME/specbind/bench``, else ``~/.cache/specbind/bench`` — never the repository
    (a full-geometry slice is over 1 GB). A relative ``XDG_CACHE_HOME`` is ignored, as the XDG
    spec says."""
    if given is not None:
        if not given:
            raise SpecbindError("--cache '': an empty path; --cache names a directory")
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "specbind" / "bench"


def ensure_checkpoint(table: ModelTable[Any], cache: Path, tiny: bool) -> Path:
    from generated import SPECS_SHA256
    from runtime.synth import synth, tiny_values

    values = tiny_values(table) if tiny else {}
    key = hashlib.sha256(json.dumps([SPECS_SHA256, values, LAYERS]).encode()).hexdigest()[:12]
    ck = cache / ("glm-tiny" if tiny else "glm-full") / key
    if not (ck / "config.json").exists():
        what = "tiny" if tiny else "full-geometry"
        print(f"bench: writing a {what} checkpoint slice to {ck} (once)", file=sys.stderr)
        synth(table, ck, values, layers=LAYERS, seed=0, mtp=False)
    return ck


def warm(ckpt: Path) -> int:
    total = 0
    for f in sorted(ckpt.glob("*.safetensors")):
        with f.open("rb") as h:
            while chunk := h.read(64 << 20):
                total += len(chunk)
    return total


def _fields(result: Any) -> dict[str, Array]:
    return {
        f"{layer.index}.{k}": v
        for layer in result.layers
        for slot in layer.slots.values()
        for k, v in slot.weights.arrays().items()
    }


def specbind_load(
    ckpt: Path, table: ModelTable[Any], tp: int, rank: int, kinds: Collection[str] | None = None
) -> dict[str, Array]:
    from runtime.bind import bind_checkpoint

    ck = Checkpoint(ckpt)
    only = ATTENTION if kinds is None else kinds
    return _fields(bind_checkpoint(ck, table, tp_size=tp, tp_rank=rank, progress=False, kinds=only))


def baseline_load(ckpt: Path, table: ModelTable[Any], tp: int, rank: int) -> dict[str, Array]:
    try:
        from benchmarks.vllm_style import Loader
    except ImportError as e:
        raise SpecbindError(
            f"the baseline needs torch and the benchmarks/ folder ({e}); install the interop extra"
        ) from None
    loader = Loader(ckpt)
    out: dict[str, Array] = {}
    for i in range(LAYERS):
        fields = loader.kda(i, tp, rank) if i % 4 != 3 else loader.dsa(i, tp, rank)
        out |= {f"{i}.{k}": v for k, v in fields.items()}
    return out


def shard_views(
    ckpt: Path, table: ModelTable[Any], tp: int, rank: int, kinds: Collection[str] | None = None
) -> list[Array]:
    """This rank's bytes of every bound source tensor, as views of the memory map."""
    from core.planning import Ranks
    from runtime.layout import layout
    from runtime.model import values_from_config

    ck = Checkpoint(ckpt)
    geometry = table.make_geometry(values_from_config(table, ck.config))
    lay = layout(table, ck.names(), ck.config)
    only = ATTENTION if kinds is None else kinds
    views = []
    for index, x in lay.layers.items():
        for fill in x.slots.values():
            block = fill.block
            assert block is not None
            if block.name not in only:
                continue
            plan = block.plan(geometry, Ranks(tp, rank))
            for name, p in plan.tensors.items():
                if name not in fill.names:
                    continue
                t = ck.get(lay.split.full_name(table, index, name))
                assert t is not None
                views.append(shard_view(p, t.data))
    return views


def upload(fields: list[Array], arena: Array) -> int:
    """Copy every array into consecutive bytes of ``arena`` (row-major), as an upload would."""
    pos = 0
    for a in fields:
        n = a.nbytes
        np.copyto(arena[pos : pos + n].view(a.dtype).reshape(a.shape), a)  # [n B] -> a's shape
        pos += n
    return pos


def check_equal(ours: dict[str, Array], theirs: dict[str, Array]) -> None:
    if set(ours) != set(theirs):
        raise SpecbindError(
            f"baseline and specbind bind different fields: {sorted(set(ours) ^ set(theirs))}"
        )
    for k, a in ours.items():
        b = theirs[k]
        if a.shape != b.shape or a.dtype != b.dtype:
            raise SpecbindError(
                f"baseline {k}: {b.dtype} {b.shape} vs specbind {a.dtype} {a.shape}"
            )
        if a.tobytes() == b.tobytes():
            continue
        if not within_one_bf16_ulp(a, b):
            raise SpecbindError(f"baseline {k} differs from specbind by more than 1 BF16 ulp")


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM). Not ``ru_maxrss``: Linux carries that across
    ``execve``, so a child started by a 250 MB parent would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux


def child(method: str, ckpt: str, tp: int) -> dict[str, Any]:
    """One load + upload in this (fresh) process; report its peak RSS."""
    from generated import MODELS

    table = next(iter(MODELS.values()))
    path = Path(ckpt)
    t0 = time.perf_counter()
    if method == "memcpy":
        views = shard_views(path, table, tp, 0)
    else:
        load = specbind_load if method == "specbind" else baseline_load
        views = list(load(path, table, tp, 0).values())
    arena = np.empty(sum(v.nbytes for v in views), dtype=np.uint8)
    upload(views, arena)
    seconds = time.perf_counter() - t0
    return {"method": method, "tp": tp, "seconds": seconds, "bytes": int(arena.nbytes),
            "max_rss_mb": peak_rss_mb()}  # fmt: skip


def _rss(method: str, ckpt: Path, tp: int) -> float:
    call = f"child({method!r}, {str(ckpt)!r}, {tp})"
    code = f"import json; from runtime.bench import child; print(json.dumps({call}))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600
    )
    if proc.returncode != 0:
        raise SpecbindError(
            f"bench child {method} tp={tp} failed: {proc.stderr.strip().splitlines()[-1:]}"
        )
    return float(json.loads(proc.stdout)["max_rss_mb"])


def generate_seconds() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(REPO / "specs", Path(tmp) / "specs")
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "runtime", "generate", "--root", tmp],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SpecbindError(f"specbind generate failed in the bench: {proc.stderr.strip()}")
    return seconds


def run(
    table: ModelTable[Any], tps: list[int], repeat: int, cache: Path, tiny: bool, rss: bool = True
) -> dict[str, Any]:
    from core.planning import Ranks
    from generated import dsa
    from generated import model_glm_5_3_flash as m
    from runtime import bench_absorb
    from runtime.model import values_from_config

    ckpt = ensure_checkpoint(table, cache, tiny)
    warm(ckpt)
    rows = []
    for tp in tps:
        ours = specbind_load(ckpt, table, tp, 0)
        check_equal(ours, baseline_load(ckpt, table, tp, 0))
        views = shard_views(ckpt, table, tp, 0)
        kda_views = shard_views(ckpt, table, tp, 0, {"kda"})
        shard_bytes, kda_bytes = sum(v.nbytes for v in views), sum(v.nbytes for v in kda_views)
        arena = np.empty(max(shard_bytes, sum(a.nbytes for a in ours.values())), dtype=np.uint8)

        def timed(load: Callable[[], list[Array]], arena: Array = arena) -> float:
            return median_seconds(lambda: upload(load(), arena), repeat)

        def ours_(tp: int = tp, kinds: Collection[str] | None = None) -> list[Array]:
            return list(specbind_load(ckpt, table, tp, 0, kinds).values())

        def theirs_(tp: int = tp) -> list[Array]:
            return list(baseline_load(ckpt, table, tp, 0).values())

        def ours_kda(tp: int = tp) -> list[Array]:
            return ours_(tp, {"kda"})

        s, b = timed(ours_), timed(theirs_)
        mc, mc_kda = timed(partial(list, views)), timed(partial(list, kda_views))
        s_kda = timed(ours_kda)
        row = {
            "tp": tp, "shard_bytes": shard_bytes, "specbind_s": s, "baseline_s": b, "memcpy_s": mc,
            "specbind_over_baseline": s / b, "specbind_gbps": shard_bytes / s / 1e9,
            "memcpy_gbps": shard_bytes / mc / 1e9, "fraction_of_memcpy": mc / s,
            "kda_bytes": kda_bytes, "kda_specbind_s": s_kda, "kda_memcpy_s": mc_kda,
            "kda_fraction_of_memcpy": mc_kda / s_kda,
        }  # fmt: skip
        if rss:
            row |= {f"rss_{k}_mb": _rss(k, ckpt, tp) for k in ("specbind", "baseline", "memcpy")}
        rows.append(row)
    values = values_from_config(table, Checkpoint(ckpt).config)
    geo = m.dsa_geometry(table.make_geometry(values), Ranks())
    absorb = [
        bench_absorb.run(dsa.DsaGeometry(**{**geo.__dict__, "tp": tp}), repeat=repeat)
        for tp in tps
        if geo.H % tp == 0
    ]
    result: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "memory_gb": _memory_gb()},
        "date": time.strftime("%Y-%m-%d"),
        "checkpoint": str(ckpt),
        "repeat": repeat,
        "rows": rows,
        "absorb": absorb,
        "generate_s": generate_seconds(),
    }
    rss_rows = [r for r in rows if "rss_specbind_mb" in r]
    by_tp = {r["tp"]: r for r in rss_rows}
    if 1 in by_tp and 8 in by_tp:
        result["rss_tp8_over_tp1"] = by_tp[8]["rss_specbind_mb"] / by_tp[1]["rss_specbind_mb"]
    return result


def _memory_gb() -> float:
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)


HEAD = (
    "| tp | shard MB | specbind s | baseline s | specbind / baseline | memcpy s | of memcpy "
    "| KDA-only of memcpy | peak RSS specbind MB | baseline MB | memcpy MB |"
)
ABSORB_HEAD = (
    "| tp | heads | GFLOP | absorb GFLOP/s | matmul GFLOP/s | absorb / matmul "
    "| seed-order q_absorb GFLOP/s | specbind / seed order |"
)


def render(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        f"{r['date']}: {m['cores']} cores, {m['memory_gb']} GiB; medians of {r['repeat']} runs",
        f"checkpoint: {r['checkpoint']}",
        "",
        HEAD,
        "|" + "---:|" * (HEAD.count("|") - 1),
    ]
    for x in r["rows"]:
        rss = [
            f"{x.get(f'rss_{k}_mb', float('nan')):.0f}" for k in ("specbind", "baseline", "memcpy")
        ]
        cells = [
            f"{x['tp']}", f"{x['shard_bytes'] / 1e6:.0f}", f"{x['specbind_s']:.3f}",
            f"{x['baseline_s']:.3f}", f"{x['specbind_over_baseline']:.2f}", f"{x['memcpy_s']:.3f}",
            f"{x['fraction_of_memcpy']:.2f}", f"{x['kda_fraction_of_memcpy']:.2f}", *rss,
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", ABSORB_HEAD, "|" + "---:|" * (ABSORB_HEAD.count("|") - 1)]
    for a in r["absorb"]:
        g = a["geometry"]
        cells = [
            f"{g['tp']}", f"{g['heads_on_rank']}", f"{a['gflop']:.1f}", f"{a['absorb_gflops']:.1f}",
            f"{a['matmul_gflops']:.1f}", f"{a['absorb_over_matmul']:.2f}",
            f"{a.get('seed_order_q_absorb_gflops', float('nan')):.1f}",
            f"{a.get('specbind_over_seed_order', float('nan')):.1f}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if "rss_tp8_over_tp1" in r:
        lines.append(f"peak RSS, specbind TP=8 / TP=1: {r['rss_tp8_over_tp1']:.2f}")
    lines.append(f"specbind generate from nothing: {r['generate_s']:.2f} s")
    return "\n".join(lines)
