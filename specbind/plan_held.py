"""Who holds which bytes: a rank's planned bytes per block, told apart by how they are held.

Each tensor a rank holds is of exactly one kind (``KINDS``):
- ``expert``: a member of an expert family (or a stacked family's rows): on one ep rank only
  (and split by tp, if its rule says so);
- ``replicated``: the whole tensor, on every rank;
- ``copied``: sharded in units, but with fewer units than tp: each unit is held by
  ``replicas = tp / units`` ranks (KV heads at tp > KV heads, as vLLM replicates them);
- ``split``: sharded, each unit on one tp rank.

Invariant: per rank, the kinds sum to the rank's bytes in ``plan_report`` (the same plans, the
same names present); ``plan --json`` carries them (``ranks[].held``, ``totals.held``) and
``plan --svg`` draws exactly these numbers.
Trap: at ep > 1 a ``split`` or ``replicated`` tensor is also held once per ep rank: only
``expert`` bytes are divided among ep ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from specbind.core.planning import BlockPlan, TensorPlan

KINDS = ("split", "copied", "replicated", "expert")


def kind_of(t: TensorPlan) -> str:
    """How a rank holds ``t`` (see the module docstring)."""
    if t.pattern != t.name or t.members is not None:
        return "expert"
    if t.kind == "replicated":
        return "replicated"
    return "copied" if t.replicas > 1 else "split"


def held_by_block(
    layers: Iterable[tuple[int, str, frozenset[str]]], plan_of: Callable[[int, str], BlockPlan]
) -> dict[str, dict[str, int]]:
    """``{block: {kind: bytes}}`` on one rank, summed over the layers each block fills;
    ``plan_of(index, block)`` is that layer's plan on the rank."""
    out: dict[str, dict[str, int]] = {}
    for index, block, present in layers:
        row = out.setdefault(block, dict.fromkeys(KINDS, 0))
        for t in plan_of(index, block).tensors.values():
            if t.name in present:
                row[kind_of(t)] += t.local_bytes
    return dict(sorted(out.items()))


def held_totals(ranks: Iterable[dict[str, dict[str, int]]]) -> dict[str, int]:
    """Each kind's bytes summed over every rank and block."""
    out = dict.fromkeys(KINDS, 0)
    for held in ranks:
        for row in held.values():
            for k in KINDS:
                out[k] += row[k]
    return out
