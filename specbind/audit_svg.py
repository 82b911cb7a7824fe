"""``specbind audit --svg FILE``: the census as a layer × slot grid coloured by block, problems red.

One row per layer (index and role), one column per slot; a cell is coloured by the block that
fills it (a legend names each), labelled with the block and its tensor count, and its tooltip
gives the signature and what the census noted. A cell with a problem is red and its tooltip is
the problem text; a layer's problem that names none of its slots reddens the layer's label; a
model-level problem reddens the ``model`` row; every problem is also listed, in red, under the
grid, and the verdict heads the picture.

Invariants:
- a cell is red exactly when a problem is attributed to it, or its census row shows one
  (no block matched, missing, undeclared or refused-dtype tensors); a layer's label or the
  model row exactly when a problem is attributed to it; red is used for nothing else;
- a problem ``layer N: …`` (or ``bind: layer N: …``) goes to the slots of layer N it names —
  by slot name, by block name, or by one of that block's tensor names (``tensors``: each
  block's rule names; a family's ``{e}`` matches any index) — else to the layer's label; every
  problem is shown somewhere, and all of them in the list;
- every name from the checkpoint (path, tensor names inside problem text) is escaped by ``svg``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from specbind.svg import Svg

RED, WHITE = "#d62728", "#ffffff"
# light tones under black text; none near the problem red
PALETTE = ("#a0cbe8", "#8cd17d", "#ffbe7d", "#d4a6c8", "#86bcb6", "#f1ce63", "#d7b5a6",
           "#bab0ac", "#b6992d", "#499894", "#79706e", "#9d7660")  # fmt: skip
LEFT, TOP, ROW, COL, LIST_LINE, SHOWN = 130, 120, 26, 150, 16, 40
_LAYER = re.compile(r"(?:bind: )?layer (\d+): ")


def _word(name: str) -> re.Pattern[str]:
    """``name`` as a whole dotted word (a family's ``{e}``: any index), also as the tail of a
    stored name (refusals name ``layers.0.self_attn.q_proj.weight`` in full); a tensor rule's
    last component dropped, so ``experts.{e}.down_proj.weight`` also finds ``….weight_scale``."""
    parts = name.split(".")
    stem = ".".join(parts[:-1]) if len(parts) > 1 else name
    body = r"\d+".join(re.escape(p) for p in re.split(r"\{[a-z]\}", stem))
    return re.compile(rf"(?<![\w]){body}(?![\w])")


def attribute(
    rep: dict[str, Any], tensors: Mapping[str, Sequence[str]]
) -> tuple[dict[tuple[int, str], list[str]], dict[int, list[str]], list[str]]:
    """Each problem to its (layer, slot) cells, else its layer, else the model row."""
    cells: dict[tuple[int, str], list[str]] = {}
    layers: dict[int, list[str]] = {}
    model: list[str] = []
    rows = {r["index"]: r for r in rep["layers"]}
    for p in rep["problems"]:
        m = _LAYER.match(p)
        row = rows.get(int(m[1])) if m else None
        if m is None or row is None:
            model.append(p)
            continue
        rest = p[m.end() :]
        hit = []
        for slot, s in row["slots"].items():
            words = {slot, s["block"], s["nearest"], *tensors.get(s["nearest"], ())}
            if any(_word(w).search(rest) for w in words):
                hit.append(slot)
        for slot in hit:
            cells.setdefault((row["index"], slot), []).append(p)
        if not hit:
            layers.setdefault(row["index"], []).append(p)
    return cells, layers, model


def _census_problem(s: dict[str, Any]) -> str | None:
    """What the census row itself shows wrong (a problem line names it too)."""
    if s["block"] == "unknown":
        return f"no block matches (nearest {s['nearest']}, missing {s['missing']})"
    for key, what in (("missing", "missing"), ("unknown", "undeclared"),
                      ("wrong_dtype", "refused dtype")):  # fmt: skip
        if s[key]:
            return f"{what}: {s[key]}"
    return None


def _notes(slot: str, s: dict[str, Any]) -> str:
    lines = [f"{slot}: {s['block']}, {s['tensors']} tensor(s), signature {s['signature']}"]
    if s["absent_optional_groups"]:
        lines.append(f"no {'/'.join(s['absent_optional_groups'])} (optional)")
    if s["quantization_artifacts"]:
        lines.append(f"quantized: {', '.join(s['quantization_artifacts'][:6])}")
    return "\n".join(lines)


def render_svg(rep: dict[str, Any], tensors: Mapping[str, Sequence[str]] | None = None) -> str:
    """The picture of an ``audit`` report (see the module docstring); ``tensors``: each
    block's tensor rule names, to place a problem that names a tensor."""
    cells, layer_problems, model_problems = attribute(rep, tensors or {})
    slots: list[str] = []
    for r in rep["layers"]:
        slots += [s for s in r["slots"] if s not in slots]
    blocks = sorted({s["block"] for r in rep["layers"] for s in r["slots"].values()} - {"unknown"})
    colour = {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(blocks)}
    problems: list[str] = rep["problems"]
    listed = problems[:SHOWN]
    grid_h = ROW * (len(rep["layers"]) + 1)
    width = max(1000, LEFT + COL * len(slots) + 20)
    height = TOP + grid_h + 40 + LIST_LINE * (len(listed) + 2)
    svg = Svg(width, height, f"audit of {rep['checkpoint']} ({rep['model']})")
    svg.label(10, 24, f"audit of {rep['model']}: {rep['checkpoint']}", 18, font_weight="bold")
    svg.group(rep["verdict"])
    svg.label(10, 46, _cut(rep["verdict"], width // 7), 13, fill=RED if problems else "#2a7a2a",
              data_verdict="ok" if rep["ok"] else "refused")  # fmt: skip
    svg.end()
    cov = rep["coverage"]
    svg.label(10, 66, f"{rep['tensors']} tensors: {cov['bound']} bound, "
              f"{cov['declared_unbound']} declared unbound, {cov['unaccounted']} unaccounted; "
              f"{len(rep['layers'])} layers under {rep['layer_prefix']!r}", 12)  # fmt: skip
    x = 10
    for b in [*blocks, "problem"]:  # the legend
        svg.box(x, 78, 14, 14, RED if b == "problem" else colour[b], data_legend=b)
        svg.label(x + 20, 90, b, 12)
        x += 32 + 7 * len(b)
    for j, slot in enumerate(slots):
        svg.label(LEFT + j * COL + 4, TOP - 6, slot, 13, font_weight="bold", data_column=slot)
    for i, r in enumerate(rep["layers"]):
        y = TOP + i * ROW
        mine = layer_problems.get(r["index"], [])
        bad = bool(mine)
        tip = "\n".join([*mine, *([f"unclaimed: {r['unclaimed']}"] if r["unclaimed"] else [])])
        svg.box(4, y + 1, LEFT - 10, ROW - 2, RED if bad else "#eeeeee", tip or None,
                data_layer=r["index"], data_problem="1" if bad else None)  # fmt: skip
        svg.label(10, y + 17, f"layer {r['index']} {r['role']}", 12, fill=WHITE if bad else None,
                  pointer_events="none")  # fmt: skip
        for j, slot in enumerate(slots):
            s = r["slots"].get(slot)
            if s is not None:
                _cell(svg, LEFT + j * COL, y, slot, s, r["index"], cells, colour)
    y = TOP + len(rep["layers"]) * ROW
    bad = bool(model_problems)
    svg.box(4, y + 1, LEFT - 10, ROW - 2, RED if bad else "#eeeeee",
            "\n".join(model_problems) or None, data_layer="model",
            data_problem="1" if bad else None)  # fmt: skip
    svg.label(10, y + 17, "model", 12, fill=WHITE if bad else None, pointer_events="none")
    svg.label(LEFT + 4, y + 17, f"{len(rep['globals'])} model-level tensor(s)", 12)
    y += ROW + 30
    svg.label(10, y, f"{len(problems)} problem(s)" + (":" if problems else ""), 13,
              font_weight="bold", fill=RED if problems else None)  # fmt: skip
    for n, p in enumerate(listed):
        svg.group(p, data_problem_text="1")
        svg.label(20, y + LIST_LINE * (n + 1), _cut(p, width // 7), 12, fill=RED)
        svg.end()
    if len(problems) > SHOWN:
        svg.label(20, y + LIST_LINE * (len(listed) + 1),
                  f"… and {len(problems) - SHOWN} more (audit --json lists them)", 12)  # fmt: skip
    return svg.render()


def _cell(
    svg: Svg, x: float, y: float, slot: str, s: dict[str, Any], index: int,
    cells: dict[tuple[int, str], list[str]], colour: dict[str, str],
) -> None:  # fmt: skip
    own = cells.get((index, slot), [])
    census = _census_problem(s)
    bad = bool(own) or census is not None
    tip = "\n".join(own) if own else census if census is not None else _notes(slot, s)
    svg.box(x + 2, y + 1, COL - 4, ROW - 2, RED if bad else colour[s["block"]], tip,
            data_layer=index, data_slot=slot, data_block=s["block"],
            data_problem="1" if bad else None)  # fmt: skip
    name = s["block"] if s["block"] != "unknown" else "no block"
    svg.label(x + 8, y + 17, _cut(f"{name} · {s['tensors']}", COL // 7), 12,
              fill=WHITE if bad else "#111111", pointer_events="none")  # fmt: skip


def _cut(s: str, most: int) -> str:
    """``s`` on one line of at most ``most`` characters (the tooltip keeps the whole)."""
    s = " ".join(s.split())
    return s if len(s) <= most else s[: most - 1] + "…"
