"""A block's outputs: each bound field and how it is made from the block's tensors — verbatim,
a concat, a stack over a family, or a declared transform (``generator.transforms``).

Invariants (each refusal is a ``SpecError`` naming file, path and line):
- a field name is an identifier that shadows no method of the weights class;
- an output reads only tensors of its block, a concat each at most once; a family is bound only
  by ``stack``, and a stack reads only members of its family;
- a concat joins tensors of one dtype, rank and group, and squeezes only a literal-1 dim;
  tensors sharded by different units join only along the one axis they all shard;
- a concat source read ``pairs_to_halves`` shards its rows by a unit (the reorder stays inside
  each unit, so it commutes with the shard; a unit's rows are even at every geometry checked,
  ``evaluate``); a concat's ``permute`` is an order of the joined field's axes, a stacked
  family's axis 0 first, and the field's layout axis follows it (``render._field_layout``).
Trap: neither reorder shows in shapes; an engine layout using one is proven by the engine's
own loader and its forward (vLLM's Llama 4 q/k: tests/vllm/test_vllm_tokens.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from specbind.core.ir import (
    TensorRule,
)
from specbind.generator import transforms
from specbind.generator.identifiers import FORBIDDEN_FIELDS, check_ident
from specbind.generator.yamlio import Located, PathKey


@dataclass(frozen=True)
class Output:
    field: str
    sources: tuple[str, ...]  # full names (family patterns for a stack)
    kind: Literal["verbatim", "concat", "transform", "stack"]
    axis: int = 0
    squeeze: int | None = None
    group: str | None = None
    transform: transforms.Transform | None = None
    family: str | None = None  # a stack: one slice per member of this family
    # a concat: the joined field's axes reordered after the join (and squeeze)
    permute: tuple[int, ...] | None = None
    # a concat: the sources (full names) whose rows are reordered from rotary pairs into
    # halves within each unit of their shard rule (``pairs_to_halves``)
    halves: frozenset[str] = frozenset()


def parse_output(
    doc: Located,
    field: str,
    raw: Any,
    prefix: str,
    by_full: dict[str, TensorRule],
    names: set[str],
) -> Output:
    path: PathKey = ("outputs", field)
    check_ident(doc, path, field, "output field", FORBIDDEN_FIELDS)
    if isinstance(raw, str):
        src = prefix + raw
        if src not in by_full:
            raise doc.error(path, f"output {field!r} reads unknown tensor {raw!r}")
        if by_full[src].family is not None:
            raise doc.error(path, f"{raw!r} is a family: bind it with `stack`")
        return Output(field, (src,), "verbatim", group=by_full[src].group)
    if "stack" in raw:
        return _stack(doc, path, field, raw, prefix, by_full)
    if "concat" not in raw:
        tf = transforms.parse(doc, path, raw, prefix, dict(by_full), names)
        srcs = tuple(o.tensor for o in tf.operands)
        for s in srcs:
            if by_full[s].family is not None:
                raise doc.error(path, f"{s.removeprefix(prefix)!r} is a family: use `stack`")
        return Output(field, srcs, "transform", group=by_full[srcs[0]].group, transform=tf)
    entries = raw["concat"]
    listed = [e if isinstance(e, str) else e["tensor"] for e in entries]
    sources, ts = _sources(doc, path, listed, prefix, by_full)
    for t in ts:
        if t.family is not None:
            raise doc.error(path, f"{t.name.removeprefix(prefix)!r} is a family: use `stack`")
    halves = frozenset(
        s for s, e, t in zip(sources, entries, ts, strict=True) if _halves(doc, path, e, t, s)
    )
    out = _concat(doc, path, field, raw, sources, ts)
    return replace(out, permute=_permute(doc, path, raw, out, ts), halves=halves)


def _halves(doc: Located, path: PathKey, entry: Any, t: TensorRule, full: str) -> bool:
    """A ``pairs_to_halves`` source reorders rows within each unit of its shard rule, so the
    reorder commutes with the shard: it must shard its rows (axis 0) by a unit."""
    if isinstance(entry, str):
        return False
    if t.shard.kind == "replicated" or t.shard.unit is None or t.shard.resolved(len(t.dims)):
        raise doc.error(
            (*path, "concat"),
            f"{entry['tensor']!r} reorders its rows within each unit of its shard rule "
            f"(pairs_to_halves), but it does not shard its rows by a unit "
            f"(shard {t.shard.kind}{'' if t.shard.unit is None else ': ' + t.shard.unit})",
        )
    return True


def _permute(
    doc: Located, path: PathKey, raw: Any, out: Output, ts: list[TensorRule]
) -> tuple[int, ...] | None:
    """A concat's ``permute``: an order of the joined field's axes (after any squeeze)."""
    if "permute" not in raw:
        return None
    axes = tuple(int(a) for a in raw["permute"])
    rank = len(ts[0].dims) - (out.squeeze is not None)
    if sorted(axes) != list(range(rank)):
        raise doc.error((*path, "permute"), f"{list(axes)} is not an order of {rank} axes")
    if any(t.stacked is not None for t in ts) and axes[0] != 0:
        raise doc.error((*path, "permute"), "a stacked family's axis 0 must stay first")
    return axes


def _sources(
    doc: Located,
    path: PathKey,
    names: list[str],
    prefix: str,
    by_full: dict[str, TensorRule],
) -> tuple[tuple[str, ...], list[TensorRule]]:
    sources = tuple(prefix + s for s in names)
    for i, s in enumerate(sources):
        if s not in by_full:
            raise doc.error((*path, "concat", i), f"concat reads unknown tensor {names[i]!r}")
    if len(set(sources)) != len(sources):
        raise doc.error((*path, "concat"), "concat names a tensor twice")
    return sources, [by_full[s] for s in sources]


def _concat(
    doc: Located, path: PathKey, field: str, raw: Any, sources: tuple[str, ...],
    ts: list[TensorRule], family: str | None = None,
) -> Output:  # fmt: skip
    if len({t.dtype for t in ts}) != 1:
        raise doc.error((*path, "concat"), "concat joins tensors of different dtypes")
    if len({len(t.dims) for t in ts}) != 1:
        raise doc.error((*path, "concat"), "concat joins tensors of different ranks")
    if len({t.group for t in ts}) != 1:
        raise doc.error((*path, "concat"), "concat joins tensors of different groups")
    rank = len(ts[0].dims)
    axis = int(raw.get("axis", 0))
    if axis >= rank:
        raise doc.error((*path, "axis"), f"axis {axis} is out of range for rank {rank}")
    if len({t.shard for t in ts}) != 1:
        _concat_across_units(doc, path, ts, axis)
    squeeze = raw.get("squeeze")
    if squeeze is not None:
        if squeeze >= rank or squeeze == axis:
            raise doc.error(
                (*path, "squeeze"),
                f"cannot squeeze dim {squeeze} of a rank-{rank} concat on axis {axis}",
            )
        for t in ts:
            dim = t.dims[squeeze]
            if dim.text.strip() != "1":
                raise doc.error(
                    (*path, "squeeze"),
                    f"{t.name} dim {squeeze} is {dim.text!r}, not a literal 1",
                )
    kind: Literal["concat", "stack"] = "concat" if family is None else "stack"
    return Output(field, sources, kind, axis, squeeze, ts[0].group, family=family)


def _concat_across_units(doc: Located, path: PathKey, ts: list[TensorRule], axis: int) -> None:
    """Sources sharded by different units join only along the axis they all shard: rank r's
    field is then each source's rank-r share in order ([q_r; k_r; v_r], vLLM's
    QKVParallelLinear layout). Any other mix (a replicated source, another axis) is refused."""
    rank = len(ts[0].dims)
    kinds = {t.shard.kind for t in ts}
    axes = {t.shard.resolved(rank) for t in ts}
    if "replicated" in kinds or len(axes) != 1:
        raise doc.error(
            (*path, "concat"),
            "concat joins tensors of different shard rules that do not all shard one axis",
        )
    if axes != {axis}:
        raise doc.error(
            (*path, "axis"),
            f"concat of tensors sharded by different units must join on their shard axis "
            f"{axes.pop()}, not {axis}",
        )


def _stack(
    doc: Located,
    path: PathKey,
    field: str,
    raw: Any,
    prefix: str,
    by_full: dict[str, TensorRule],
) -> Output:
    fam = raw["stack"]
    if "tensor" in raw:
        sources, ts = _sources(doc, path, [raw["tensor"]], prefix, by_full)
    else:
        sources, ts = _sources(doc, path, raw["concat"], prefix, by_full)
    for t in ts:
        if t.family != fam:
            raise doc.error(
                (*path, "stack"),
                f"stack over {fam!r} reads {t.name.removeprefix(prefix)!r}, "
                f"which is not a member of that family",
            )
    if len(ts) == 1:
        return Output(field, sources, "stack", 0, None, ts[0].group, family=fam)
    return _concat(doc, path, field, raw, sources, ts, fam)
