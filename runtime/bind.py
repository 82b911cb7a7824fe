"""Bind every attention block of a checkpoint through the generated binders.

Invariants: each layer is classified from its tensor names alone (the model's block order,
first match wins), never from its index or ``layer_types``; a layer that matches no block is
refused with the nearest block's missing tensors named; all layers are checked before any
result is returned, so a refusal never leaves a partial result behind.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from runtime.backends import NUMPY, Backend
from runtime.binding import BindReport
from runtime.checkpoint import Checkpoint
from runtime.errors import BindError, SpecbindError
from runtime.layers import LayerSource, split_layers
from runtime.model import BlockEntry, ModelTable, Weights, expected_groups, values_from_config
from runtime.tp import check_tp

UNKNOWN = "unknown"


def classify(table: ModelTable[Any], names: Collection[str]) -> BlockEntry[Any] | None:
    for b in table.blocks:
        if b.matches(names):
            return b
    return None


def nearest(table: ModelTable[Any], names: Collection[str]) -> tuple[BlockEntry[Any], list[str]]:
    """The block sharing the most tensor names with ``names``, and what it would still need."""
    best = max(table.blocks, key=lambda b: sum(1 for t in b.tensors if t.name in names))
    return best, sorted(m for m in best.markers if m not in names)


def check_groups(
    table: ModelTable[Any],
    config: Mapping[str, Any],
    index: int,
    block: BlockEntry[Any],
    names: Collection[str],
) -> None:
    """Refuse a layer whose optional groups disagree with what config.json says it has."""
    for group, (must, why) in expected_groups(table, config, index).items():
        members = [t.name for t in block.tensors if t.group == group]
        if not members:
            continue
        has = any(m in names for m in members)
        if must and not has:
            raise BindError(f"layer {index}: {why}, but the layer has no {group} tensors")
        if has and not must:
            raise BindError(f"layer {index}: {why}, but the layer carries {group} tensors")


@dataclass
class BoundLayer:
    index: int
    kind: str
    weights: Weights
    report: BindReport


@dataclass
class BindResult:
    tp_size: int
    tp_rank: int
    layers: list[BoundLayer]
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp_size": self.tp_size,
            "tp_rank": self.tp_rank,
            "layers": [layer.report.as_dict() for layer in self.layers],
            "seconds": round(self.seconds, 6),
        }


def bind_checkpoint(
    ckpt: Checkpoint,
    table: ModelTable[Any],
    overrides: dict[str, int] | None = None,
    tp_size: int = 1,
    tp_rank: int = 0,
    progress: bool | None = None,
    kinds: Collection[str] | None = None,
    backend: Backend = NUMPY,
) -> BindResult:
    """Bind every layer (or, when ``kinds`` is given, the layers of those blocks only; every
    layer is still classified, so an unknown layer is refused either way)."""
    t0 = time.perf_counter()
    check_tp(tp_size, tp_rank)
    geometry = table.make_geometry(values_from_config(table, ckpt.config, overrides))
    split = split_layers(table, ckpt.names())
    if not split.layers:
        raise BindError(f"{ckpt.root}: no tensors named like {table.layer_pattern!r}")
    for b in table.blocks:  # refuse a bad (geometry, tp) before reading any tensor
        if any(b.matches(names) for names in split.layers.values()):
            b.plan(geometry, tp_size, tp_rank)
            b.check(geometry, tp_size)
    out: list[BoundLayer] = []
    items: Iterable[tuple[int, list[str]]] = split.layers.items()
    # disable=None: a bar only when stderr is a terminal, unless the caller says otherwise.
    disable = None if progress is None else not progress
    for index, names in tqdm(
        items, total=len(split.layers), desc="bind", unit="layer", disable=disable
    ):
        block = classify(table, names)
        if block is None:
            near, missing = nearest(table, names)
            attn = [n for n in names if n.startswith(near.prefix)]
            raise BindError(
                f"layer {index}: its {len(attn)} {near.prefix.rstrip('.')} tensor(s) match no "
                "block "
                f"of {table.name}; nearest is {near.name}, missing {missing}"
            )
        check_groups(table, ckpt.config, index, block, names)
        if kinds is not None and block.name not in kinds:
            continue
        src = LayerSource(ckpt, split.full_name(table, index, ""), names)
        try:
            weights, report = block.bind(geometry, tp_size, tp_rank, index, src, backend)
        except SpecbindError as e:
            if str(e).startswith(f"layer {index}: "):
                raise
            raise type(e)(f"layer {index}: {e}") from None  # an op error names the field only
        out.append(BoundLayer(index, block.name, weights, report))
    return BindResult(tp_size, tp_rank, out, time.perf_counter() - t0)
