"""Rows that repeat layer after layer, folded into one row per kind: what ``bind`` and ``audit``
print without ``-v``.

Invariant: rows fold only when their keys are equal, each folded row names its layers
(``0-2, 5``) and how many, and the counts it sums add up to the unfolded rows' sums. The caller
picks the key: ``audit`` every cell but the layer (a slot with a problem or another signature
stays a row of its own), ``bind`` (role, slot, block), its tensors and bytes summed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def spans(indices: Iterable[int]) -> str:
    """Layer indices as runs: ``[0, 1, 2, 5, 7, 8]`` -> ``0-2, 5, 7-8``; ``-1`` (model-level)
    is ``-``."""
    xs = sorted(set(indices))
    if xs == [-1]:
        return "-"
    runs: list[list[int]] = []
    for x in xs:
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def fold(
    rows: Iterable[tuple[int, K, Sequence[int]]],
) -> list[tuple[list[int], K, list[int]]]:
    """``(layer, key, counts)`` rows -> ``(layers, key, summed counts)``, one per distinct
    ``key``, in the order each key first appears."""
    out: dict[K, tuple[list[int], list[int]]] = {}
    for index, key, counts in rows:
        if key not in out:
            out[key] = ([], [0] * len(counts))
        layers, sums = out[key]
        layers.append(index)
        for i, c in enumerate(counts):
            sums[i] += c
    return [(layers, key, sums) for key, (layers, sums) in out.items()]
