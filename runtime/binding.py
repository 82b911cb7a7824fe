"""The strict checks every generated binder runs, and the small ops its outputs use.

Invariants (the claims of a hand-written strict binder, made once for every block):
- the census counts every name in the layer: attention names (under the block prefix) and the
  rest; an attention name the block does not declare is refused, all of them in one error;
- an optional group (the DSA indexer) is all-or-nothing; a partial group is refused;
- a missing tensor names the layer and the tensor; a dtype mismatch says why; a shape or
  byte-count mismatch is refused; nothing is cast, padded or truncated;
- arrays are zero-copy views of the source bytes; only a concat allocates.
Trap: ``[n, 1, k]`` and ``[n, k]`` share their bytes, so a squeeze is shape-only and silent if
wrong; ``ops.concat_squeeze`` checks the squeezed dim really is 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from runtime.dtypes import DTYPES
from runtime.errors import BindError, GeometryError
from runtime.source import TensorSource

Array = npt.NDArray[Any]


@dataclass(frozen=True)
class ShardRule:
    kind: str  # "replicated" | "rows" | "cols"
    unit: str | None = None


@dataclass(frozen=True)
class TensorRule:
    name: str  # layer-relative
    dtype: str
    shape: str  # the symbolic shape as written in the spec, for messages
    shard: ShardRule
    group: str | None = None
    why_dtype: str | None = None


@dataclass(frozen=True)
class FieldRule:
    kind: str  # "verbatim" | "concat" | "transform"
    dtype: str  # the bound field's dtype
    layout: str  # across tp ranks: "replicated" | "rows" | "cols"
    parts: int  # a concat of row shards holds one block per source


@dataclass(frozen=True)
class GroupRule:
    name: str
    optional: bool
    why: str


@dataclass(frozen=True)
class ConstraintRule:
    name: str
    check: str
    why: str


@dataclass
class BindReport:
    index: int
    kind: str
    bound: int = 0
    self_attn_seen: int = 0
    non_attn_seen: int = 0
    unknown_self_attn: list[str] = field(default_factory=list)
    bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "bound": self.bound,
            "self_attn_seen": self.self_attn_seen,
            "non_attn_seen": self.non_attn_seen,
            "unknown_self_attn": list(self.unknown_self_attn),
            "bytes": self.bytes,
        }


def require(
    block: str, rule: ConstraintRule, values: Mapping[str, int], check: Callable[[], bool]
) -> None:
    """Evaluate one declared constraint; refuse, naming it and its ``why``, when it fails."""
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    try:
        ok = check()
    except GeometryError as e:  # e.g. H / tp with a remainder
        raise GeometryError(
            f"{block}: constraint {rule.name} ({rule.check}) cannot hold for {shown} ({e}): "
            f"{rule.why}"
        ) from None
    if not ok:
        raise GeometryError(
            f"{block}: constraint {rule.name} ({rule.check}) fails for {shown}: {rule.why}"
        )


def check_dims(block: str, shapes: Mapping[str, tuple[int, ...]]) -> None:
    for name, shape in shapes.items():
        if any(d < 1 for d in shape):
            raise GeometryError(
                f"{block}: {name} would have shape {list(shape)}; every dim must be >= 1"
            )


def census(
    layer: int, kind: str, prefix: str, names: Sequence[str], known: frozenset[str]
) -> BindReport:
    rep = BindReport(index=layer, kind=kind)
    for n in names:
        if n.startswith(prefix):
            rep.self_attn_seen += 1
            if n not in known:
                rep.unknown_self_attn.append(n)
        else:
            rep.non_attn_seen += 1
    rep.unknown_self_attn.sort()
    return rep


def bind_tensors(
    block: str,
    layer: int,
    prefix: str,
    src: TensorSource,
    rules: Sequence[TensorRule],
    groups: Mapping[str, GroupRule],
    shapes: Mapping[str, tuple[int, ...]],
) -> tuple[dict[str, Array], BindReport]:
    """Check a layer's tensors against the rules and return zero-copy arrays by name."""
    names = src.names()
    present = set(names)
    rep = census(layer, block, prefix, names, frozenset(r.name for r in rules))
    prefix_word = prefix.rstrip(".")
    if rep.unknown_self_attn:
        n_req = sum(1 for r in rules if r.group is None or not groups[r.group].optional)
        n_opt = len(rules) - n_req
        plus = f" (plus {n_opt} optional)" if n_opt else ""
        raise BindError(
            f"layer {layer}: {len(rep.unknown_self_attn)} unrecognised {prefix_word} tensor(s): "
            f"{rep.unknown_self_attn} — a {block} block has exactly {n_req}{plus} "
            "and this binder refuses to skip anything"
        )
    wanted: list[TensorRule] = []
    for g in groups.values():
        members = [r.name for r in rules if r.group == g.name]
        have = [m for m in members if m in present]
        if g.optional and have and len(have) != len(members):
            missing = [m for m in members if m not in present]
            raise BindError(
                f"layer {layer}: partial {g.name} group in a {block} block: missing {missing} "
                f"while {len(have)} of its {len(members)} tensors are present — the group is "
                f"all-or-nothing ({g.why})"
            )
    for r in rules:
        if r.group is not None and groups[r.group].optional and r.name not in present:
            continue
        wanted.append(r)
    missing = [r.name for r in wanted if r.name not in present]
    if missing:
        what = missing[0] if len(missing) == 1 else f"{len(missing)} tensors: {missing}"
        raise BindError(f"layer {layer}: missing {what} (a {block} block requires it)")

    out: dict[str, Array] = {}
    for r in wanted:
        out[r.name] = _check_one(block, layer, src, r, shapes[r.name])
        rep.bound += 1
        rep.bytes += out[r.name].nbytes
    return out, rep


def _check_one(
    block: str, layer: int, src: TensorSource, rule: TensorRule, want: tuple[int, ...]
) -> Array:
    t = src.get(rule.name)
    if t is None:
        raise BindError(f"layer {layer}: missing {rule.name} (a {block} block requires it)")
    if t.dtype != rule.dtype:
        why = rule.why_dtype or "casting it would change the numerics"
        raise BindError(
            f"layer {layer}: {rule.name} is {t.dtype} but a {block} block requires "
            f"{rule.dtype} — {why}"
        )
    if tuple(t.shape) != want:
        raise BindError(
            f"layer {layer}: {rule.name} has shape {list(t.shape)}, expected {list(want)} "
            f"({rule.shape})"
        )
    dt = DTYPES[rule.dtype]
    expect = dt.nbytes(want)
    if len(t.data) != expect:
        raise BindError(
            f"layer {layer}: {rule.name} is {len(t.data)} B, shape {list(want)} implies {expect} B"
        )
    if dt.numpy is None:
        raise BindError(
            f"layer {layer}: {rule.name} has dtype {rule.dtype}, which has no array form"
        )
    flat = np.frombuffer(t.data, dtype=dt.numpy)
    return flat.reshape(want)  # [prod(want)] -> want: the on-disk shape, zero-copy
