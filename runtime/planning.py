"""``specbind plan``: every tensor's local shape and bytes on every rank, and the totals.

Invariant: summed over ranks, the local bytes equal the TP=1 bytes plus (tp - 1) times the
replicated bytes — sharded tensors partition, replicated ones are held by every rank. The
report states both sides so a reader (and the tests) can check it.
"""

from __future__ import annotations

from typing import Any

from runtime.model import ModelTable


def plan_report(
    table: ModelTable[Any],
    values: dict[str, int],
    tp_size: int,
    layers: list[tuple[int, str, frozenset[str]]],
    source: str,
) -> dict[str, Any]:
    """``layers``: (index, block, names present); the plan of a layer counts present tensors."""
    geometry = table.make_geometry(values)
    used = sorted({b for _, b, _ in layers})
    plans = {
        (name, r): table.block(name).plan(geometry, tp_size, r)
        for name in used
        for r in range(tp_size)
    }
    for name in used:
        table.block(name).check(geometry, tp_size)
    blocks: dict[str, Any] = {}
    for name in used:
        p0 = plans[(name, 0)]
        blocks[name] = {
            "layers": [i for i, b, _ in layers if b == name],
            "all_reduce": p0.all_reduce,
            "tensors": [
                {
                    k: v
                    for k, v in t.as_dict().items()
                    if k in ("name", "dtype", "shard", "full_shape", "full_bytes")
                }
                for t in p0.tensors.values()
            ],
        }
    tp1 = replicated = 0
    for _, b, present in layers:
        for t in plans[(b, 0)].tensors.values():
            if t.name in present:
                tp1 += t.full_bytes
                replicated += t.full_bytes if t.kind == "replicated" else 0
    ranks = []
    for r in range(tp_size):
        per_block = {}
        for name in used:
            per_block[name] = [
                {
                    k: v
                    for k, v in t.as_dict().items()
                    if k in ("name", "local_shape", "local_bytes", "row_offset", "col_offset")
                }
                for t in plans[(name, r)].tensors.values()
            ]
        total = sum(
            t.local_bytes
            for _, b, present in layers
            for t in plans[(b, r)].tensors.values()
            if t.name in present
        )
        ranks.append({"rank": r, "bytes": total, "tensors": per_block})
    return {
        "model": table.name,
        "source": source,
        "tp_size": tp_size,
        "geometry": values,
        "blocks": blocks,
        "ranks": ranks,
        "totals": {
            "tp1_bytes": tp1,
            "replicated_bytes": replicated,
            "sum_rank_bytes": sum(r["bytes"] for r in ranks),
            "expected_sum": tp1 + (tp_size - 1) * replicated,
        },
    }


def render_text(rep: dict[str, Any]) -> str:
    lines = [f"plan for {rep['model']} at tp {rep['tp_size']} ({rep['source']})"]
    for name, b in rep["blocks"].items():
        lines.append(f"{name}: layers {b['layers']}, all-reduce after the block: {b['all_reduce']}")
        for t in b["tensors"]:
            lines.append(
                f"  {t['name']:<45} {t['dtype']:<5} {t['shard']:<11} {t['full_shape']!s:<16}"
            )
    for r in rep["ranks"]:
        lines.append(f"rank {r['rank']}: {r['bytes']} B")
        for name, ts in r["tensors"].items():
            for t in ts:
                lines.append(
                    f"  {name}  {t['name']:<45} {t['local_shape']!s:<16} {t['local_bytes']:>12} B"
                )
    tot = rep["totals"]
    lines.append(
        f"TP=1 {tot['tp1_bytes']} B; replicated {tot['replicated_bytes']} B; "
        f"sum over ranks {tot['sum_rank_bytes']} B "
        f"(= TP=1 + (tp-1) x replicated: {tot['expected_sum']} B)"
    )
    return "\n".join(lines)
