"""``python -m benchmarks``: specbind beside the loader a user would write, in one run, as ratios.

On a cached full-geometry checkpoint slice (the first layers of the model, as few as hold every
block of its ``attention`` slot and an expert block of its ``mlp`` slot), on a warm page cache:

- attention, for each tp (rank 0): every layer's ``attention`` slot;
- whole slice and attention, each side a fresh process (``process``), for each tp (rank 0):
  every block of the slice (the row issue #23's target reads), then the attention slot alone;
- MoE, for each tp at ep 1 and each ep > 1 (of the same sizes) at tp 1 (ranks 0): the ``mlp``
  slot of the layers whose block has an expert family, alone (the dense MLPs of the other
  layers are written to the slice but not timed);

each row measuring, in one interleaved loop (round r runs every method once, so a busy spell
on a shared machine falls on all of them alike):
- specbind: bind on the NumPy backend straight into a preallocated arena (``into=Arena``, the
  same arena every round, reset between them): each field made in it, each view of the map
  copied in, every byte of the rank written once, where the caller wants it;
- baseline: ``baselines/vllm_style.py`` (safe_open + get_slice per tensor, merged fields
  copied into preallocated arrays, NumPy for the rest), then a copy of every field into the
  arena, as vLLM's ``weight_loader`` copies each loaded tensor into its parameter; its outputs
  are checked against specbind's before timing (byte for byte, and within 1 BF16 ulp for a
  field the spec computes: the absorbs);
- memcpy: a plain copy of the same shard bytes out of the page cache into a preallocated arena
  — the limit for a loader that moves this rank's bytes once and computes nothing — starting,
  as every loader does, with the files mapped afresh (map, copy, unmap: the kernel maps each
  page the copy touches; a column shard touches every page of its tensor); beside it the copy
  alone out of a map whose pages earlier rounds already mapped (``memcpy_mapped_s``: memory
  bandwidth alone, what no loader in a new process has);
- peak RSS of each in its own subprocess, so peaks do not mix;
plus absorb GFLOP/s beside NumPy matmul, and the wall time of ``specbind generate`` from nothing.
Medians (and minima) over ``repeat`` rounds after one warm-up. Nothing here is a pass/fail gate.

The full-geometry slice holds ``DEFAULT_SETS["experts"]`` routed experts, not the model's 288
(one MoE layer at 288 is 14.5 GB): every other shape is real. ``--set`` replaces the default.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import filled, interleaved, parts, peak_rss_mb, say
from benchmarks.equal import check_equal, computed_fields
from specbind.core.errors import SpecbindError, UsageError
from specbind.runtime.binder.backends import Arena
from specbind.runtime.binder.checks import Array
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.io.checkpoint import CheckpointDir

REPO = (Path(__file__).resolve().parent.parent / "generated").resolve().parent
# The full-geometry slice's default ``--set``: 32 routed experts at the real expert shape (one
# MoE layer of 1.66 GB, a 6.2 GB slice) fit this project's 2-core, 24 GiB machine with a
# margin; the model's 288 (14.5 GB for the layer) do not. See BENCHMARKS.md.
DEFAULT_SETS: dict[str, int] = {"experts": 32}
METHODS = ("specbind", "baseline", "memcpy")
MOST_LAYERS = 64  # the slice search gives up past this many layers


def cache_dir(given: str | None) -> Path:
    """Where the checkpoint slice is kept: ``given`` (``--cache``), else
    ``$XDG_CACHE_HOME/specbind/bench``, else ``~/.cache/specbind/bench`` — never the repository
    (a full-geometry slice is several GB). A relative ``XDG_CACHE_HOME`` is ignored, as the XDG
    spec says."""
    if given is not None:
        if not given:
            raise UsageError("--cache '': an empty path; --cache names a directory")
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "specbind" / "bench"


def copy_only(table: ModelTable[Any], kinds: Collection[str]) -> frozenset[str]:
    """The blocks among ``kinds`` that compute nothing (no ``transform`` field): what a bind
    does there is move bytes, so the memcpy limit is the right yardstick."""
    return frozenset(
        b for b in kinds if all(f.kind != "transform" for f in table.block(b).fields.values())
    )


def slice_layers(table: ModelTable[Any]) -> int:
    """The fewest leading decoder layers whose schedule holds every attention block and an
    expert block."""
    from specbind.synth import schedule

    p = parts(table)
    need = [{b} for b in sorted(p["attention"])] + [set(p["experts"])]
    seen: set[str] = set()
    for plan in schedule(table, MOST_LAYERS, mtp=False):
        seen |= set(plan.blocks.values())
        if all(seen & n for n in need):
            return plan.index + 1
    raise SpecbindError(f"bench: the first {MOST_LAYERS} layers do not hold every block it needs")


def slice_values(table: ModelTable[Any], tiny: bool, sets: Mapping[str, int]) -> dict[str, int]:
    """The geometry the slice is written at: the spec's tiny or real one, with ``sets``."""
    from specbind.runtime.layout.config import checked_values
    from specbind.synth import tiny_values

    base = tiny_values(table) if tiny else table.default_values()
    return checked_values(table, base, sets)


def ensure_checkpoint(
    table: ModelTable[Any], cache: Path, tiny: bool, sets: Mapping[str, int] | None = None
) -> tuple[Path, float | None]:
    """The cached slice (written now if absent) and the seconds writing it took, if it was."""
    from specbind.generated import SPECS_SHA256
    from specbind.synth import synth

    values = slice_values(table, tiny, sets or {})
    layers = slice_layers(table)
    key = hashlib.sha256(json.dumps([SPECS_SHA256, values, layers]).encode()).hexdigest()[:12]
    ck = cache / f"{table.name}-{'tiny' if tiny else 'full'}" / key
    if (ck / "config.json").exists():
        return ck, None
    what = "tiny" if tiny else "full-geometry"
    shown = ", ".join(f"{k}={v}" for k, v in sorted((sets or {}).items()))
    print(
        f"bench: writing a {what} {layers}-layer checkpoint slice"
        + (f" ({shown})" if shown else "")
        + f" to {ck} (once)",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    synth(table, ck, values, layers=layers, seed=0, mtp=False, progress=None)
    return ck, time.perf_counter() - t0


def warm(ckpt: Path) -> int:
    total = 0
    for f in sorted(ckpt.glob("*.safetensors")):
        with f.open("rb") as h:
            while chunk := h.read(64 << 20):
                total += len(chunk)
    return total


def specbind_load(
    ckpt: Path,
    table: ModelTable[Any],
    tp: int,
    rank: int,
    kinds: Collection[str],
    ep: int = 1,
    ep_rank: int = 0,
    into: Any = None,
) -> dict[str, Array]:
    from specbind.runtime.bind.bind import bind_checkpoint

    result = bind_checkpoint(
        CheckpointDir(ckpt), table, tp_size=tp, tp_rank=rank, ep_size=ep, ep_rank=ep_rank,
        progress=False, kinds=kinds, into=into,
    )  # fmt: skip
    return {
        f"{layer.index}.{name}.{k}": v
        for layer in result.layers
        for name, slot in layer.slots.items()
        for k, v in slot.weights.arrays().items()
    }


def baseline_load(
    ckpt: Path,
    table: ModelTable[Any],
    tp: int,
    rank: int,
    kinds: Collection[str],
    ep: int = 1,
    ep_rank: int = 0,
) -> dict[str, Array]:
    from benchmarks.baselines.vllm_style import Loader

    loader = Loader(ckpt)
    out: dict[str, Array] = {}
    for index, slot, block in filled(CheckpointDir(ckpt), table, kinds):
        fields = loader.load(block, index, tp, rank, ep, ep_rank)
        out |= {f"{index}.{slot}.{k}": v for k, v in fields.items()}
    return out


def shard_views(
    ckpt: Path,
    table: ModelTable[Any],
    tp: int,
    rank: int,
    kinds: Collection[str],
    ep: int = 1,
    ep_rank: int = 0,
) -> list[Array]:
    """This rank's bytes of every bound source tensor, as views of the memory map."""
    return mapped(ckpt, shard_reads(ckpt, table, tp, rank, kinds, ep, ep_rank))[0]


Read = tuple[str, int, int, Any, str]  # shard file, file offset, bytes, plan, stored dtype


def shard_reads(
    ckpt: Path,
    table: ModelTable[Any],
    tp: int,
    rank: int,
    kinds: Collection[str],
    ep: int = 1,
    ep_rank: int = 0,
) -> list[Read]:
    """This rank's share of every bound source tensor as (shard file, the tensor's file offset,
    its bytes, its plan, its stored dtype): what a reader maps and slices."""
    from specbind.core.planning import Ranks
    from specbind.runtime.layout.config import values_from_config
    from specbind.runtime.layout.slots import layout

    ck = CheckpointDir(ckpt)
    geometry = table.make_geometry(values_from_config(table, ck.config))
    lay = layout(table, ck.names(), ck.config)
    reads: list[Read] = []
    for index, x in lay.layers.items():
        for fill in x.slots.values():
            block = fill.block
            assert block is not None
            if block.name not in kinds:
                continue
            plan = block.plan(geometry, Ranks(tp, rank, ep, ep_rank))  # this ep rank's members
            for name, p in plan.tensors.items():
                if name not in fill.names:
                    continue
                full = lay.split.full_name(table, index, name)
                t = ck.get(full)
                assert t is not None and t.span is not None
                reads.append((ck.file_of(full) or "", t.span.offset, len(t.data), p, t.dtype))
    return reads


def mapped(ckpt: Path, reads: list[Read]) -> tuple[list[Array], list[Any]]:
    """Each read's share as a view of its shard file, every file mapped once, and the maps."""
    import mmap

    from specbind.runtime.binder.tp import shard_view

    maps: dict[str, mmap.mmap] = {}
    views = []
    for fn, off, n, plan, dtype in reads:
        m = maps.get(fn)
        if m is None:
            with open(ckpt / fn, "rb") as f:
                m = maps[fn] = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        views.append(shard_view(plan, np.frombuffer(m, np.uint8, n, off).data, dtype))
    return views, list(maps.values())


def memcpy_fresh(ckpt: Path, reads: list[Read], arena: Array) -> int:
    """Map each shard file afresh, copy this rank's bytes of every tensor into ``arena`` (as
    ``upload`` lays them), unmap: what moving the rank's bytes out of the page cache costs a
    process that has not mapped them yet."""
    views, maps = mapped(ckpt, reads)
    try:
        return upload(views, arena)
    finally:
        del views
        for m in maps:
            m.close()


def upload(fields: list[Array], arena: Array) -> int:
    """Copy every array into consecutive bytes of ``arena`` (row-major), as an upload would."""
    pos = 0
    for a in fields:
        n = a.nbytes
        np.copyto(arena[pos : pos + n].view(a.dtype).reshape(a.shape), a)  # [n B] -> a's shape
        pos += n
    return pos


def child(method: str, ckpt: str, tp: int, part: str = "attention", ep: int = 1) -> dict[str, Any]:
    """One load + upload of ``part`` at (tp, ep) rank 0 in this (fresh) process; report its
    peak RSS."""
    from specbind.api import model_table

    table = model_table(None, "--model", CheckpointDir(Path(ckpt)).config)  # as the CLI picks
    kinds = parts(table)[part]
    path = Path(ckpt)
    t0 = time.perf_counter()
    if method == "specbind":  # bound straight into its arena, as the timed rows bind
        fields = specbind_load(path, table, tp, 0, kinds, ep, into=Arena())
        nbytes = sum(a.nbytes for a in fields.values())
    else:
        if method == "memcpy":
            views = shard_views(path, table, tp, 0, kinds, ep)
        else:
            views = list(baseline_load(path, table, tp, 0, kinds, ep).values())
        arena = np.empty(sum(v.nbytes for v in views), dtype=np.uint8)
        nbytes = upload(views, arena)
    seconds = time.perf_counter() - t0
    return {"method": method, "part": part, "tp": tp, "ep": ep, "seconds": seconds,
            "bytes": nbytes, "max_rss_mb": peak_rss_mb()}  # fmt: skip


def _rss(method: str, ckpt: Path, tp: int, part: str = "attention", ep: int = 1) -> float:
    call = f"child({method!r}, {str(ckpt)!r}, {tp}, {part!r}, {ep})"
    code = f"import json; from benchmarks.main import child; print(json.dumps({call}))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600
    )
    if proc.returncode != 0:
        raise SpecbindError(
            f"bench child {method} {part} tp={tp} ep={ep} failed: "
            f"{proc.stderr.strip().splitlines()[-1:]}"
        )
    return float(json.loads(proc.stdout)["max_rss_mb"])


def generate_seconds() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(REPO / "specs", Path(tmp) / "specs")
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "specbind", "generate", "--root", tmp],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SpecbindError(f"specbind generate failed in the bench: {proc.stderr.strip()}")
    return seconds


def measure(
    ckpt: Path,
    table: ModelTable[Any],
    part: str,
    tp: int,
    ep: int,
    repeat: int,
) -> dict[str, Any]:
    """One row: ``part`` at (tp, ep), rank 0 — checked against the baseline, then timed."""
    kinds = parts(table)[part]
    ours = specbind_load(ckpt, table, tp, 0, kinds, ep)
    theirs = baseline_load(ckpt, table, tp, 0, kinds, ep)
    wide = check_equal(ours, theirs, computed_fields(table, kinds))
    del theirs
    reads = shard_reads(ckpt, table, tp, 0, kinds, ep)
    views = mapped(ckpt, reads)[0]
    shard_bytes = sum(v.nbytes for v in views)
    arena = np.zeros(max(shard_bytes, sum(a.nbytes for a in ours.values())), dtype=np.uint8)
    del ours
    ours_arena = Arena()  # specbind's destination: pages faulted in by the warm-up round

    def up(load: Callable[[], list[Array]]) -> Callable[[], int]:
        return lambda: upload(load(), arena)

    def load(fn: Any, only: Collection[str] = kinds) -> Callable[[], list[Array]]:
        return lambda: list(fn(ckpt, table, tp, 0, only, ep).values())

    def bind_into(only: Collection[str] = kinds) -> Callable[[], int]:
        def run() -> int:
            ours_arena.reset()  # the last round's fields were dropped: the same bytes again
            fields = specbind_load(ckpt, table, tp, 0, only, ep, into=ours_arena)
            if not all(ours_arena.holds(a) for a in fields.values()):
                raise SpecbindError("bench: a field bound into the arena lies outside it")
            return sum(a.nbytes for a in fields.values())

        return run

    fns = {
        "specbind": bind_into(),
        "baseline": up(load(baseline_load)),
        "memcpy": lambda: memcpy_fresh(ckpt, reads, arena),
        "memcpy_mapped": up(partial(list, views)),
    }
    cheap = copy_only(table, kinds)
    cheap_views: list[Array] = []
    if cheap and cheap != kinds:  # the blocks that only move bytes, beside their own limit
        cheap_reads = shard_reads(ckpt, table, tp, 0, cheap, ep)
        cheap_views = mapped(ckpt, cheap_reads)[0]
        fns |= {
            "copy_only_specbind": bind_into(cheap),
            "copy_only_memcpy": lambda: memcpy_fresh(ckpt, cheap_reads, arena),
        }
    times = interleaved(fns, repeat)
    med = {k: statistics.median(v) for k, v in times.items()}
    s, b, mc = med["specbind"], med["baseline"], med["memcpy"]
    row: dict[str, Any] = {
        "part": part, "tp": tp, "ep": ep, "blocks": sorted(kinds), "shard_bytes": shard_bytes,
        "specbind_s": s, "baseline_s": b, "memcpy_s": mc,
        "specbind_min_s": min(times["specbind"]), "baseline_min_s": min(times["baseline"]),
        "memcpy_min_s": min(times["memcpy"]),
        "memcpy_mapped_s": med["memcpy_mapped"],
        "fraction_of_mapped_memcpy": med["memcpy_mapped"] / s,
        "specbind_over_baseline": s / b,
        "specbind_over_baseline_min": min(times["specbind"]) / min(times["baseline"]),
        "specbind_gbps": shard_bytes / s / 1e9, "memcpy_gbps": shard_bytes / mc / 1e9,
        "fraction_of_memcpy": mc / s,
        "beyond_one_ulp": wide,  # elements of a computed field past 1 ulp (within NOISE)
    }  # fmt: skip
    if cheap_views:
        row |= {
            "copy_only_blocks": sorted(cheap),
            "copy_only_bytes": sum(v.nbytes for v in cheap_views),
            "copy_only_specbind_s": med["copy_only_specbind"],
            "copy_only_memcpy_s": med["copy_only_memcpy"],
            "copy_only_fraction_of_memcpy": med["copy_only_memcpy"] / med["copy_only_specbind"],
        }
    if part == "experts":
        members = _members(ckpt, table, kinds, ep)
        row |= {"experts": members[0], "experts_on_rank": members[1]}
    return row


def add_rss(ckpt: Path, rows: list[dict[str, Any]]) -> None:
    """Each row's peak RSS for each method, each in its own fresh subprocess, one at a time.
    (Side by side changes no figure, but on this 2-core machine it saved no time either.)"""
    for row in rows:
        for k in METHODS:
            row[f"rss_{k}_mb"] = _rss(k, ckpt, row["tp"], row["part"], row["ep"])


def _members(
    ckpt: Path, table: ModelTable[Any], kinds: Collection[str], ep: int
) -> tuple[int, int]:
    """(the largest family size among ``kinds``, how many of its members ep rank 0 holds)."""
    from specbind.core.planning import member_range
    from specbind.runtime.layout.config import values_from_config

    geometry = table.make_geometry(values_from_config(table, CheckpointDir(ckpt).config))
    count = max(c for b in sorted(kinds) for c in table.block(b).counts(geometry).values())
    return count, len(member_range(count, ep, 0))


def absorb_rows(
    table: ModelTable[Any], values: Mapping[str, int], tps: list[int], repeat: int
) -> list[dict[str, Any]]:
    """The absorb rows of every attention block that contracts, at each tp its geometry
    allows: the block's generated module and its geometry come from the model's own table."""
    import importlib

    from benchmarks import absorb as bench_absorb
    from specbind.core.errors import GeometryError
    from specbind.core.planning import Ranks

    try:
        from benchmarks.baselines.seed_order import SEED_ORDER
    except ImportError:  # an installed wheel has no baseline folder: no seed-order column
        SEED_ORDER = {}
    model = importlib.import_module(table.make_geometry.__module__)
    rows = []
    for name in sorted(parts(table)["attention"]):
        block = importlib.import_module(f"specbind.generated.{name}")
        geo = getattr(model, f"{name}_geometry")(table.make_geometry(dict(values)), Ranks())
        for tp in tps:
            g = type(geo)(**{**geo.__dict__, "tp": tp})
            try:
                block.check_constraints(g)
                block.plan(g, 0)
            except GeometryError:
                continue  # this tp does not split the block's units
            row = bench_absorb.run(block, g, repeat=repeat, seed=SEED_ORDER.get(name))
            if row is not None:
                rows.append(row)
    return rows


def process_repeats(repeat: int, quick: bool = False) -> int:
    """Rounds of each whole-process row (start to exit, fixed cost): at least 5, so a min and
    a median mean something on a shared machine; one with ``quick`` (a smoke run: every figure
    once, none worth quoting)."""
    return 1 if quick else max(5, repeat)


def run(
    table: ModelTable[Any],
    tps: list[int],
    repeat: int,
    cache: Path,
    tiny: bool,
    rss: bool = True,
    overrides: Mapping[str, int] | None = None,
    ranks: Collection[int] = (),
    loaders: bool = False,
    quick: bool = False,
    thp: tuple[str, ...] = ("off", "default"),
) -> dict[str, Any]:
    """Every row at every size in ``tps``: attention at each tp; MoE at each tp (ep 1) and at
    each ep > 1 of the same sizes (tp 1). ``overrides`` (``--set``) go over ``DEFAULT_SETS``
    for the full-geometry slice (over nothing for ``tiny``); the checkpoint's config.json
    carries them to the bind. Each row says on stderr what it measures as it starts."""
    from benchmarks import fixed as bench_fixed
    from benchmarks import process as bench_process
    from benchmarks import ranks as bench_ranks
    from specbind.runtime.layout.config import values_from_config

    sets = ({} if tiny else dict(DEFAULT_SETS)) | dict(overrides or {})
    ckpt, synth_s = ensure_checkpoint(table, cache, tiny, sets)
    warm(ckpt)
    rows = []
    for tp in tps:
        say(f"attention tp {tp}: specbind, the vLLM-style loader, memcpy")
        rows.append(measure(ckpt, table, "attention", tp, 1, repeat))
    experts = _members(ckpt, table, parts(table)["experts"], 1)[0]
    sizes = [(tp, 1) for tp in tps] + [(1, ep) for ep in tps if ep > 1]
    skipped = [f"ep {ep}: more ranks than the {experts} experts" for _, ep in sizes if ep > experts]
    for note in skipped:
        say(f"MoE {note}; skipped")
    moe_rows = []
    for tp, ep in sizes:
        if ep <= experts:
            say(f"MoE tp {tp} x ep {ep}: specbind, the vLLM-style loader, memcpy")
            moe_rows.append(measure(ckpt, table, "experts", tp, ep, repeat))
    n = process_repeats(repeat, quick)
    whole_rows, process_rows = [], []
    for tp in tps:
        say(f"whole slice tp {tp}, whole processes: specbind, the vLLM-style loader")
        whole_rows.append(bench_process.row(ckpt, table, tp, n, "whole", thp))
    for tp in tps:
        say(f"attention tp {tp}, whole processes: specbind, the vLLM-style loader")
        process_rows.append(bench_process.row(ckpt, table, tp, n, "attention", thp))
    if rss:
        say("peak RSS, each method in its own process")
        add_rss(ckpt, rows + moe_rows)
    values = values_from_config(table, CheckpointDir(ckpt).config)
    say("absorbs beside NumPy matmul")
    absorb = absorb_rows(table, values, tps, repeat)
    limits = limit_rows(ckpt, table, cache, tps, experts, repeat)
    say("specbind generate from nothing")
    generate_s = generate_seconds()
    ranks_rows = []
    for n_ranks in ranks:
        say(f"{n_ranks} ranks on this host, concurrent and one after another")
        ranks_rows.append(bench_ranks.ranks_row(ckpt, n_ranks, repeat))
    if loaders:
        say("the fast loaders, tp 1, every tensor")
    loader_rows = bench_ranks.loader_rows(ckpt, table, repeat) if loaders else None
    say("fixed cost: start to first work beside import numpy, ml_dtypes")
    fixed = bench_fixed.run(n)
    result: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "memory_gb": _memory_gb()},
        "date": time.strftime("%Y-%m-%d"),
        "checkpoint": str(ckpt),
        "checkpoint_bytes": sum(f.stat().st_size for f in ckpt.glob("*.safetensors")),
        "layers": slice_layers(table),
        "sets": sets,
        "synth_s": synth_s,
        "repeat": repeat,
        "rows": rows,
        "moe_rows": moe_rows,
        "whole_rows": whole_rows,
        "process_rows": process_rows,
        "moe_skipped": skipped,
        "absorb": absorb,
        "generate_s": generate_s,
        "ranks": ranks_rows,
        "loaders": loader_rows,
        "fixed_cost": fixed,
        "limits": limits,
        "quick": quick,
    }
    by_tp = {r["tp"]: r for r in rows if "rss_specbind_mb" in r}
    if 1 in by_tp and 8 in by_tp:
        result["rss_tp8_over_tp1"] = by_tp[8]["rss_specbind_mb"] / by_tp[1]["rss_specbind_mb"]
    by_size = {(r["tp"], r["ep"]): r for r in moe_rows if "rss_specbind_mb" in r}
    if (1, 1) in by_size:
        one = by_size[(1, 1)]
        result["moe_rss_over_tp1"] = {
            f"tp{tp}_ep{ep}": {k: r[f"rss_{k}_mb"] / one[f"rss_{k}_mb"] for k in METHODS}
            for (tp, ep), r in by_size.items()
            if (tp, ep) != (1, 1)
        }
    return result


def limits_only(
    table: ModelTable[Any], tps: list[int], repeat: int, cache: Path, tiny: bool,
    overrides: Mapping[str, int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``bench --limits``: the slice, then ``limit_rows`` only."""
    sets = ({} if tiny else dict(DEFAULT_SETS)) | dict(overrides or {})
    ckpt, synth_s = ensure_checkpoint(table, cache, tiny, sets)
    warm(ckpt)
    experts = _members(ckpt, table, parts(table)["experts"], 1)[0]
    return {
        "machine": {"cores": os.cpu_count(), "memory_gb": _memory_gb()},
        "load_before": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "checkpoint": str(ckpt),
        "sets": sets,
        "synth_s": synth_s,
        "repeat": repeat,
        "limits": limit_rows(ckpt, table, cache, tps, experts, repeat),
        "load_after": os.getloadavg(),
    }


def whole_only(
    table: ModelTable[Any], tps: list[int], repeat: int, cache: Path, tiny: bool,
    overrides: Mapping[str, int] | None = None, thp: tuple[str, ...] = ("off", "default"),
    quick: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """``--whole``: the slice, then the whole-slice whole-process row at each tp only, under
    each ``thp`` mode (``process.row``), with the load average before and after."""
    from benchmarks import process as bench_process

    sets = ({} if tiny else dict(DEFAULT_SETS)) | dict(overrides or {})
    ckpt, synth_s = ensure_checkpoint(table, cache, tiny, sets)
    warm(ckpt)
    load = os.getloadavg()
    n = process_repeats(repeat, quick)
    rows = []
    for tp in tps:
        say(f"whole slice tp {tp}, whole processes, THP {' and '.join(thp)}")
        rows.append(bench_process.row(ckpt, table, tp, n, "whole", thp))
    return {
        "machine": {"cores": os.cpu_count(), "memory_gb": _memory_gb()},
        "load_before": load,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "checkpoint": str(ckpt),
        "sets": sets,
        "synth_s": synth_s,
        "repeat": n,
        "whole_rows": rows,
        "load_after": os.getloadavg(),
    }


def render_whole(r: dict[str, Any]) -> str:
    from benchmarks import process as bench_process

    m = r["machine"]
    head = (
        f"{r['date']}: {m['cores']} cores, {m['memory_gb']} GiB, load average "
        f"{r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after; medians (min) of "
        f"{r['repeat']} interleaved rounds; checkpoint {r['checkpoint']}; THP off: "
        "prctl(PR_SET_THP_DISABLE) in both sides' processes, default: the machine's setting"
    )
    return "\n".join([head, "", *bench_process.render(r["whole_rows"])])


def render_limits(r: dict[str, Any]) -> str:
    from benchmarks import limits

    m = r["machine"]
    head = (
        f"{r['date']}: {m['cores']} cores, {m['memory_gb']} GiB, load average "
        f"{r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after; {r['repeat']} "
        f"interleaved rounds; checkpoint {r['checkpoint']}"
    )
    return "\n".join([head, *limits.render(r["limits"])])


def limit_rows(
    ckpt: Path, table: ModelTable[Any], cache: Path, tps: list[int], experts: int, repeat: int
) -> dict[str, Any]:
    """``limits``' rows: a rank in memory at each tp > 1 (ep = tp where the experts split that
    far, else 1), ``--out`` and runai at the last of them, planning on the sparse whole model."""
    from benchmarks import limits

    sizes = [(tp, tp if tp <= experts else 1) for tp in tps if tp > 1] or [(1, 1)]
    whole = table.real_layers + table.real_mtp
    return limits.run(ckpt, table, cache, sizes, sizes[-1], whole, repeat)


def _memory_gb() -> float:
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)


HEAD = (
    "| tp | shard MB | specbind s | baseline s | specbind / baseline (min) | memcpy s "
    "| memcpy speed share | {cheap} memcpy speed share | peak RSS specbind MB | baseline MB "
    "| memcpy MB |"
)
MOE_HEAD = (
    "| tp | ep | experts on rank | shard MB | specbind s (min) | baseline s (min) "
    "| specbind / baseline (min) | memcpy s | memcpy speed share | memcpy, pages mapped, s "
    "| its share | peak RSS specbind MB | baseline MB | memcpy MB |"
)
ABSORB_HEAD = (
    "| block | tp | heads | GFLOP | absorb GFLOP/s | matmul GFLOP/s | absorb / matmul "
    "| seed-order q_absorb GFLOP/s | specbind / seed order |"
)


def _table_head(head: str) -> list[str]:
    return [head, "|" + "---:|" * (head.count("|") - 1)]


def _rss_cells(x: Mapping[str, Any]) -> list[str]:
    return [f"{x.get(f'rss_{k}_mb', float('nan')):.0f}" for k in METHODS]


def render(r: dict[str, Any]) -> str:
    m = r["machine"]
    sets = ", ".join(f"{k}={v}" for k, v in sorted(r.get("sets", {}).items())) or "none"
    lines = [
        f"{r['date']}: {m['cores']} cores, {m['memory_gb']} GiB; medians (and minima) of "
        f"{r['repeat']} interleaved rounds",
        f"checkpoint: {r['checkpoint']} ({r['layers']} layers, "
        f"{r['checkpoint_bytes'] / 1e9:.2f} GB; --set {sets})",
        "",
        "attention:",
        "",
    ]
    cheap = "/".join(r["rows"][0].get("copy_only_blocks", ["copy-only"])) if r["rows"] else ""
    lines += _table_head(HEAD.format(cheap=cheap + "-only"))
    for x in r["rows"]:
        cells = [
            f"{x['tp']}", f"{x['shard_bytes'] / 1e6:.0f}", f"{x['specbind_s']:.3f}",
            f"{x['baseline_s']:.3f}",
            f"{x['specbind_over_baseline']:.2f} ({x['specbind_over_baseline_min']:.2f})",
            f"{x['memcpy_s']:.3f}", f"{x['fraction_of_memcpy']:.2f}",
            f"{x.get('copy_only_fraction_of_memcpy', float('nan')):.2f}", *_rss_cells(x),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    from benchmarks import process as bench_process

    if r.get("whole_rows"):
        lines += [
            "",
            "whole slice (every block, every field), each side a whole fresh process (imports, "
            "load, every byte copied into its own memory):",
            "",
        ]
        lines += bench_process.render(r["whole_rows"])
    if r.get("process_rows"):
        lines += ["", "attention, each side a whole fresh process (imports, load, copy out):", ""]
        lines += bench_process.render(r["process_rows"])
    lines += ["", "MoE (the slot of the expert blocks, expert layers only):", ""]
    lines += _table_head(MOE_HEAD)
    for x in r["moe_rows"]:
        cells = [
            f"{x['tp']}", f"{x['ep']}", f"{x['experts_on_rank']} of {x['experts']}",
            f"{x['shard_bytes'] / 1e6:.0f}",
            f"{x['specbind_s']:.3f} ({x['specbind_min_s']:.3f})",
            f"{x['baseline_s']:.3f} ({x['baseline_min_s']:.3f})",
            f"{x['specbind_over_baseline']:.2f} ({x['specbind_over_baseline_min']:.2f})",
            f"{x['memcpy_s']:.3f}", f"{x['fraction_of_memcpy']:.2f}",
            f"{x['memcpy_mapped_s']:.3f}", f"{x['fraction_of_mapped_memcpy']:.2f}",
            *_rss_cells(x),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += [f"skipped: MoE {s}" for s in r.get("moe_skipped", [])]
    lines += ["", *_table_head(ABSORB_HEAD)]
    for a in r["absorb"]:
        g = a["geometry"]
        cells = [
            f"{g['block']}", f"{g['tp']}", f"{g['heads_on_rank']}", f"{a['gflop']:.1f}",
            f"{a['absorb_gflops']:.1f}",
            f"{a['matmul_gflops']:.1f}", f"{a['absorb_over_matmul']:.2f}",
            f"{a.get('seed_order_q_absorb_gflops', float('nan')):.1f}",
            f"{a.get('specbind_over_seed_order', float('nan')):.1f}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if "rss_tp8_over_tp1" in r:
        lines.append(f"peak RSS, attention, specbind TP=8 / TP=1: {r['rss_tp8_over_tp1']:.2f}")
    for size, ratios in r.get("moe_rss_over_tp1", {}).items():
        shown = ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
        lines.append(f"peak RSS, MoE, {size} / tp1_ep1: {shown}")
    if r.get("synth_s") is not None:
        lines.append(f"writing the slice (synth, once): {r['synth_s']:.1f} s")
    lines.append(f"specbind generate from nothing: {r['generate_s']:.2f} s")
    from benchmarks import ranks as bench_ranks

    lines += bench_ranks.render(r.get("ranks", []), r.get("loaders"))
    if "fixed_cost" in r:
        from benchmarks import fixed as bench_fixed

        lines.append(bench_fixed.render(r["fixed_cost"]))
    if r.get("limits"):
        from benchmarks import limits

        lines += limits.render(r["limits"])
    return "\n".join(lines)
