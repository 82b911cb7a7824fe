"""``python -m benchmarks --quant SCHEME``: one quantized MoE layer at the real expert
shapes, rank 0 of each tp (ep 1) and ep (tp 1), beside a hand-written loader and the memcpy limit.

What is measured: the MoE block's routed experts, shared experts and router, stored as the
scheme stores them (``synth --quant``: every linear it can hold), bound by the generated binder
(``quantize_rules`` plans, reads only the rank's bytes, stacks the experts and their scales)
against ``baselines/nvfp4_moe.py``: what a loader writes by hand, as vLLM's per-expert weight
loader does. ``memcpy``: copying the rank's bytes once, the floor for any loader. Each round
runs the three in turn (``common.interleaved``); min and median are reported, never one
timing.

Invariants: the baseline's stacked arrays equal specbind's byte for byte before anything is
timed (a faster wrong loader is no comparison); the layer is written once per geometry into
the cache (``--cache``), never into the repository. Only the expert count is reduced (32 of
288 by default, ``--set experts=N``): every per-expert shape is the real one.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from benchmarks.common import interleaved
from specbind.core.errors import SpecbindError
from specbind.core.planning import Ranks
from specbind.core.quant import SchemeRule
from specbind.runtime.binder.checks import Array
from specbind.runtime.binder.quant import LayerQuant, storable
from specbind.runtime.binder.tables import BlockEntry, ModelTable
from specbind.runtime.io.safetensors_file import SafetensorsFile
from specbind.runtime.io.source import RawTensor
from specbind.runtime.layout.config import checked_values

EXPERTS = 32  # of the real 288: 32 x 13.5 MiB of NVFP4 experts, a 0.45 GB layer
BASELINE_SUFFIXES = ("weight", "weight_scale", "weight_scale_2", "input_scale")


class FileSource:
    """One layer's tensors from one safetensors file, by layer-relative name."""

    def __init__(self, f: SafetensorsFile) -> None:
        self._f = f

    def names(self) -> list[str]:
        return self._f.names()

    def get(self, name: str) -> RawTensor | None:
        return self._f.raw(name) if name in self._f.entries else None


def moe_block(table: ModelTable[Any]) -> BlockEntry[Any]:
    """The mlp block with a family (the routed experts)."""
    for b in table.blocks:
        if b.counts(table.make_geometry(table.default_values())):
            return b
    raise SpecbindError(f"model {table.name} has no block with a family of experts")


def ensure_layer(
    table: ModelTable[Any], scheme: SchemeRule, cache: Path, values: Mapping[str, int]
) -> tuple[Path, LayerQuant]:
    from specbind.synth import _values

    block = moe_block(table)
    g = table.make_geometry(dict(values))
    lq = storable(scheme, block, g)
    if lq is None:
        raise SpecbindError(f"{scheme.name} can store no linear of {block.name} at this geometry")
    from specbind.generated import SPECS_SHA256

    what = [SPECS_SHA256, scheme.name, sorted(values.items())]  # new specs: a new layer
    key = hashlib.sha256(json.dumps(what).encode()).hexdigest()
    path = cache / f"{table.name}-{block.name}-{scheme.name}" / f"{key[:12]}.safetensors"
    if path.exists():
        return path, lq
    from specbind.synth import block_tensors
    from specbind.synth.quant import quantized_entries

    rng = np.random.default_rng(0)
    every = frozenset(t.group for t in block.tensors if t.group is not None)  # the whole block
    written = quantized_entries(block, list(block_tensors(block, g, every, False)), scheme, "", [])
    tensors = {n: _values(rng, d, shape, n) for n, d, shape in written}
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"bench: writing one {scheme.name} MoE layer to {path} (once)", file=sys.stderr)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)
    return path, lq


def run(
    table: ModelTable[Any], scheme: SchemeRule, tps: list[int], eps: list[int], repeat: int,
    cache: Path, sets: Mapping[str, int],
) -> dict[str, Any]:  # fmt: skip
    if {c.suffix for c in scheme.companions} != set(BASELINE_SUFFIXES):
        raise SpecbindError(
            f"bench --quant: the hand-written baseline reads {list(BASELINE_SUFFIXES)} "
            f"(nvfp4-modelopt), not {scheme.name}'s companions"
        )
    from benchmarks.baselines.nvfp4_moe import baseline

    values = checked_values(table, table.default_values(), {"experts": EXPERTS} | dict(sets))
    path, lq = ensure_layer(table, scheme, cache, values)
    block = moe_block(table)
    g0 = table.make_geometry(values)
    rows = []
    for tp, ep in [(t, 1) for t in tps] + [(1, e) for e in eps if e > 1]:
        ranks = Ranks(tp, 0, ep, 0)
        f = SafetensorsFile(path)
        src = FileSource(f)

        def ours(ranks: Ranks = ranks, src: FileSource = src) -> dict[str, Array]:
            w, _ = block.bind(g0, ranks, 1, src, _numpy(), {}, lq)
            return w.arrays()

        def theirs(ranks: Ranks = ranks) -> dict[str, Array]:
            return baseline(path, block.plan(g0, ranks), ranks)

        mine, base = ours(), theirs()
        for k, a in base.items():
            if mine[k].tobytes() != a.tobytes():
                raise SpecbindError(f"bench: the baseline's {k} differs from specbind's")
        rank_bytes = sum(a.nbytes for a in mine.values())
        views = [a for a in mine.values()]
        arena = np.empty(rank_bytes, dtype=np.uint8)

        def memcpy(views: list[Array] = views, arena: Array = arena) -> None:
            pos = 0
            for a in views:
                b = a.reshape(-1).view(np.uint8)  # [n] -> [n·itemsize B]
                arena[pos : pos + b.size] = b
                pos += b.size

        times = interleaved({"specbind": ours, "baseline": theirs, "memcpy": memcpy}, repeat)
        rows.append(
            {"tp": tp, "ep": ep, "rank_bytes": rank_bytes}
            | {f"{k}_min_s": min(v) for k, v in times.items()}
            | {f"{k}_median_s": statistics.median(v) for k, v in times.items()}
        )
    return {"scheme": scheme.name, "experts": values["experts"], "layer": str(path), "rows": rows,
            "when": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip


def _numpy() -> Any:
    from specbind.runtime.binder.backends import NUMPY

    return NUMPY


def render(r: dict[str, Any]) -> str:
    lines = [
        f"{r['scheme']} MoE layer, {r['experts']} experts at the real shapes (rank 0)",
        "| tp | ep | rank bytes | specbind min / median s | baseline min / median s | memcpy "
        "min / median s |",
        "|---|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        lines.append(
            f"| {x['tp']} | {x['ep']} | {x['rank_bytes']} | {x['specbind_min_s']:.3f} / "
            f"{x['specbind_median_s']:.3f} | {x['baseline_min_s']:.3f} / "
            f"{x['baseline_median_s']:.3f} | {x['memcpy_min_s']:.3f} / {x['memcpy_median_s']:.3f} |"
        )
    return "\n".join(lines)
