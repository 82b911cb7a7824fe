"""A checkpoint as the specs name it, its layout, and each slot's quantization: the names-only
preamble that ``bind``, ``plan`` and the ranks under torchrun share.

Invariants: everything here reads names, headers and configs, never tensor bytes; a layout
problem is refused (``refuse_problems``) before any slot's quantization is decided, and a
quantization the config and the tensors disagree on is refused here, before any byte is read.
Trap: ``audit`` does not use ``open_layout``: it reports these problems instead of refusing.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from specbind.core.errors import BindError
from specbind.runtime.checkpoint import CheckpointDir
from specbind.runtime.layout import Layout, layout
from specbind.runtime.model import ModelTable
from specbind.runtime.names import NamedView
from specbind.runtime.quant import LayerQuant, layer_quant
from specbind.runtime.quant_config import QuantConfig, detect, packed_names


@dataclass(frozen=True)
class OpenLayout:
    qconf: QuantConfig | None  # the checkpoint's quantization, as its own config declares it
    view: NamedView  # its tensors under the specs' names (the name map, packed names)
    lay: Layout


def open_layout(ckpt: CheckpointDir, table: ModelTable[Any]) -> OpenLayout:
    """The checkpoint's quantization, named view and layout; a checkpoint with no layer the
    model names, or a layout problem, is refused."""
    qconf = detect(ckpt, table.schemes)
    view = NamedView(ckpt, table.layer_pattern, table.names, packed_names(qconf))
    lay = layout(table, view.names(), ckpt.config)
    if not lay.layers:
        raise BindError(
            f"{ckpt.root}: no tensors named like {table.layer_pattern!r} under any of the "
            f"prefixes {list(table.layer_prefixes)}; " + first_components(ckpt.names())
        )
    refuse_problems(lay)
    return OpenLayout(qconf, view, lay)


def slot_quant(
    table: ModelTable[Any],
    opened: OpenLayout,
    geometry: Any,
    outputs: Collection[str] = (),
    allow_unshared: bool = False,
) -> dict[tuple[int, str], LayerQuant | None]:
    """Each (layer index, slot)'s quantization, decided from names and configs alone."""
    lay, view = opened.lay, opened.view
    out: dict[tuple[int, str], LayerQuant | None] = {}
    for index, x in lay.layers.items():
        full = lay.split.full_name(table, index, "")
        for slot, fill in x.slots.items():
            assert fill.block is not None  # refuse_problems ran first
            out[(index, slot)] = layer_quant(
                opened.qconf, fill.block.tensors, fill.names, full, fill.block.counts(geometry),
                index, view.on_disk, frozenset(outputs), allow_unshared, view.aliases,
            )  # fmt: skip
    return out


def refuse_problems(lay: Layout) -> None:
    """Refuse a layout with problems, naming the first and how many more there are."""
    if lay.problems:
        more = len(lay.problems) - 1
        tail = f" (and {more} more problem(s); `specbind audit` lists them all)" if more else ""
        raise BindError(lay.problems[0] + tail)


def first_components(names: list[str], most: int = 5) -> str:
    """The most common leading name components, to show what the checkpoint does hold."""
    counts: dict[str, int] = {}
    for n in names:
        head = ".".join(n.split(".")[:2])
        counts[head] = counts.get(head, 0) + 1
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:most]
    shown = ", ".join(f"{k}.* ({v})" for k, v in top)
    return f"its names start with {shown}" if top else "it holds no tensors"
