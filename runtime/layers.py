"""Split a checkpoint's names into decoder layers, and present one layer as a tensor source.

Invariants: the layer prefix is found from the names (one of the model's allowed prefixes);
names of two different prefixes in one checkpoint are refused as ambiguous; names outside any
layer (embeddings, final norm, lm_head) are kept and counted, never dropped; a layer index
follows the digit rule of ``core.patterns`` (``layers.07.`` or ``layers.٣.`` is no layer: its
names stay outside, where the layout refuses them as unclaimed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specbind.core.errors import CheckpointError
from specbind.core.patterns import layer_pattern
from specbind.runtime.model import ModelTable
from specbind.runtime.source import RawTensor, TensorSource


@dataclass
class LayerSplit:
    prefix: str
    layers: dict[int, list[str]] = field(default_factory=dict)  # index -> layer-relative names
    outside: list[str] = field(default_factory=list)

    def full_name(self, table: ModelTable[Any], index: int, rel: str) -> str:
        return layer_pattern(table.layer_pattern, self.prefix).format(index) + rel


def split_layers(table: ModelTable[Any], names: list[str]) -> LayerSplit:
    counts = {p: 0 for p in table.layer_prefixes}
    matchers = {p: layer_pattern(table.layer_pattern, p) for p in table.layer_prefixes}
    for n in names:
        for p, lp in matchers.items():
            if lp.matches(n):
                counts[p] += 1
    used = [p for p, c in counts.items() if c]
    if len(used) > 1:
        shown = ", ".join(repr(p + table.layer_pattern) for p in used)
        raise CheckpointError(f"layer names use more than one prefix ({shown}); refusing to guess")
    prefix = used[0] if used else table.layer_prefixes[0]
    lp = matchers[prefix]
    split = LayerSplit(prefix)
    for n in names:
        hit = lp.split(n)
        if hit is not None:
            split.layers.setdefault(hit[1], []).append(hit[2])
        else:
            split.outside.append(n)
    split.layers = dict(sorted(split.layers.items()))
    return split


class LayerSource:
    """One decoder layer of a checkpoint, by layer-relative name."""

    def __init__(self, ckpt: TensorSource, full_prefix: str, names: list[str]) -> None:
        self._ckpt = ckpt
        self._prefix = full_prefix
        self._names = list(names)

    def names(self) -> list[str]:
        return list(self._names)

    def get(self, name: str) -> RawTensor | None:
        return self._ckpt.get(self._prefix + name)
