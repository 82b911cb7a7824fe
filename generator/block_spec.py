"""Block specs (``specs/blocks/*.yaml``) parsed into a ``Block``: symbols and derived symbols,
families, groups, tensors with their shard rules, constraints, markers and outputs
(``generator.output_spec``).

Invariants (each refusal is a ``SpecError`` naming file, path and line):
- every tensor is consumed by some output: nothing in a block can be silently dropped;
- the prefix and tensor names match whole (dotted words; one declared ``{family}`` at most);
- a shard unit is a symbol of the block (not derived), on an axis the tensor has; a stacked
  tensor's axis 0 is exactly its family's count and tp splits another axis;
- every group and every family has tensors; a family is never in a group; a tie joins two
  single tensors of one dtype, shape and shard; a marker is one required tensor;
- a linear weight is a 2-D ``[O, I]`` tensor named ``MODULE.weight``, or a stacked one that
  names its in and out axes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Literal

from specbind.core import algebra
from specbind.core.ir import (
    ConstraintRule,
    FamilyRule,
    GroupRule,
    ShardRule,
    SharedScaleRule,
    TensorRule,
    TieRule,
)
from specbind.core.patterns import placeholders
from specbind.generator.identifiers import (
    ast_text,
    check_ident,
    symbol_expr,
    validate_schema,
)
from specbind.generator.output_spec import Output, parse_output
from specbind.generator.yamlio import Located, PathKey

_FLOAT_DTYPES = frozenset({"BF16", "F16", "F32", "F64"})


@dataclass(frozen=True)
class Block:
    name: str
    file: str
    prefix: str
    doc: str
    symbols: dict[str, str]
    derived: dict[str, algebra.Expr]
    constraints: tuple[ConstraintRule, ...]
    markers: tuple[str, ...]  # full names
    groups: dict[str, GroupRule]
    tensors: tuple[TensorRule, ...]  # names are full (prefix included); dims parsed
    outputs: tuple[Output, ...]
    located: Located
    families: dict[str, FamilyRule] = dataclass_field(default_factory=dict)
    shared_scales: tuple[SharedScaleRule, ...] = ()
    # tensors whose shard declares `interleave: true`: the sharded axis is its units one after
    # another, each unit's share of every term together (not sections of the whole)
    interleaved: frozenset[str] = frozenset()

    def tensor(self, full_name: str) -> TensorRule:
        return next(t for t in self.tensors if t.name == full_name)

    def rel(self, full_name: str) -> str:
        return full_name.removeprefix(self.prefix)


_TENSOR_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.]|\{[a-z]\}){0,127}")
_PREFIX = re.compile(r"([A-Za-z0-9_]+\.)*")


def _names_fullmatch(doc: Located) -> None:
    """The schema's ``$`` also matches before a trailing newline; names must match whole."""
    d = doc.data
    if not _PREFIX.fullmatch(d["prefix"]):
        raise doc.error(("prefix",), f"prefix {d['prefix']!r} is not dotted words")
    for name in d["tensors"]:
        if not _TENSOR_NAME.fullmatch(name):
            raise doc.error(
                ("tensors", name),
                f"tensor name {name!r} is not letters, digits, _ and .",
            )


def _family_of(
    doc: Located, path: PathKey, name: str, families: dict[str, FamilyRule]
) -> str | None:
    found = placeholders(name)
    if not found:
        return None
    if len(found) > 1:
        raise doc.error(path, f"tensor name {name!r} holds more than one family placeholder")
    f = found[0]
    if f not in families:
        raise doc.error(path, f"family {{{f}}} in {name!r} is not declared under families")
    return str(f)


def _linear_axes(
    doc: Located, path: PathKey, raw: dict[str, Any], dims: tuple[algebra.Expr, ...]
) -> tuple[int, int] | None:
    """``linear: {in, out}`` on a stacked 3-D tensor: the axes holding the linear's I and O."""
    lin = raw.get("linear")
    if not isinstance(lin, dict):
        return None
    axes = (int(lin["in"]), int(lin["out"]))
    if raw.get("stacked") is None or len(dims) != 3 or sorted(axes) != [1, 2]:
        raise doc.error(
            (*path, "linear"),
            "linear {in, out} names axes 1 and 2 of a stacked [family, ., .] tensor",
        )
    return axes


def _stacked(
    doc: Located, path: PathKey, raw: dict[str, Any], dims: tuple[algebra.Expr, ...],
    shard: ShardRule, families: dict[str, FamilyRule],
) -> str | None:  # fmt: skip
    """``stacked: e``: axis 0 of this one stored tensor is the family ``e`` (exactly its count
    symbol), split whole across ep ranks; tp may split any other axis, never axis 0."""
    fam = raw.get("stacked")
    if fam is None:
        return None
    where: PathKey = (*path, "stacked")
    if fam not in families:
        raise doc.error(where, f"family {fam!r} is not declared under families")
    if placeholders(str(path[-1])):
        raise doc.error(where, "a stacked tensor is one stored tensor: no {e} in its name")
    count = families[fam].count
    if not dims or ast_text(dims[0]) != count:
        raise doc.error(where, f"a stacked tensor's axis 0 must be the family count {count!r}")
    if shard.kind != "replicated" and shard.resolved(len(dims)) == 0:
        raise doc.error(
            (*path, "shard"),
            "axis 0 of a stacked tensor holds the family: tp splits another axis",
        )
    return str(fam)


def parse_block(doc: Located) -> Block:
    validate_schema(doc, "block")
    _names_fullmatch(doc)
    d = doc.data
    name = check_ident(doc, ("block",), d["block"], "block name")
    prefix: str = d["prefix"]
    symbols: dict[str, str] = {}
    for s, text in d["symbols"].items():
        if s in algebra.RESERVED or s in {f"{r}_rank" for r in algebra.RESERVED}:
            # the generated planners take `tp_rank` and `ep_rank` as arguments
            raise doc.error(("symbols", s), f"symbol {s!r} is reserved (a parallel size or rank)")
        check_ident(doc, ("symbols", s), s, "symbol")
        symbols[s] = text
    derived: dict[str, algebra.Expr] = {}
    for s, text in (d.get("derived") or {}).items():
        check_ident(doc, ("derived", s), s, "derived symbol")
        if s in symbols or s in algebra.RESERVED:
            raise doc.error(("derived", s), f"derived symbol {s!r} shadows a symbol")
        derived[s] = symbol_expr(doc, ("derived", s), text, set(symbols) | set(derived), False)
    shape_names = set(symbols) | set(derived)

    families: dict[str, FamilyRule] = {}
    for f, v in (d.get("families") or {}).items():
        if v["count"] not in symbols:
            raise doc.error(
                ("families", f, "count"), f"family count {v['count']!r} is not a symbol"
            )
        families[f] = FamilyRule(f, v["count"], "experts")
    groups = {
        g: GroupRule(check_ident(doc, ("groups", g), g, "group"), bool(v["optional"]), v["why"])
        for g, v in (d.get("groups") or {}).items()
    }
    whole = _never_replicated(doc, d, set(symbols))
    padded = _padded(doc, d, set(symbols))
    tensors: list[TensorRule] = []
    for tname, t in d["tensors"].items():
        base: PathKey = ("tensors", tname)
        dims = tuple(
            symbol_expr(doc, (*base, "shape", i), dim, shape_names, False)
            for i, dim in enumerate(t["shape"])
        )
        shard = _shard(doc, (*base, "shard"), t["shard"], set(symbols), len(dims))
        if shard.unit in whole:
            shard = ShardRule(shard.kind, shard.unit, shard.axis, whole[shard.unit])
        if shard.unit in padded:
            if shard.kind != "rows" or str(t["shape"][0]) != shard.unit:
                raise doc.error(
                    (*base, "shard"),
                    f"{shard.unit!r} is padded: a tensor sharding on it splits rows of "
                    f"exactly {shard.unit} (one row a unit), as a vocabulary is split",
                )
            shard = ShardRule(
                shard.kind, shard.unit, shard.axis, shard.never_replicated, padded[shard.unit]
            )
        _shard_dim_expands(doc, (*base, "shard"), dims, shard, derived)
        group = t.get("group")
        if group is not None and group not in groups:
            raise doc.error((*base, "group"), f"group {group!r} is not declared under groups")
        stored = tuple(t.get("stored") or ())
        if t["dtype"] in stored:
            raise doc.error((*base, "stored"), f"{t['dtype']} is the bound dtype, not another")
        if stored and not ({t["dtype"], *stored} <= _FLOAT_DTYPES):
            raise doc.error(
                (*base, "stored"),
                "exact conversion is between float dtypes (BF16, F16, F32, F64)",
            )
        tie = None
        if "tie" in t:
            tie = TieRule(prefix + t["tie"]["to"], t["tie"]["config"])
        tensors.append(
            TensorRule(
                prefix + tname,
                t["dtype"],
                "[" + ", ".join(e.text for e in dims) + "]",
                shard,
                group,
                t.get("why_dtype"),
                stored,
                _family_of(doc, base, tname, families),
                bool(t.get("root", False)),
                tie,
                linear=bool(t.get("linear", False)),
                linear_axes=_linear_axes(doc, base, t, dims),
                stored_singletons=bool(t.get("stored_singletons", False)),
                stacked=_stacked(doc, base, t, dims, shard, families),
                dims=dims,
            )
        )
    by_full = {t.name: t for t in tensors}
    used_groups = {t.group for t in tensors}
    for g in groups:
        if g not in used_groups:
            raise doc.error(("groups", g), f"group {g!r} has no tensors")
    for t in tensors:
        if t.tie is None:
            continue
        tie_path: PathKey = ("tensors", t.name.removeprefix(prefix), "tie", "to")
        target = by_full.get(t.tie.to)
        if target is None:
            raise doc.error(
                tie_path,
                f"tie target {t.tie.to.removeprefix(prefix)!r} is not a tensor",
            )
        if (target.dtype, target.shape, target.shard) != (t.dtype, t.shape, t.shard):
            raise doc.error(tie_path, "a tied tensor needs its target's dtype, shape and shard")
        if target.family is not None or t.family is not None:
            raise doc.error(tie_path, "a tie joins two single tensors, not family members")
    for f in families:
        if not any(f in (t.family, t.stacked) for t in tensors):
            raise doc.error(("families", f), f"family {f!r} has no tensors")
    for t in tensors:
        if t.family is not None and t.group is not None:
            raise doc.error(
                ("tensors", t.name.removeprefix(prefix), "group"),
                "a family cannot be in a group: its members are all required, or the block is "
                "not this one",
            )

    constraints = []
    for i, c in enumerate(d.get("constraints") or []):
        where: PathKey = ("constraints", i)
        cname = check_ident(doc, (*where, "name"), c["name"], "constraint name")
        check = symbol_expr(
            doc, (*where, "check"), c["check"], shape_names | algebra.RESERVED, True
        )
        text = " ".join(str(c["check"]).split())  # as written, on one line
        constraints.append(ConstraintRule(cname, text, c["why"], check))

    markers_all = "all_required" in d["markers"]
    markers: tuple[str, ...]
    if markers_all:
        markers = tuple(t.name for t in tensors if not _optional(groups, t) and t.family is None)
    else:
        markers = tuple(prefix + m for m in d["markers"]["all_of"])
        for i, m in enumerate(markers):
            path: PathKey = ("markers", "all_of", i)
            if m not in by_full:
                raise doc.error(path, f"marker {m!r} is not a tensor of this block")
            if _optional(groups, by_full[m]):
                raise doc.error(path, f"marker {m!r} is in an optional group")
            if by_full[m].family is not None:
                raise doc.error(path, f"marker {m!r} is a family, not one tensor")
    if not markers:
        raise doc.error(("markers",), "a block needs at least one required marker tensor")

    outputs = tuple(
        parse_output(doc, f, v, prefix, by_full, shape_names) for f, v in d["outputs"].items()
    )
    consumed = {s for o in outputs for s in o.sources}
    for t in tensors:
        if t.name not in consumed:
            rel = t.name.removeprefix(prefix)
            raise doc.error(
                ("tensors", rel),
                f"tensor {rel!r} is read by no output (it would be dropped)",
            )
    for t in tensors:
        if (
            t.linear
            and t.linear_axes is None
            and (len(t.dims) != 2 or not t.name.endswith(".weight"))
        ):
            raise doc.error(
                ("tensors", t.name.removeprefix(prefix), "linear"),
                "a linear weight is a 2-D [O, I] tensor named MODULE.weight",
            )
    return Block(
        name, doc.file, prefix, d.get("doc", ""), symbols, derived, tuple(constraints),
        markers, groups, tuple(tensors), outputs, doc, families,
        _shared_scales(doc, prefix, by_full, families),
        frozenset(prefix + n for n, t in d["tensors"].items() if _interleave(t["shard"])),
    )  # fmt: skip


def _shard_units(d: dict[str, Any]) -> set[str | None]:
    """The unit each of the block's tensors shards on (rows, cols or a stacked unit)."""
    units: set[str | None] = set()
    for t in d["tensors"].values():
        sh = t["shard"]
        if isinstance(sh, dict):
            units.add(sh.get("rows") or sh.get("cols") or sh.get("unit"))
    return units


def _unit_map(doc: Located, d: dict[str, Any], key: str, symbols: set[str]) -> dict[str, Any]:
    """``key: {unit: ...}`` (``never_replicated``, ``padded``): each unit a symbol of the block
    that some tensor shards on."""
    raw: dict[str, Any] = d.get(key) or {}
    units = _shard_units(d)
    for u in raw:
        if u not in symbols:
            raise doc.error((key, u), f"{u!r} is not a symbol of this block")
        if u not in units:
            raise doc.error((key, u), f"no tensor of this block shards on {u!r}")
    return raw


def _never_replicated(doc: Located, d: dict[str, Any], symbols: set[str]) -> dict[str, str]:
    """``never_replicated: {unit: why}``: each a symbol some tensor shards on."""
    return dict(_unit_map(doc, d, "never_replicated", symbols))


def _padded(doc: Located, d: dict[str, Any], symbols: set[str]) -> dict[str, int]:
    """``padded: {unit: {multiple, why}}``: a tp that does not divide the unit pads it to the
    multiple and splits that (``core.vocab_pad``); each a symbol some tensor shards on."""
    return {u: int(v["multiple"]) for u, v in _unit_map(doc, d, "padded", symbols).items()}


def _shard_dim_expands(
    doc: Located, path: PathKey, dims: tuple[algebra.Expr, ...], shard: ShardRule,
    derived: dict[str, algebra.Expr],
) -> None:  # fmt: skip
    """A sharded dim holding ``max``/``min`` (itself or through a derived symbol) is refused:
    the whole-units proofs expand a sharded dim into terms over its unit, and an extremum
    does not expand (``max(H, 4) * D`` on ``{rows: H}`` is whole H units at some geometries
    only), so nothing could say rank r's rows are its units'."""
    if shard.unit is None or not dims:
        return
    dim = dims[shard.resolved(len(dims))]
    seen: set[str] = set()
    todo = [dim]
    while todo:
        e = todo.pop()
        if e.extremum:
            via = "" if e is dim else f" (through derived {e.text!r})"
            raise doc.error(
                path,
                f"dim {dim.text!r} shards on {shard.unit} but holds max/min{via}, which the "
                "whole-units proof cannot expand; shard a dim that is a product of its unit, "
                "or take the extremum in a geometry symbol",
            )
        for n in e.names & derived.keys() - seen:
            seen.add(n)
            todo.append(derived[n])


def _interleave(raw: Any) -> bool:
    return isinstance(raw, dict) and raw.get("interleave") is True


def _shared_scales(
    doc: Located,
    prefix: str,
    by_full: dict[str, TensorRule],
    families: dict[str, FamilyRule],
) -> tuple[SharedScaleRule, ...]:
    out = []
    for i, r in enumerate(doc.data.get("shared_scales") or []):
        names = tuple(prefix + n for n in r["tensors"])
        for j, n in enumerate(names):
            t = by_full.get(n)
            if t is None or not t.linear:
                raise doc.error(
                    ("shared_scales", i, "tensors", j),
                    f"{n.removeprefix(prefix)!r} is not a linear tensor of this block",
                )
        across = r.get("across")
        if across is not None and (
            across not in families or any(by_full[n].family != across for n in names)
        ):
            raise doc.error(
                ("shared_scales", i, "across"),
                f"across {across!r}: every tensor must be a member of that family",
            )
        out.append(SharedScaleRule(names, r["scale"], across, r["why"]))
    return tuple(out)


def _optional(groups: dict[str, GroupRule], t: TensorRule) -> bool:
    return t.group is not None and groups[t.group].optional


def _shard(doc: Located, path: PathKey, raw: Any, names: set[str], rank: int) -> ShardRule:
    if raw == "replicated":
        return ShardRule("replicated")
    kind: Literal["rows", "cols", "axis"]
    if "rows" in raw:
        kind, unit, axis = "rows", raw["rows"], 0
    elif "cols" in raw:
        kind, unit, axis = "cols", raw["cols"], -1
    else:
        kind, unit, axis = "axis", raw["unit"], int(raw["axis"])
    key = "unit" if kind == "axis" else kind
    if unit not in names:
        raise doc.error(
            (*path, key),
            f"shard unit {unit!r} is not a symbol of this block (nor may it be derived)",
        )
    if rank == 0:
        raise doc.error((*path, key), "a scalar cannot be sharded")
    if kind == "cols" and rank < 2:
        raise doc.error((*path, kind), "a column shard needs a tensor of rank 2 or more")
    if kind == "axis" and not -rank <= axis < rank:
        raise doc.error((*path, "axis"), f"axis {axis} is out of range for rank {rank}")
    return ShardRule(kind, unit, axis)
