"""``specbind bind``'s text report, from ``BindResult.as_dict()``: one row per (role, slot,
block) with the layers it covers (``-v``: one row per layer and slot), a line of what was bound
at which rank, and the last line ``bound 3.74 GiB in 12.3 s (0.30 GiB/s)``.

Invariant: the rows' tensors and bytes sum to the report's totals, folded or not (a folded row
is only ever the sum of rows equal but for the layer, ``summary.fold``).
"""

from __future__ import annotations

from typing import Any

from specbind.core.units import GIB, done, size
from specbind.summary import fold, spans

ROW = "{:>6}  {:<7} {:<10} {:<14} {:>7} {:>15} {:>8}  {}"


def render_text(rep: dict[str, Any], verbose: bool = False, wrote: str | None = None) -> str:
    rows: list[tuple[int, tuple[str, str, str], list[int]]] = [
        (x["index"], (x["role"], slot, s["block"]), [s["bound"], s["bytes"]])
        for x in rep["layers"]
        for slot, s in x["slots"].items()
    ]
    g = rep["globals"]
    if g is not None:
        rows.append((-1, ("model", "globals", g["block"]), [g["bound"], g["bytes"]]))
    head = ("layer" if verbose else "layers", "role", "slot", "block", "tensors", "bytes")
    lines = [ROW.format(*head, "GiB", "" if verbose else "which (-v: every layer and slot)")]
    shown = [([i], k, c) for i, k, c in rows] if verbose else fold(rows)
    for layers, key, (tensors, nbytes) in shown:
        role, slot, block = key
        n = spans(layers) if verbose else len(layers)
        which = "" if verbose else spans(layers)
        lines.append(ROW.format(n, role, slot, block, tensors, nbytes, _gib(nbytes), which))
    total = rep["bytes"]
    skipped = "".join(
        f"; declared unbound, not read: {n} tensor(s) under {p}"
        for p, n in rep["declared_unbound"].items()
        if n
    )
    mtp = rep.get("mtp_not_bound")
    lines.append(
        f"bound {len(rep['layers'])} layer(s) and the model-level tensors, {size(total)} at tp "
        f"rank {rep['tp_rank']} of {rep['tp_size']}, ep rank {rep['ep_rank']} of {rep['ep_size']}"
        + skipped
        + (f"; MTP layer(s) {mtp} not bound (--no-mtp)" if mtp else "")
        + (f"; wrote {wrote}" if wrote else "")
    )
    lines += [
        f"padded: {name} has {rows} rows, padded to {to} (tp {rep['tp_size']} does not divide "
        f"them; rows past {rows} are zeros, as vLLM's VocabParallelEmbedding pads)"
        for name, (rows, to) in sorted(rep.get("padding", {}).items())
    ]
    lines.append(done("bound", total, rep["seconds"]))
    return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"
