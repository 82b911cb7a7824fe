"""Bind a block's quantized linear weights: the scheme's companions replace the BF16 rule, each
split with its linear so a rank reads only its own bytes and holds whole scale groups.

How a block binds quantized (every step generic; no model, block or tensor is named here):
1. ``runtime.quant.layers.layer_quant`` (above this wing: it reads the checkpoint's config)
   decides, per linear rule (``linear: true``) of the block in one layer,
   whether the checkpoint's config quantizes it, and cross-checks the names: an excluded
   module that carries a companion is refused naming the module; experts of one family must
   agree (a stacked ``w13`` has one layout);
2. ``quantize_rules`` replaces each quantized rule by the scheme's companions (the packed
   weight keeps the linear's name) and derives each companion's plan from the linear's
   ``[O, I]`` plan: the rank's window on each axis divided by the companion's ``div`` — whole,
   or a ``GeometryError`` naming the constraint (``(I / tp) % 16 == 0``);
3. after the census and reads, ``check_shared`` refuses scales the block declares shared that
   differ (unless allowed). Its verdict is the layer's, not the rank's: it reads every
   member's scalar scale (the rank's own from its arrays, the others' — 4 bytes each — from
   the layer), so every tp and ep rank refuses with the same message or none does;
4. ``companion_fields`` binds, for each field made of quantized sources, one field per
   companion made the same way as the field (verbatim, concat, stack): ``w13_weight_scale``
   [E_r, 2·Im/tp, X/16], ``w13_weight_scale_2`` [E_r, 2] (a scalar per joined source), and on
   request the CUTLASS-swizzled block scale and a dequantized BF16 copy, through the backend's
   ``Ops``;
5. a transform (an einsum, a scale) never reads packed codes: ``dequantized`` hands it BF16.
Trap: a concat of a quantized and an unquantized source has no one layout; it is refused.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from typing import Any, Protocol, cast

from specbind.core.errors import BindError, GeometryError, at
from specbind.core.ir import FieldRule, ShardKind, ShardRule, SharedScaleRule, TensorRule
from specbind.core.patterns import fill, index_of, member_of, parts, placeholders
from specbind.core.planning import BlockPlan, TensorPlan
from specbind.core.quant import CompanionRule, SchemeRule, window
from specbind.core.record import field, record, replace
from specbind.runtime.binder.checks import Array, BindReport, check_one, members, stored_name
from specbind.runtime.io.source import TensorSource

OUTPUTS = ("swizzled", "dequantized")  # optional bound layouts a caller may ask for


class QuantOps(Protocol):
    """The ``Ops`` methods quantized fields call (the numerics live with the kernels)."""

    def dequant_nvfp4(
        self, packed: Any, scale: Any, global_scale: Any, *, divide: bool, group: int
    ) -> Array: ...
    def dequant_fp8_block(
        self, weight: Any, scale_inv: Any, *, block: tuple[int, int]
    ) -> Array: ...
    def swizzle_blockscale(self, scale: Any) -> Array: ...
    def dequant_mxfp4(self, blocks: Any, scales: Any) -> Array: ...
    def dequant_scaled(self, weight: Any, scale: Any) -> Array: ...
    def dequant_int_group(self, packed: Any, scale: Any, zero: Any, *, bits: int) -> Array: ...
    def permute(self, a: Any, axes: tuple[int, ...], what: str) -> Array: ...


def quant_ops(ops: Any, what: str, method: str) -> QuantOps:
    if not callable(getattr(ops, method, None)):
        raise BindError(f"{what}: this backend's ops have no {method}, which the scheme needs")
    return cast(QuantOps, ops)


def module_of(rule_name: str) -> str:
    return rule_name.removesuffix(".weight")


def stored_module(stored: str, scheme: SchemeRule) -> str:
    """The module of a stored weight name: ``X.weight``, or the scheme's packed name
    (compressed-tensors' ``X.weight_packed``), is module ``X`` as configs list it."""
    packed = "." + scheme.weight.suffix
    return stored.removesuffix(packed) if stored.endswith(packed) else module_of(stored)


@record
class LayerQuant:
    """One slot of one layer: the scheme and which linear rules (by pattern) it quantizes."""

    scheme: SchemeRule
    weight_only: bool
    quantized: frozenset[str]  # linear rule names (family patterns) stored quantized
    outputs: frozenset[str] = frozenset()  # of OUTPUTS
    allow_unshared: bool = False
    companions: tuple[CompanionRule, ...] = field(default=())
    # stacked linears (rule name -> (in axis, out axis)): their companions are [E, O, ...]
    axes: tuple[tuple[str, tuple[int, int]], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "companions", self.scheme.companions_for(self.weight_only))

    @property
    def templated(self) -> bool:
        """Companions named from the parameter (``{param}_blocks``): the packed weight has a
        name of its own, and a transform's field binds the companions as stored beside it."""
        return bool(self.scheme.weight.template)

    def name(self, rule: str, c: CompanionRule) -> str:
        if c.template:
            return c.stored_name(rule)
        return rule if c.role == "weight" else f"{module_of(rule)}.{c.suffix}"

    def linear_axes(self, rule: str) -> tuple[int, int] | None:
        return dict(self.axes).get(rule)

    def by_role(self, rule: str, role: str) -> str | None:
        c = next((c for c in self.companions if c.role == role), None)
        return None if c is None else self.name(rule, c)


def quantize_rules(
    block: str, rules: tuple[TensorRule, ...], plan: BlockPlan, lq: LayerQuant | None
) -> tuple[tuple[TensorRule, ...], BlockPlan]:
    """The block's rules and this rank's plan with every quantized linear replaced by the
    scheme's companions."""
    if lq is None:
        return rules, plan
    out = quantized_rules(rules, lq)
    tensors: dict[str, TensorPlan] = {}
    for name, tp in plan.tensors.items():
        if tp.pattern not in lq.quantized:
            tensors[name] = tp
            continue
        axes = lq.linear_axes(tp.pattern)
        for c in lq.companions:
            if axes is None:
                p = _companion_plan(block, tp, c, lq)
            else:
                p = _stacked_plan(tp, c, lq, axes)
            tensors[p.name] = p
    return out, replace(plan, tensors=tensors)


def quantized_rules(rules: tuple[TensorRule, ...], lq: LayerQuant | None) -> tuple[TensorRule, ...]:
    """The rules with each quantized linear replaced by the scheme's companions (the packed
    weight keeps the linear's name; a scalar companion is replicated)."""
    if lq is None:
        return rules
    out: list[TensorRule] = []
    for r in rules:
        if r.name not in lq.quantized:
            out.append(r)
            continue
        for c in lq.companions:
            why = f"{lq.scheme.name} stores {c.suffix} as {c.dtype}"
            keep = not c.scalar and r.shard.kind != "replicated"
            shard = r.shard if keep else ShardRule("replicated")
            text = c.shape_text
            if r.linear_axes is not None:  # stacked: [E, ...] of the companion, O before I
                axis = _companion_axis(c, r.shard.resolved(len(r.dims or (0, 0, 0))), r)
                shard = (
                    ShardRule("axis", r.shard.unit, axis, r.shard.never_replicated)
                    if keep and axis
                    else shard
                )
                text = f"[{r.stacked} members, {c.shape_text[1:]}"
            out.append(
                TensorRule(
                    lq.name(r.name, c), c.dtype, text, shard, r.group, why, (), r.family,
                    stacked=r.stacked,
                )
            )  # fmt: skip
    return tuple(out)


def _companion_plan(block: str, tp: TensorPlan, c: CompanionRule, lq: LayerQuant) -> TensorPlan:
    o, i = tp.full_shape
    name = lq.name(tp.name, c)
    pattern = lq.name(tp.pattern, c)
    bad = [d for d in c.dims if not d.exact(o, i)]
    if bad:
        raise GeometryError(
            f"{block}: {module_of(tp.name)} [{o}, {i}] cannot be stored as {lq.scheme.name}: "
            f"{bad[0].text} is not whole ({c.suffix} {c.shape_text})"
        )
    full = c.shape(o, i)
    axis = tp.axis
    d = c.dims[axis] if axis < len(c.dims) else None
    if tp.kind == "replicated" or c.scalar or d is None or d.of != ("O" if axis == 0 else "I"):
        return TensorPlan(name, c.dtype, "replicated", None, 1, full, full, 0, 0,
                          c.shape_text, (), pattern)  # fmt: skip
    w = window(d, tp.full_shape[axis], tp.local_shape[axis], tp.offset)
    if w is None:
        sym = "O" if axis == 0 else "I"
        raise GeometryError(
            f"{block}: {module_of(tp.name)}: a rank holds {tp.local_shape[axis]} of {sym} = "
            f"{tp.full_shape[axis]}, not whole {d.div}-element units of {c.suffix} "
            f"({c.shape_text}): ({sym} / tp) % {d.div} == 0 fails — under {lq.scheme.name} "
            "a rank holds whole groups"
        )
    local = list(full)
    local[axis] = w[1]
    return TensorPlan(name, c.dtype, tp.kind, tp.unit, tp.units, full, tuple(local), axis,
                      w[2], c.shape_text, (), pattern, replicas=tp.replicas)  # fmt: skip


def _companion_axis(c: CompanionRule, axis: int, r: TensorRule) -> int:
    """The companion axis (after the leading family) that follows the stacked linear's sharded
    ``axis``: O's or I's dim; 0 when the companion has none (it is then replicated)."""
    assert r.linear_axes is not None
    which = "I" if axis == r.linear_axes[0] else "O"
    return next((k + 1 for k, d in enumerate(c.dims) if d.of == which), 0)


def _stacked_plan(
    tp: TensorPlan, c: CompanionRule, lq: LayerQuant, axes: tuple[int, int]
) -> TensorPlan:
    """A stacked linear's companion (``[E, O, ...]`` for a stored ``[E, I, O]``): this ep
    rank's members as the linear's, and the tp window of O (rows of each member) or of I
    (whole groups of columns), or replicated."""
    i, o = tp.full_shape[axes[0]], tp.full_shape[axes[1]]
    lead = tp.local_shape[0]  # this ep rank's members
    full = (tp.full_shape[0], *c.shape(o, i))
    local = [lead, *c.shape(o, i)]
    name, pattern = lq.name(tp.name, c), lq.name(tp.pattern, c)
    which = "I" if tp.axis == axes[0] else "O"
    at = next((k for k, d in enumerate(c.dims) if d.of == which), None)
    if tp.kind == "replicated" or c.scalar or at is None:
        return TensorPlan(name, c.dtype, "replicated", None, 1, full, tuple(local), 0, 0,
                          c.shape_text, (), pattern, members=tp.members)  # fmt: skip
    w = window(c.dims[at], tp.full_shape[tp.axis], tp.local_shape[tp.axis], tp.offset)
    if w is None:
        raise GeometryError(
            f"{module_of(tp.name)}: a rank holds {tp.local_shape[tp.axis]} of {which} = "
            f"{tp.full_shape[tp.axis]}, not whole {c.dims[at].div}-element units of "
            f"{c.suffix} ({c.shape_text}): under {lq.scheme.name} a rank holds whole groups"
        )
    local[at + 1] = w[1]
    kind: ShardKind = "cols" if at + 1 == len(full) - 1 else "axis"
    return TensorPlan(name, c.dtype, kind, tp.unit, tp.units, full, tuple(local), at + 1, w[2],
                      c.shape_text, (), pattern, members=tp.members)  # fmt: skip


def check_shared(
    block: str,
    layer: int,
    host: Mapping[str, Array],
    shared: Sequence[SharedScaleRule],
    plan: BlockPlan,
    lq: LayerQuant | None,
    *,
    src: TensorSource,
    rules: Sequence[TensorRule],
    counts: Mapping[str, int],
    report: BindReport,
) -> None:
    """Refuse scales the block declares shared that differ (bit for bit), unless allowed.

    The verdict is the whole layer's, the same on every tp and ep rank: every member's scale
    is compared, read from ``src`` (the layer, ``rules`` its quantized rules, ``counts`` the
    family sizes) where this rank does not hold it in ``host``, and checked as its owner checks
    it; those extra reads are one scalar per member and companion, counted in
    ``report.verdict_bytes``. The refusal names the groups' values in member order, so every
    rank words it the same."""
    if lq is None or lq.allow_unshared:
        return
    by_pattern = {r.name: r for r in rules}
    shapes = {tp.pattern: tp.full_shape for tp in plan.tensors.values()}  # one per pattern
    role = {"global": "global_scale", "input": "input_scale"}
    for rule in shared:
        pats = [lq.by_role(t, role[rule.scale]) for t in rule.tensors if t in lq.quantized]
        names = [p for p in pats if p is not None]
        if not names:
            continue
        groups: list[list[tuple[str, str]]]  # (member name, its pattern)
        if rule.across is not None:
            ms = range(counts[rule.across])
            groups = [[(fill(n, i), n) for i in ms for n in names]]
        else:
            fams = {f for n in names for f in placeholders(n) if f in counts}
            if fams:
                ms = range(counts[fams.pop()])
                groups = [[(fill(n, i), n) for n in names] for i in ms]
            else:
                groups = [[(n, n) for n in names]]
        for g in groups:
            vals = {n: _scale(n, pat, host, src, by_pattern, shapes, block, layer, report)
                    for n, pat in g}  # fmt: skip
            if len({v.reshape(-1).tobytes() for v in vals.values()}) > 1:
                raise BindError(
                    f"{at(layer)}: {rule.scale} scales that must be one value differ: "
                    f"{_differ(vals, partial(stored_name, src))} — {rule.why} "
                    "(bind --allow-unshared-scales accepts them)"
                )


def _scale(
    name: str, pattern: str, host: Mapping[str, Array], src: TensorSource,
    rules: Mapping[str, TensorRule], shapes: Mapping[str, tuple[int, ...]], block: str,
    layer: int, report: BindReport,
) -> Array:  # fmt: skip
    """One member's scale: this rank's array, or read and checked as its owner checks it (a
    scalar companion is replicated: every member's full shape is its plan's)."""
    if name in host:
        return host[name]
    scratch = BindReport(layer, block)
    arr = check_one(block, layer, src, rules[pattern], name, shapes[pattern], scratch)
    report.verdict_bytes += scratch.bytes
    return arr


SHOWN = 3  # members named in a refusal beside the first holder of the common value


def _differ(vals: Mapping[str, Array], named: Callable[[str], str] = str) -> str:
    """``k of n differ from A = a: B = b, …``: the common value (the first in member order on
    a tie) and the first members that differ from it, in member order (``named``: a name as
    the checkpoint stores it)."""
    bits = {n: v.reshape(-1).tobytes() for n, v in vals.items()}
    common = Counter(bits.values()).most_common(1)[0][0]
    first = next(n for n, b in bits.items() if b == common)
    odd = [n for n, b in bits.items() if b != common]
    shown = ", ".join(f"{named(n)} = {_value(vals[n])!r}" for n in odd[:SHOWN])
    more = f" (and {len(odd) - SHOWN} more)" if len(odd) > SHOWN else ""
    return (
        f"{len(odd)} of {len(bits)} differ from {named(first)} = {_value(vals[first])!r}: "
        f"{shown}{more}"
    )


def _value(a: Array) -> float:
    return float(a.reshape(-1)[0])


def dequantized(
    t: Mapping[str, Array], lq: LayerQuant | None, ops: Any, what: str,
    only: Sequence[str] | None = None,
) -> Mapping[str, Array]:  # fmt: skip
    """``t`` with every quantized linear (of ``only``, when given) as BF16 ``[O_r, I_r]``, for
    transforms and the optional dequantized output."""
    if lq is None:
        return t
    out = dict(t)
    names = list(t) if only is None else list(only)
    if lq.templated and only is None:  # the linear's own name is not stored, its packed weight
        names += [p for p in lq.quantized if lq.name(p, lq.scheme.weight) in t and p not in t]
    for name in names:
        for pat in lq.quantized:
            if member_of(name, pat):
                out[name] = _dequant(t, name, pat, lq, ops, what)
    return out


def _names_of(patterns: Sequence[str], t: Mapping[str, Array]) -> list[str]:
    return [n for n in t if any(member_of(n, p) for p in patterns)]


def _concrete(pattern: str, name: str, rule_pat: str) -> str:
    """The companion ``pattern`` of rule ``rule_pat`` for the member ``name`` is."""
    i = index_of(rule_pat, name) if parts(rule_pat)[1] is not None else None
    return pattern if i is None else fill(pattern, i)


def _dequant(
    t: Mapping[str, Array], name: str, pat: str, lq: LayerQuant, ops: Any, what: str
) -> Array:
    d = lq.scheme.dequant
    scale = lq.by_role(pat, "block_scale")
    assert scale is not None
    s = t[_concrete(scale, name, pat)]
    if d.op == "dequant_mxfp4":
        q = quant_ops(ops, what, d.op)
        w = q.dequant_mxfp4(t[lq.name(name, lq.scheme.weight)], s)  # [..., O_r, I_r]
        axes = lq.linear_axes(pat)
        if axes is None:
            return w
        # [E_r, O_r, I_r] -> the stored linear's own axis order ([E_r, I_r, O_r] for x @ W)
        order = tuple(0 if k == 0 else 2 if k == axes[0] else 1 for k in range(3))
        return quant_ops(ops, what, "permute").permute(w, order, what)
    if d.op == "dequant_scaled":  # one scale per row ([O_r, 1]) or per linear ([] / [1])
        return quant_ops(ops, what, d.op).dequant_scaled(t[name], s)
    if d.op == "dequant_int_group":  # codes in int32 words, a scale (and zero) per group
        zp = lq.by_role(pat, "zero_point")
        z = None if zp is None else t[_concrete(zp, name, pat)]
        return quant_ops(ops, what, d.op).dequant_int_group(t[name], s, z, bits=d.bits)
    if d.op == "dequant_fp8_block":
        q = quant_ops(ops, what, d.op)
        if str(s.dtype) != "float32":
            s = ops.widen(s)  # a BF16 block scale (compressed-tensors) widens exactly to F32
        return q.dequant_fp8_block(t[name], s, block=(d.group[0], d.group[1]))
    g = lq.by_role(pat, "global_scale")
    assert g is not None
    gs = t[_concrete(g, name, pat)].reshape(())  # [] or [1] -> []: one F32 value
    q = quant_ops(ops, what, d.op)
    return q.dequant_nvfp4(t[name], s, gs, divide=d.global_op == "divide", group=d.group[0])


@record(frozen=False)
class QuantFields:
    """Fields bound beside a block's own: the companions of its quantized fields."""

    arrays: dict[str, Any] = field(default_factory=dict)  # the backend's arrays
    rules: dict[str, FieldRule] = field(default_factory=dict)  # the packed fields' rules too


def companion_fields(
    layer: int,
    fields: Mapping[str, FieldRule],
    sources: Mapping[str, tuple[str, ...]],
    t: Mapping[str, Array],
    plan: BlockPlan,
    ops: Any,
    lq: LayerQuant | None,
) -> QuantFields | None:
    """For every field made of quantized sources: the packed field's rule, one field per
    companion joined as the field is, and the requested optional layouts."""
    if lq is None:
        return None
    out = QuantFields()
    for fname, f in fields.items():
        srcs = sources[fname]
        quant = [s in lq.quantized for s in srcs]
        if f.kind == "transform" and lq.templated and len(srcs) == 1 and quant[0]:
            _as_stored(fname, f, srcs[0], t, plan, lq, out)  # beside the field, from BF16
            continue
        if f.kind in ("transform", "tie") or not any(quant):
            continue
        if not all(quant):
            plain = [s for s, q in zip(srcs, quant, strict=True) if not q]
            raise BindError(
                f"{at(layer)}: {fname} joins quantized and unquantized linears ({plain} are "
                "not quantized); one field has one layout"
            )
        if not all(s in t or f.family is not None for s in srcs):
            continue  # an absent optional field
        out.rules[fname] = replace(f, dtype=lq.scheme.weight.dtype)
        for c in lq.companions:
            if c.role == "weight":
                continue
            arr = _join(f, [lq.name(s, c) for s in srcs], not c.scalar, t, plan, ops)
            key = f"{fname}_{c.suffix}"
            out.arrays[key] = arr
            out.rules[key] = _companion_rule(f, c)
        if "swizzled" in lq.outputs and lq.scheme.swizzle is not None:
            q = quant_ops(ops, f"{at(layer)}: {fname}", "swizzle_blockscale")
            key = f"{fname}_{lq.scheme.swizzle}_swizzled"
            out.arrays[key] = q.swizzle_blockscale(out.arrays[f"{fname}_{lq.scheme.swizzle}"])
            sw = out.rules[f"{fname}_{lq.scheme.swizzle}"].dtype  # the swizzle keeps its dtype
            out.rules[key] = FieldRule("transform", sw, "replicated", 1)
        if "dequantized" in lq.outputs:
            deq = dequantized(t, lq, ops, f"{at(layer)}: {fname}", only=_names_of(srcs, t))
            key = f"{fname}_bf16"
            out.arrays[key] = _join(f, list(srcs), True, deq, plan, ops)
            out.rules[key] = replace(f, kind="transform", dtype="BF16")
    return out


def _as_stored(
    fname: str, f: FieldRule, src: str, t: Mapping[str, Array], plan: BlockPlan,
    lq: LayerQuant, out: QuantFields,
) -> None:  # fmt: skip
    """Each companion of a transform's one quantized source as this rank read it
    (``w13_blocks`` [E_r, O_r, I/32, 16], ``w13_scales`` [E_r, O_r, I/32]: vLLM's MXFP4 MoE
    layout); the field itself is made from the dequantized linear."""
    for c in lq.companions:
        n = lq.name(src, c)
        p = plan.tensors[n]
        key = f"{fname}_{c.suffix}"
        out.arrays[key] = t[n]
        axis = -1 if p.kind == "cols" else p.axis
        out.rules[key] = FieldRule("verbatim", c.dtype, p.kind, 1, axis, f.family)


def quant_metadata(
    scheme: str, weight_only: bool, outputs: Collection[str],
    values: Collection[tuple[str, int]] = (), sym: bool = False,
) -> str:  # fmt: skip
    """What an ``--out`` file records of a quantized bind (metadata ``quant``), so a reload
    knows which fields are packed and which companions may sit beside them (a scheme the
    config sets: its ``params`` values and ``symmetric``, recorded only when set)."""
    doc: dict[str, Any] = {"scheme": scheme, "weight_only": weight_only, "outputs": sorted(outputs)}
    if values:
        doc["params"] = dict(values)
    if sym:
        doc["symmetric"] = True
    return json.dumps(doc, sort_keys=True)


def quantized_names(field: str, lq: LayerQuant | None) -> list[str]:
    """Every name ``companion_fields`` may add beside ``field`` (a superset: a field whose
    sources are not quantized adds none), known before any tensor is read."""
    return list(quantized_fields(field, lq))


def quantized_fields(field: str, lq: LayerQuant | None) -> dict[str, str]:
    """``quantized_names`` with each name's dtype."""
    if lq is None:
        return {}
    keep = lq.templated  # the packed weight is bound as its own field beside a transform's
    out = {f"{field}_{c.suffix}": c.dtype for c in lq.companions if keep or c.role != "weight"}
    if "swizzled" in lq.outputs and lq.scheme.swizzle is not None:
        out[f"{field}_{lq.scheme.swizzle}_swizzled"] = out[f"{field}_{lq.scheme.swizzle}"]
    if "dequantized" in lq.outputs:
        out[f"{field}_bf16"] = "BF16"
    return out


def _companion_rule(f: FieldRule, c: CompanionRule) -> FieldRule:
    """The field rule of a companion bound beside field ``f``: as ``f``, but replicated where
    the companion has no dim along the axis ``f`` splits (a channel scale ``[O, 1]`` of a
    row-parallel linear: every rank holds it whole, as vLLM's ChannelQuantScaleParameter)."""
    if c.scalar:  # one value per joined source: [parts], or [E_r, parts] when stacked
        return FieldRule(f.kind, c.dtype, "replicated", 1, 0, f.family, 0)
    if f.layout != "replicated":
        last = 2 if f.family is not None else 1  # [E, O, I] or [O, I]: I is the last axis
        which = "I" if f.layout == "cols" or (f.layout == "axis" and f.axis == last) else "O"
        if all(d.of != which for d in c.dims):
            return replace(f, dtype=c.dtype, layout="replicated", axis=0)
    return replace(f, dtype=c.dtype)


def _join(
    f: FieldRule, names: list[str], shaped: bool, t: Mapping[str, Array], plan: BlockPlan,
    ops: Any,
) -> Array:  # fmt: skip
    """``names`` joined as field ``f`` joins its sources; scalars become one value each."""

    def prep(a: Array) -> Array:  # one value per source: [] or [1] -> [1]; [2] -> [1, 2]
        return a if shaped else a.reshape(1) if a.size == 1 else a.reshape(1, *a.shape)

    axis = f.join if shaped else 0
    if f.family is not None:
        groups = [[prep(a) for a in members(t, n, f.family, plan)] for n in names]
        stacked: Array = ops.stack(groups, axis=axis, squeeze=None)
        if not shaped and len(names) == 1:  # [E_r, 1] -> [E_r]: one per member ([E_r, 2])
            return stacked.reshape(stacked.shape[0], *stacked.shape[2:])
        return stacked
    if f.kind == "verbatim":
        return t[names[0]]  # as stored: ModelOpt's scalar [] stays [], compressed-tensors' [1]
    joined: Array = ops.concat_squeeze([prep(t[n]) for n in names], axis=axis, squeeze=None)
    return joined


def for_transforms(
    layer: int,
    fields: Mapping[str, FieldRule],
    sources: Mapping[str, tuple[str, ...]],
    t: Mapping[str, Array],
    ops: Any,
    lq: LayerQuant | None,
) -> Mapping[str, Array]:
    """``t`` with the quantized linears that transforms read dequantized to BF16: an einsum or
    a scale never sees packed codes."""
    if lq is None:
        return t
    read = [s for n, f in fields.items() if f.kind == "transform" for s in sources[n]]
    stored = [s for s in read if lq.templated and s in lq.quantized]  # named apart on disk
    return dequantized(t, lq, ops, at(layer), only=_names_of(read, t) + stored)


def _o_i(shape: tuple[int, ...], r: TensorRule) -> tuple[int, int]:
    """A linear's (O, I) from its stored shape: [O, I], or a stacked one's axes."""
    if r.linear_axes is None:
        return shape[0], shape[1]
    return shape[r.linear_axes[1]], shape[r.linear_axes[0]]


def storable(scheme: SchemeRule, block: Any, geometry: Any) -> LayerQuant | None:
    """Every linear of ``block`` (a model table's entry) the scheme can store at ``geometry``
    (whole groups at tp 1), as a ``synth --quant`` checkpoint would hold them."""
    shapes = block.shapes(geometry)
    names = frozenset(
        r.name
        for r in block.tensors
        if r.linear
        and scheme.holds(r.linear_axes is not None)
        and all(d.exact(*_o_i(shapes[r.name], r)) for c in scheme.companions for d in c.dims)
    )
    if not names:
        return None
    # a stacked linear's companions are planned from its [E, I, O] axes, as layer_quant gives
    axes = tuple(
        (r.name, r.linear_axes) for r in block.tensors if r.linear_axes and r.name in names
    )
    return LayerQuant(scheme, False, names, axes=axes)
