"""``specbind plan --svg FILE``: who holds which bytes, ranks × blocks, as an SVG picture.

One row per (tp, ep) rank, one column per block and a last column for the rank's total; each
cell a bar of the rank's bytes in that block, cut by kind (``plan_held.KINDS``): split (solid
blue), copied units (orange stripes: KV heads at tp > KV heads), replicated (grey stripes),
experts (solid green), with the cell's figure under it and every kind's exact bytes in its
tooltip. The legend gives each kind's bytes summed over ranks.

Invariants:
- the picture draws the report ``plan --json`` prints and nothing else: every number in it is a
  ``ranks[].held`` / ``ranks[].bytes`` / ``totals`` value of that report, carried in
  ``data-*`` attributes of the element that shows it;
- every name (block, source path) is escaped by ``svg``; no name is ever markup.
Trap: a column's bars share one scale, its largest cell filling it; columns differ (a norm block
of KiB beside an MLP of GiB would otherwise be invisible), and the header says so.
"""

from __future__ import annotations

from typing import Any

from specbind.plan_held import KINDS
from specbind.svg import Svg, human

COLOURS = {"split": "#4e79a7", "copied": "#f28e2b", "replicated": "#79706e", "expert": "#59a14f"}
MEANING = {
    "split": "split: each unit on one tp rank",
    "copied": "copied: fewer units than tp, each unit on tp / units ranks",
    "replicated": "replicated: the whole tensor on every rank",
    "expert": "expert: one ep rank's experts",
}
LEFT, TOP, ROW, BAR, GAP, MIN_COL, TOTAL_COL = 120, 170, 36, 16, 14, 120, 200


def _fills(svg: Svg) -> dict[str, str]:
    return {
        "split": COLOURS["split"],
        "copied": svg.hatch("copied", COLOURS["copied"], 45),
        "replicated": svg.hatch("replicated", COLOURS["replicated"], -45, 5),
        "expert": COLOURS["expert"],
    }


def _tip(where: str, held: dict[str, int]) -> str:
    total = sum(held[k] for k in KINDS)
    rows = [f"{k}: {human(held[k])} ({held[k]:,} B)" for k in KINDS if held[k]]
    return "\n".join([f"{where}: {human(total)} ({total:,} B)", *rows])


def render_svg(rep: dict[str, Any], width: int = 1400) -> str:
    """The picture of a ``plan_report`` (see the module docstring)."""
    blocks = list(rep["blocks"])
    ranks = rep["ranks"]
    col = max(MIN_COL, (width - LEFT - TOTAL_COL - 20) // max(len(blocks), 1))
    width = LEFT + col * len(blocks) + TOTAL_COL + 20
    height = TOP + ROW * len(ranks) + 40
    title = f"plan for {rep['model']} at tp {rep['tp_size']} × ep {rep['ep_size']}"
    svg = Svg(width, height, title)
    fills = _fills(svg)
    tot = rep["totals"]
    svg.label(10, 24, title, 18, font_weight="bold")
    svg.label(10, 44, str(rep["source"]), 12, fill="#555555")
    extra = tot["sum_rank_bytes"] - tot["tp1_bytes"]
    svg.label(
        10, 64,
        f"whole model {human(tot['tp1_bytes'])}; all ranks together "
        f"{human(tot['sum_rank_bytes'])} ({human(extra)} held more than once); largest rank "
        f"{human(tot['max_rank_bytes'])}",
        12, data_tp1_bytes=tot["tp1_bytes"], data_sum_rank_bytes=tot["sum_rank_bytes"],
        data_max_rank_bytes=tot["max_rank_bytes"],
    )  # fmt: skip
    for n, k in enumerate(KINDS):  # the legend: two columns of two
        x, y = 10 + (n % 2) * 560, 84 + (n // 2) * 22
        svg.box(x, y, 28, 14, fills[k], stroke="#333333", data_legend=k,
                data_bytes=tot["held"][k])  # fmt: skip
        svg.label(x + 36, y + 12, f"{MEANING[k]} — all ranks {human(tot['held'][k])} "
                  f"({tot['held'][k]:,} B)", 12, data_legend=k)  # fmt: skip
    widest = {b: max(sum(r["held"][b].values()) for r in ranks) or 1 for b in blocks}
    heads = [*blocks, "total"]
    for j, name in enumerate(heads):
        x = LEFT + j * col
        if name == "total":
            where = "the rank's bytes"
        else:
            layers = rep["blocks"][name]["layers"]
            where = "model-level" if layers == [-1] else f"{len(layers)} layer(s)"
        svg.label(x, TOP - 18, name, 13, font_weight="bold", data_column=name)
        svg.label(x, TOP - 4, f"{where}; bar = {human(widest.get(name, 0))}"
                  if name != "total" else where, 10, fill="#555555")  # fmt: skip
    top_rank = max(r["bytes"] for r in ranks) or 1
    for i, r in enumerate(ranks):
        y = TOP + i * ROW
        rank = f"tp {r['tp_rank']} · ep {r['ep_rank']}"
        if i and r["ep_rank"] != ranks[i - 1]["ep_rank"]:
            svg.line(10, y, width - 10, y)
        svg.label(10, y + 15, rank, 12, data_tp=r["tp_rank"], data_ep=r["ep_rank"])
        for j, name in enumerate(heads):
            held = (
                {k: sum(h[k] for h in r["held"].values()) for k in KINDS}
                if name == "total"
                else r["held"][name]
            )
            scale = top_rank if name == "total" else widest[name]
            _cell(svg, LEFT + j * col, y + 4, col - GAP if name != "total" else TOTAL_COL - GAP,
                  held, scale, fills, f"{rank} · {name}", r, name)  # fmt: skip
    svg.label(10, height - 14, "bars: each column on its own scale (its largest cell fills "
              "it); the total column on the largest rank. Hover a bar for exact bytes.", 11,
              fill="#555555")  # fmt: skip
    return svg.render()


def _cell(
    svg: Svg, x: float, y: float, w: float, held: dict[str, int], scale: int,
    fills: dict[str, str], where: str, r: dict[str, Any], name: str,
) -> None:  # fmt: skip
    """One rank's bytes in one column: a bar cut by kind and its figure under it."""
    total = sum(held[k] for k in KINDS)
    svg.group(_tip(where, held), data_tp=r["tp_rank"], data_ep=r["ep_rank"], data_block=name,
              data_bytes=total)  # fmt: skip
    svg.box(x, y, w, BAR, "#f4f4f4")
    at = x
    for k in KINDS:
        if held[k]:
            part = w * held[k] / scale
            svg.box(at, y, part, BAR, fills[k], data_kind=k, data_bytes=held[k])
            at += part
    copied = f", {human(held['copied'])} copied" if held["copied"] else ""
    svg.label(x, y + BAR + 12, human(total) + copied, 11)
    svg.end()
