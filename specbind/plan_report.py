"""``specbind plan``: every tensor's local shape and bytes on every (tp, ep) rank, and totals.

Invariant: summed over ranks, each tensor is held ``tp`` times if replicated across tp ranks
(once if split), times ``ep`` unless it is an expert split across ep ranks (once): sharded
tensors partition, replicated ones are held by every rank. The report states both sides of that
sum so a reader (and the tests) can check it.
Each rank's bytes are its ``held`` bytes by block and kind (split, copied, replicated, expert:
``plan_held``), summed; ``totals.held`` sums each kind over ranks (``plan --svg`` draws them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any

from specbind.core.planning import BlockPlan, Ranks
from specbind.plan_held import held_by_block, held_totals
from specbind.runtime.checkpoint import CheckpointDir
from specbind.runtime.model import ModelTable
from specbind.runtime.quant import LayerQuant, quantize_rules

# (layer index, block, names present); a layer contributes one entry per filled slot
LayerUse = tuple[int, str, frozenset[str]]
# (layer index, block) -> which of its linears are stored quantized (None: none)
QuantOf = Callable[[int, str], LayerQuant | None]


def checkpoint_layers(
    table: ModelTable[Any], ckpt: CheckpointDir, values: dict[str, int], mtp: bool = True
) -> tuple[list[LayerUse], dict[tuple[int, str], LayerQuant | None]]:
    """What a checkpoint holds, by layer and block, from names alone (problems refused), and
    each (layer, block)'s quantization as the checkpoint's own config declares it
    (``mtp=False``: the decoder alone, as ``bind --no-mtp``)."""
    from specbind.runtime.view import open_layout, slot_quant

    opened = open_layout(ckpt, table, values, mtp)
    lay = opened.lay
    by_slot = slot_quant(table, opened, table.make_geometry(values))
    layers: list[LayerUse] = []
    quant: dict[tuple[int, str], LayerQuant | None] = {}  # by (index, block): plan_report's key
    for index, x in lay.layers.items():
        for slot, fill in x.slots.items():
            assert fill.block is not None
            layers.append((index, fill.block.name, frozenset(fill.names)))
            quant[(index, fill.block.name)] = by_slot[(index, slot)]
    if table.globals and lay.globals:
        layers.append((-1, table.globals, frozenset(lay.globals)))
    return layers, quant


def plan_report(
    table: ModelTable[Any],
    values: dict[str, int],
    tp_size: int,
    layers: list[LayerUse],
    source: str,
    ep_size: int = 1,
    quant: QuantOf | None = None,
) -> dict[str, Any]:
    """With ``quant``, a quantized linear is planned as its scheme's companions, each split
    in whole groups: the bytes are the packed bytes a rank reads."""
    geometry = table.make_geometry(values)
    used = sorted({b for _, b, _ in layers})
    grid = [Ranks(tp_size, t, ep_size, e) for e in range(ep_size) for t in range(tp_size)]
    plans: dict[tuple[str, Ranks], BlockPlan] = {}
    for name in used:
        block = table.block(name)
        block.check(geometry, grid[0])
        for r in grid:
            plans[(name, r)] = block.plan(geometry, r)
    whole = {name: table.block(name).plan(geometry, Ranks()) for name in used}
    cache: dict[tuple[Any, ...], BlockPlan] = {}

    def plan_of(index: int, name: str, r: Ranks | None) -> BlockPlan:
        """The block's plan in layer ``index`` on rank ``r`` (None: the whole model)."""
        base = whole[name] if r is None else plans[(name, r)]
        lq = quant(index, name) if quant is not None else None
        if lq is None:
            return base
        key = (name, r, lq.quantized)
        if key not in cache:
            cache[key] = quantize_rules(name, table.block(name).tensors, base, lq)[1]
        return cache[key]

    first = {name: min(i for i, b, _ in layers if b == name) for name in used}
    blocks: dict[str, Any] = {}
    for name in used:
        block = table.block(name)
        shapes = block.shapes(geometry)
        blocks[name] = {
            "layers": sorted({i for i, b, _ in layers if b == name}),
            "all_reduce": plans[(name, grid[0])].all_reduce,
            "tensors": [
                {
                    "name": r.name,
                    "dtype": r.dtype,
                    "shard": r.shard.kind
                    if r.shard.unit is None
                    else f"{r.shard.kind}:{r.shard.unit}",
                    "family": r.family,
                    "full_shape": list(shapes[r.name]),
                }
                for r in block.tensors
            ],
        }
    tp1 = expected = 0
    for i, b, present in layers:
        ranked = plan_of(i, b, grid[0]).tensors  # replicas: how many tp ranks hold a unit
        for t in plan_of(i, b, None).tensors.values():
            if t.name in present:
                tp1 += t.full_bytes
                held = ranked[t.name].replicas if t.name in ranked else 1
                copies = tp_size if t.kind == "replicated" else held
                expert = t.pattern != t.name or t.members is not None  # a member, or stacked
                copies *= 1 if expert else ep_size  # an expert lives on one ep rank
                expected += t.full_bytes * copies
    ranks: list[dict[str, Any]] = []
    for r in grid:
        kinds = held_by_block(layers, partial(plan_of, r=r))  # split, copied, replicated, expert
        total = sum(n for by_kind in kinds.values() for n in by_kind.values())
        per_block = {
            name: [
                {
                    k: t.as_dict()[k]
                    for k in ("name", "local_shape", "local_bytes", "axis", "offset")
                }
                for t in plan_of(first[name], name, r).tensors.values()
            ]
            for name in used
        }
        ranks.append(
            {"tp_rank": r.tp_rank, "ep_rank": r.ep_rank, "bytes": total, "tensors": per_block,
             "held": kinds}
        )  # fmt: skip
    return {
        "model": table.name,
        "source": source,
        "tp_size": tp_size,
        "ep_size": ep_size,
        "geometry": values,
        "blocks": blocks,
        "ranks": ranks,
        "totals": {
            "tp1_bytes": tp1,
            "sum_rank_bytes": sum(r["bytes"] for r in ranks),
            "expected_sum": expected,
            "max_rank_bytes": max(r["bytes"] for r in ranks),
            "held": held_totals(r["held"] for r in ranks),
        },
    }


def render_text(rep: dict[str, Any]) -> str:
    """The report as text: per block its tensors' full shape and the local shape on rank
    (tp 0, ep 0) (a family by its first member there; a quantized weight's packed shape, while
    ``dtype`` stays the spec's), then every rank's bytes and the totals.
    Trap: the model-level block's ``layers`` is ``[-1]`` in the JSON; the text says so in words."""
    lines = [
        f"plan for {rep['model']} at tp {rep['tp_size']} x ep {rep['ep_size']} ({rep['source']})"
    ]
    first = rep["ranks"][0]
    for name, b in rep["blocks"].items():
        where = "model-level" if b["layers"] == [-1] else f"layers {b['layers']}"
        lines.append(f"{name}: {where}, all-reduce after the block: {b['all_reduce']}")
        local = {t["name"]: str(t["local_shape"]) for t in first["tensors"].get(name, [])}
        lines.append(
            f"  {'tensor':<45} {'dtype':<5} {'shard':<11} {'full shape':<16} "
            f"local on tp {first['tp_rank']} ep {first['ep_rank']} (a quantized weight: packed)"
        )
        for t in b["tensors"]:
            shown = _local_shape(t["name"], local)
            lines.append(
                f"  {t['name']:<45} {t['dtype']:<5} {t['shard']:<11} {t['full_shape']!s:<16} "
                f"{shown}"
            )
    for r in rep["ranks"]:
        lines.append(f"rank tp {r['tp_rank']} ep {r['ep_rank']}: {r['bytes']} B")
    tot = rep["totals"]
    lines.append(
        f"whole model {tot['tp1_bytes']} B; sum over ranks {tot['sum_rank_bytes']} B "
        f"(expected {tot['expected_sum']} B: replicated tensors on every rank, a unit fewer "
        f"than tp on tp / units ranks, experts on one ep rank); largest rank "
        f"{tot['max_rank_bytes']} B"
    )
    return "\n".join(lines)


def _local_shape(pattern: str, local: dict[str, str]) -> str:
    """The local shape of ``pattern`` (a name, or a family's ``experts.{e}.…``: its first
    member on the rank); ``-`` when the rank holds none of it."""
    if pattern in local:
        return local[pattern]
    parts = re.split(r"\{[a-z]\}", pattern)
    if len(parts) == 1:
        return "-"
    member = re.compile(r"\d+".join(re.escape(p) for p in parts))
    return next((shape for n, shape in local.items() if member.fullmatch(n)), "-")
