"""Pure shard planning: which bytes of each tensor a (tp rank, ep rank) holds. No I/O.

A plan is computed per (block, geometry, tp, ep, ranks) from the spec's rules:
- ``replicated``: every rank holds the whole tensor;
- ``{rows: U}`` / ``{cols: U}`` / ``{axis: k, unit: U}``: that axis holds ``U`` whole units;
  rank r holds units ``[r·U/tp, (r+1)·U/tp)`` (``A_log`` [H] and ``dt_bias`` [H·D] share the
  rule and shard at different granularity); rows are one contiguous byte range, any other
  axis is strided (every outer index keeps its own middle slice);
- a family sharded by ``experts``: ep rank r owns the contiguous members
  ``[r·base + min(r, rem), … + base + (r < rem))`` with ``base = n // ep``, ``rem = n % ep``
  (vLLM's map), and each member's tensors are then split by tp as above;
- replication (vLLM's ``QKVParallelLinear`` for KV heads): when ``1 <= U < tp`` and
  ``tp % U == 0``, each unit is held by ``tp / U`` ranks: rank r holds unit ``r // (tp / U)``;
  a unit the block declares ``never_replicated`` (query heads) is refused there instead,
  naming the tensor, the unit and why.
- a stacked family (one stored tensor ``[E, …]``, the family on axis 0): the same map picks
  this ep rank's rows of axis 0 (``members``: first row and count), and tp splits another
  axis of them; the local shape starts with the rank's member count.

- a unit the block pads (``padded:``, ``ShardRule.pad``: the vocabulary, one row a unit) and
  that tp does not divide is padded as vLLM's VocabParallelEmbedding pads it
  (``core.vocab_pad``): rank r holds ``P/tp`` rows, the stored ones of ``[r·P/tp, (r+1)·P/tp)``
  first, then ``zeros`` zero rows; a tp that divides the unit splits it as above, unpadded
  (the bytes every dividing tp bound before padding existed).

Invariants:
- each unit is held by ``max(tp / U, 1)`` ranks (``replicas``): ``U % tp == 0`` or
  ``tp % U == 0`` for every sharded tensor, checked at plan time with a message naming it;
- the local shape keeps the on-disk rank (the conv stays ``[Q/tp, 1, K]`` until the squeeze);
- summed over ranks, sharded bytes are held ``replicas`` times each (once when ``U >= tp``)
  and replicated bytes are held by every rank.
Trap: a row slice of ``o_proj`` has the same byte count as its column shard and different
contents; only the column shard is right (the tests compare values, not lengths).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specbind.core import vocab_pad
from specbind.core.dtypes import DTYPES
from specbind.core.errors import GeometryError, RankError
from specbind.core.ir import ShardKind, TensorRule
from specbind.core.record import record, replace


@record
class TensorPlan:
    name: str
    dtype: str
    kind: ShardKind
    unit: str | None
    units: int  # how many whole units the sharded axis holds (1 when replicated)
    full_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    axis: int  # the sharded axis (0 when replicated)
    offset: int  # first index along ``axis`` this rank reads
    shape_text: str = ""  # the symbolic shape, for messages
    stored: tuple[str, ...] = ()  # on-disk dtypes accepted besides ``dtype``
    pattern: str = ""  # the rule's name (a family pattern for a family member)
    singletons: bool = False  # also stored with extra size-1 axes (the same bytes)
    replicas: int = 1  # tp ranks holding each unit: tp / units when units < tp, else 1
    members: tuple[int, int] | None = None  # a stacked family: (first row, rows) of axis 0
    # a padded split (``ShardRule.pad``): the axis padded to this size (0: not padded); the
    # last ``zeros`` rows of this rank's share are zeros, past the stored rows
    padded: int = 0
    zeros: int = 0

    @property
    def stored_local(self) -> int:
        """Rows of the sharded axis this rank reads from the checkpoint."""
        return self.local_shape[self.axis] - self.zeros

    @property
    def full_bytes(self) -> int:
        return DTYPES[self.dtype].nbytes(self.full_shape)

    @property
    def local_bytes(self) -> int:
        return DTYPES[self.dtype].nbytes(self.local_shape)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shard": self.kind if self.unit is None else f"{self.kind}:{self.unit}",
            "full_shape": list(self.full_shape),
            "local_shape": list(self.local_shape),
            "axis": self.axis,
            "offset": self.offset,
            "full_bytes": self.full_bytes,
            "local_bytes": self.local_bytes,
            **({"padded": self.padded, "zero_rows": self.zeros} if self.padded else {}),
        }


@record
class BlockPlan:
    block: str
    tp_size: int
    tp_rank: int
    tensors: dict[str, TensorPlan]  # concrete names: this rank's family members only
    all_reduce: bool  # the block's output must be summed across tp ranks
    ep_size: int = 1
    ep_rank: int = 0
    members: Mapping[str, range] | None = None  # family -> this ep rank's members

    def local_shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: t.local_shape for n, t in self.tensors.items()}


def check_tp(tp_size: int, tp_rank: int, what: str = "tp") -> None:
    if tp_size < 1:
        raise RankError(f"{what} size {tp_size} must be >= 1")
    if not 0 <= tp_rank < tp_size:
        raise RankError(f"{what} rank {tp_rank} is outside [0, {tp_size})")


def member_range(count: int, ep_size: int, ep_rank: int) -> range:
    """The contiguous members ep rank ``ep_rank`` owns out of ``count`` (vLLM's expert map)."""
    check_tp(ep_size, ep_rank, "ep")
    if ep_size > count:
        raise RankError(
            f"ep size {ep_size} is larger than the {count} experts: a rank would hold none"
        )
    base, rem = divmod(count, ep_size)
    start = ep_rank * base + min(ep_rank, rem)
    return range(start, start + base + (1 if ep_rank < rem else 0))


def expand(
    rules: Sequence[TensorRule], members: Mapping[str, range]
) -> tuple[list[TensorRule], dict[str, str]]:
    """Concrete rules for the given family members, and each concrete name's pattern."""
    out: list[TensorRule] = []
    pattern: dict[str, str] = {}
    for r in rules:
        if r.family is None:
            out.append(r)
            pattern[r.name] = r.name
            continue
        for i in members[r.family]:
            c = r.concrete(i)
            out.append(c)
            pattern[c.name] = r.name
    return out, pattern


def plan_block(
    block: str,
    rules: Sequence[TensorRule],
    shapes: Mapping[str, tuple[int, ...]],
    env: Mapping[str, int],
    tp_rank: int,
    sources: Mapping[str, tuple[str, ...]],
    ep_rank: int = 0,
    families: Mapping[str, str] | None = None,
) -> BlockPlan:
    """This rank's plan for every tensor of one block at one geometry.

    ``env`` holds every symbol plus ``tp`` and ``ep``; ``shapes`` is keyed by rule name
    (family patterns included); ``families`` maps a family to its count symbol.
    """
    tp, ep = env["tp"], env.get("ep", 1)
    check_tp(tp, tp_rank)
    check_tp(ep, ep_rank, "ep")
    members = {f: member_range(env[count], ep, ep_rank) for f, count in (families or {}).items()}
    concrete, pattern = expand(rules, members)
    plans: dict[str, TensorPlan] = {}
    for r in concrete:
        full = shapes[pattern[r.name]]
        plans[r.name] = plan_tensor(block, r, full, env, tp, tp_rank, pattern[r.name])
        held = members.get(r.stacked) if r.stacked is not None else None
        if held is not None:  # a stacked family: only this ep rank's rows of axis 0
            p = plans[r.name]
            local = (len(held), *p.local_shape[1:])  # [E, ...] -> [E_r, ...]
            plans[r.name] = replace(p, local_shape=local, members=(held.start, len(held)))
    sharded = {n for n, p in plans.items() if p.kind != "replicated" and p.axis != 0}
    sharded_patterns = {pattern[n] for n in sharded}
    all_reduce = tp > 1 and any(sharded_patterns & set(s) for s in sources.values())
    for n in sorted(sharded):  # a replicated unit in a partial sum would be summed twice
        if all_reduce and plans[n].replicas > 1:
            p = plans[n]
            raise GeometryError(
                f"{block}: {n} splits axis {p.axis} on {p.unit} = {p.units} units, fewer than "
                f"tp {tp}: each unit would be summed by {p.replicas} ranks in the all-reduce"
            )
    return BlockPlan(block, tp, tp_rank, plans, all_reduce, ep, ep_rank, members)


def plan_tensor(
    block: str,
    r: TensorRule,
    full: tuple[int, ...],
    env: Mapping[str, int],
    tp: int,
    tp_rank: int,
    pattern: str = "",
) -> TensorPlan:
    kind, unit = r.shard.kind, r.shard.unit
    if kind == "replicated" or unit is None or not full:
        return TensorPlan(
            r.name, r.dtype, "replicated", None, 1, full, full, 0, 0, r.shape, r.stored,
            pattern or r.name, r.stored_singletons,
        )  # fmt: skip
    units = env[unit]
    axis = r.shard.resolved(len(full))
    if units < 1 or full[axis] % units != 0:
        raise GeometryError(
            f"{block}: {r.name} dim {axis} ({full[axis]}) does not split into "
            f"{unit} = {units} whole units"
        )
    if units % tp != 0 and tp % units != 0 and r.shard.pad is not None and full[axis] == units:
        return _padded_plan(block, r, full, units, axis, tp, tp_rank, r.shard.pad, pattern)
    if units % tp != 0 and tp % units != 0:
        raise GeometryError(
            f"{block}: {r.name} shards {kind} on {unit} = {units} units, "
            f"which tp {tp} does not divide (nor is tp a multiple of {unit}, "
            "which would replicate each unit on tp / units ranks)"
        )
    if units < tp and r.shard.never_replicated is not None:
        raise GeometryError(
            f"{block}: {r.name} shards {kind} on {unit} = {units} units, fewer than tp {tp}, "
            f"and {unit} is never replicated ({r.shard.never_replicated}); use a tp of at "
            f"most {units}"
        )
    held, replicas = rank_units(units, tp)
    local = full[axis] // units * held  # whole units of (dim / units) each
    shape = list(full)
    shape[axis] = local
    return TensorPlan(
        r.name, r.dtype, kind, unit, units, full, tuple(shape), axis,
        tp_rank // replicas * local, r.shape, r.stored, pattern or r.name, r.stored_singletons,
        replicas,
    )  # fmt: skip


def _padded_plan(
    block: str, r: TensorRule, full: tuple[int, ...], units: int, axis: int, tp: int,
    tp_rank: int, multiple: int, pattern: str,
) -> TensorPlan:  # fmt: skip
    """A unit of one row that tp does not divide, padded as vLLM pads a vocabulary: the
    rank's share of the padded size, its stored rows first (``core.vocab_pad``)."""
    share = vocab_pad.split(units, multiple, tp, tp_rank)
    if share is None:
        padded = vocab_pad.padded_size(units, multiple)
        raise GeometryError(
            f"{block}: {r.name} shards {r.shard.kind} on {r.shard.unit} = {units} units, which "
            f"tp {tp} does not divide, and padded to a multiple of {multiple} ({padded}) it "
            f"does not split into {tp} equal shares either"
        )
    shape = list(full)
    shape[axis] = share.per
    return TensorPlan(
        r.name, r.dtype, r.shard.kind, r.shard.unit, units, full, tuple(shape), axis,
        share.start, r.shape, r.stored, pattern or r.name, r.stored_singletons, 1, None,
        share.padded, share.zeros,
    )  # fmt: skip


def rank_units(units: int, tp: int) -> tuple[int, int]:
    """(units one rank holds, ranks holding each unit) for ``units`` split across ``tp``:
    ``(units / tp, 1)``, or ``(1, tp / units)`` when ``units < tp`` (vLLM's KV-head
    replication: rank r holds unit ``r // (tp / units)``). The caller has checked that one of
    the two divides the other."""
    if units >= tp:
        return units // tp, 1
    return 1, tp // units


@record
class Ranks:
    """Where this process sits: its tensor-parallel and expert-parallel rank and sizes."""

    tp_size: int = 1
    tp_rank: int = 0
    ep_size: int = 1
    ep_rank: int = 0

    def __post_init__(self) -> None:
        check_tp(self.tp_size, self.tp_rank)
        check_tp(self.ep_size, self.ep_rank, "ep")
