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
import textwrap
from collections.abc import Callable
from functools import partial
from typing import Any

from specbind.core.planning import BlockPlan, Ranks, TensorPlan
from specbind.core.units import size
from specbind.plan_held import held_by_block, held_totals
from specbind.runtime.binder.quant import LayerQuant, quantize_rules, quantized_rules
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.summary import spans
from specbind.version import __version__

WIDTH = 100  # the text's columns at most, at a real model's geometry (tests check them all)

# (layer index, block, names present); a layer contributes one entry per filled slot
LayerUse = tuple[int, str, frozenset[str]]
# (layer index, block) -> which of its linears are stored quantized (None: none)
QuantOf = Callable[[int, str], LayerQuant | None]


def checkpoint_layers(
    table: ModelTable[Any], ckpt: CheckpointDir, values: dict[str, int], mtp: bool = True
) -> tuple[list[LayerUse], dict[tuple[int, str], LayerQuant | None], str]:
    """What a checkpoint holds, by layer and block, from names alone (problems refused), and
    each (layer, block)'s quantization as the checkpoint's own config declares it
    (``mtp=False``: the decoder alone, as ``bind --no-mtp``), and the report's source for it:
    its folder, and a quantized one's scheme and variant as its config declares them."""
    from specbind.runtime.bind.preamble import open_layout, slot_quant

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
    q = opened.qconf
    source = str(ckpt.root) + (f"; quantized: {q.scheme.name} ({q.variant})" if q else "")
    return layers, quant, source


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
        optional = set(block.optional_groups)
        holding = [present for _, b, present in layers if b == name]
        # a quantized linear is listed as its scheme's companions (packed weight, scales), as
        # the block's first layer stores them, with their dtypes and whole shapes
        lq = quant(first[name], name) if quant is not None else None
        rules = quantized_rules(block.tensors, lq)
        stored = {
            t.pattern: t.full_shape for t in plan_of(first[name], name, None).tensors.values()
        }
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
                    "full_shape": list(stored[r.name] if r.name in stored else shapes[r.name]),
                    "optional_group": r.group if r.group in optional else None,
                    "held_in_layers": sum(_holds(r.name, names) for names in holding),
                    **_padding(plans[(name, grid[0])].tensors.get(r.name)),
                }
                for r in rules
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
                nbytes = t.full_bytes
                p = ranked.get(t.name)
                if p is not None and p.padded:  # the ranks hold the padded size, zeros included
                    nbytes = nbytes // p.full_shape[p.axis] * p.padded
                expected += nbytes * copies
    ranks: list[dict[str, Any]] = []
    for r in grid:
        kinds = held_by_block(layers, partial(plan_of, r=r))  # split, copied, replicated, expert
        total = sum(n for by_kind in kinds.values() for n in by_kind.values())
        per_block = {
            name: [
                {
                    k: t.as_dict()[k]
                    for k in ("name", "local_shape", "local_bytes", "axis", "offset", "zero_rows")
                    if k in t.as_dict()
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
        "specbind_version": __version__,
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
    """The report as text, 100 columns at most at a real model's geometry (a column as wide as
    its widest cell): per block the layers it fills and its tensors' dtype, split, full shape
    and local shape on rank (tp 0, ep 0) (a family by its first member there; a quantized
    weight's packed shape, while ``dtype`` stays the spec's), a tensor of an optional group
    marked with how many of the block's layers hold it; then the ranks' bytes (equal tp ranks
    of an ep rank on one line) and the totals, in bytes and GiB.
    Trap: the model-level block's ``layers`` is ``[-1]`` in the JSON; the text says so in words."""
    first = rep["ranks"][0]
    lines = [
        f"plan for {rep['model']} at tp {rep['tp_size']} x ep {rep['ep_size']}",
        *_wrap(f"from {rep['source']}"),
        f"local: the shape on tp {first['tp_rank']} ep {first['ep_rank']} (a quantized weight: "
        "packed); *: a tensor of an optional group",
    ]
    for name, b in rep["blocks"].items():
        n = len(b["layers"])
        where = "model-level" if b["layers"] == [-1] else f"{n} layer(s) ({spans(b['layers'])})"
        lines += _wrap(f"{name}: {where}, all-reduce after the block: {b['all_reduce']}")
        local = {t["name"]: str(t["local_shape"]) for t in first["tensors"].get(name, [])}
        cells = [("tensor", "dtype", "shard", "full shape", "local")]
        groups: dict[str, int] = {}
        for t in b["tensors"]:
            group = t["optional_group"]
            if group is not None:
                groups[group] = max(groups.get(group, 0), t["held_in_layers"])
            mark = "" if group is None else "*"
            row = (t["name"] + mark, t["dtype"], t["shard"], str(t["full_shape"]))
            cells.append((*row, _local_shape(t["name"], local)))
        widths = [max(len(c[k]) for c in cells) for k in range(5)]
        for c in cells:
            lines.append("  " + " ".join(f"{x:<{w}}" for x, w in zip(c, widths, strict=True)))
            lines[-1] = lines[-1].rstrip()
        lines += [
            f"  * optional group {g}: held in {held} of {max(n, 1)} layer(s)"
            for g, held in groups.items()
        ]
        padded = {(t["shard"], t["units"], t["padded"]) for t in b["tensors"] if "padded" in t}
        lines += [
            f"  {shard.split(':')[-1]} = {units} padded to {to} (tp {rep['tp_size']} does not "
            f"divide it; zero rows past {units}, as vLLM's VocabParallelEmbedding pads)"
            for shard, units, to in sorted(padded)
        ]
    lines += _ranks(rep)
    tot = rep["totals"]
    expected = tot["sum_rank_bytes"] == tot["expected_sum"]
    lines += [
        f"whole model     {size(tot['tp1_bytes'])}",
        f"sum over ranks  {size(tot['sum_rank_bytes'])}, "
        + ("as expected:" if expected else f"expected {size(tot['expected_sum'])}:"),
        "                replicated tensors on every rank, a unit fewer than tp on tp / units",
        "                ranks, experts on one ep rank",
        f"largest rank    {size(tot['max_rank_bytes'])}",
    ]
    return "\n".join(lines)


def _wrap(text: str) -> list[str]:
    """A prose line folded to ``WIDTH`` columns, its continuation indented."""
    return textwrap.wrap(text, WIDTH, subsequent_indent="    ", break_on_hyphens=False)


def _ranks(rep: dict[str, Any]) -> list[str]:
    """A line per run of consecutive tp ranks of one ep rank that hold equal bytes."""
    lines = []
    runs: list[tuple[int, int, int, int]] = []  # (ep, first tp, last tp, bytes)
    for r in rep["ranks"]:
        e, t, n = r["ep_rank"], r["tp_rank"], r["bytes"]
        if runs and runs[-1][0] == e and runs[-1][3] == n and runs[-1][2] == t - 1:
            runs[-1] = (e, runs[-1][1], t, n)
        else:
            runs.append((e, t, t, n))
    for e, lo, hi, n in runs:
        tp = f"tp {lo}" if lo == hi else f"tp {lo}-{hi}"
        lines.append(f"rank {tp} ep {e}: {size(n)}" + ("" if lo == hi else " each"))
    return lines


def _padding(p: TensorPlan | None) -> dict[str, int]:
    """A padded split's units and padded size (``core.vocab_pad``), for the report."""
    if p is None or not p.padded:
        return {}
    return {"units": p.units, "padded": p.padded}


def _holds(pattern: str, names: frozenset[str]) -> bool:
    """Whether ``names`` hold ``pattern``: the name itself, or a member of its family."""
    if pattern in names:
        return True
    parts = re.split(r"\{[a-z]\}", pattern)
    if len(parts) == 1:
        return False
    member = re.compile(r"\d+".join(re.escape(p) for p in parts))
    return any(member.fullmatch(n) for n in names)


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
