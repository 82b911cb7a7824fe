"""Block and model specs: JSON-Schema validation, then the semantic checks the schema cannot say.

Invariants (each refusal is a ``SpecError`` naming file, path and line):
- every identifier that reaches generated code (symbols, fields, block names) is a Python
  identifier, not a keyword, not a builtin, not dunder; tensor names reach code only via repr;
- every shape and check parses under the whitelist algebra and uses only declared symbols;
- every tensor is consumed by some output: nothing in a block can be silently dropped;
- a concat joins tensors of one dtype, rank and group, and squeezes only a literal-1 dim;
- a model binds every symbol of each block it uses to one of its geometry symbols.
"""

from __future__ import annotations

import builtins
import json
import keyword
import re
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import jsonschema

from specbind.core import algebra
from specbind.core.errors import AlgebraError, SpecbindError
from specbind.core.geometry import computed as geometry_computed
from specbind.core.ir import (
    ConstraintRule,
    FamilyRule,
    GeometryField,
    GroupRule,
    LayerGroupRule,
    NameRule,
    ShardRule,
    SharedScaleRule,
    SlotRule,
    SynthList,
    SynthRule,
    TensorRule,
    TieRule,
    UnboundRule,
)
from specbind.core.patterns import placeholders
from specbind.core.polynomial import can_equal
from specbind.generator import schedules, transforms
from specbind.generator.yamlio import Located, PathKey

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "specs" / "schema"
# Names a symbol may not take: symbols become locals and attributes in generated functions
# (``H = g.H // g.tp``), next to these module names and locals.
_GENERATED_NAMES = {"g", "t", "p", "a", "b", "x", "y", "ops", "algebra_ops", "np", "src", "layer",
                    "rank", "sharded", "report", "weights", "tp", "ep", "self", "cls", "values",
                    "env", "plan", "matches", "ranks", "flags", "counts", "e"}  # fmt: skip
_FORBIDDEN_IDENTS = frozenset(dir(builtins)) | _GENERATED_NAMES
# A field is only ever an attribute and a keyword argument; it may not shadow a method.
_FORBIDDEN_FIELDS = frozenset({"arrays", "self"})
_FLOAT_DTYPES = frozenset({"BF16", "F16", "F32", "F64"})


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


@dataclass(frozen=True)
class BlockUse:
    block: str
    symbols: dict[str, str]


@dataclass(frozen=True)
class Model:
    name: str
    file: str
    doc: str
    pattern: str
    prefixes: tuple[str, ...]
    geometry: tuple[GeometryField, ...]
    blocks: tuple[BlockUse, ...]
    located: Located
    layer_groups: tuple[LayerGroupRule, ...] = ()
    slots: tuple[SlotRule, ...] = ()
    globals: str | None = None
    unbound: tuple[UnboundRule, ...] = ()
    layer_count: str | None = None
    mtp_count: str | None = None
    flags: tuple[str, ...] = ()
    synth: SynthRule | None = None
    real_layers: int = 0  # the real model's decoder layers (config layer_count)
    real_mtp: int = 0
    names: tuple[NameRule, ...] = ()
    model_types: tuple[str, ...] = ()  # config.json model_type values of its checkpoints
    default: bool = False  # used by a command given neither --model nor a checkpoint
    constraints: tuple[ConstraintRule, ...] = ()  # over geometry symbols, this model alone
    extends: str | None = None  # the base model this spec is merged onto (generator/extends.py)
    dtypes: tuple[str, ...] = ("BF16",)  # the half dtypes its checkpoints may be stored in

    def values(self) -> dict[str, int]:
        return {s.name: s.value for s in self.geometry}


@cache
def _schema(kind: str) -> dict[str, Any]:
    if kind == "engine_block":  # an engine's block layout: a definition of the engine schema
        engine = _schema("engine")
        return {"$schema": engine["$schema"], "$defs": engine["$defs"],
                **engine["$defs"]["block_layout"]}  # fmt: skip
    loaded: dict[str, Any] = json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text())
    return loaded


def validate_schema(
    doc: Located, kind: Literal["block", "model", "scheme", "engine", "engine_block"]
) -> None:
    validator = jsonschema.Draft202012Validator(_schema(kind))
    errors = sorted(
        validator.iter_errors(doc.data), key=lambda e: (list(map(str, e.path)), e.message)
    )
    if not errors:
        return
    err = jsonschema.exceptions.best_match(errors) or errors[0]
    path: PathKey = tuple(err.absolute_path)
    if "propertyNames" in err.absolute_schema_path and isinstance(err.instance, str):
        path = (*path, err.instance)  # a bad key: point at the key's own line
    raise doc.error(path, f"schema: {_short(err)}")


def _short(err: jsonschema.ValidationError) -> str:
    msg = str(err.message)
    if len(msg) > 200:
        msg = msg[:200] + "…"
    return msg


def check_ident(
    doc: Located, path: PathKey, name: str, what: str, forbidden: frozenset[str] = _FORBIDDEN_IDENTS
) -> str:
    if (
        not name.isidentifier()
        or keyword.iskeyword(name)
        or keyword.issoftkeyword(name)
        or name.startswith("_")
        or name in forbidden
    ):
        raise doc.error(path, f"{what} {name!r} is not a usable identifier")
    return name


def _expr(
    doc: Located, path: PathKey, text: str | int, allowed: set[str], check: bool
) -> algebra.Expr:
    try:
        e = algebra.parse(text, check=check)
    except AlgebraError as exc:
        raise doc.error(path, str(exc)) from None
    unknown = sorted(e.names - allowed)
    if unknown:
        raise doc.error(path, f"unknown symbol(s) {', '.join(unknown)} in {str(text)!r}")
    return e


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
                ("tensors", name), f"tensor name {name!r} is not letters, digits, _ and ."
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
            (*path, "shard"), "axis 0 of a stacked tensor holds the family: tp splits another axis"
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
        derived[s] = _expr(doc, ("derived", s), text, set(symbols) | set(derived), False)
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
    tensors: list[TensorRule] = []
    for tname, t in d["tensors"].items():
        base: PathKey = ("tensors", tname)
        dims = tuple(
            _expr(doc, (*base, "shape", i), dim, shape_names, False)
            for i, dim in enumerate(t["shape"])
        )
        shard = _shard(doc, (*base, "shard"), t["shard"], set(symbols), len(dims))
        if shard.unit in whole:
            shard = ShardRule(shard.kind, shard.unit, shard.axis, whole[shard.unit])
        _shard_dim_expands(doc, (*base, "shard"), dims, shard, derived)
        group = t.get("group")
        if group is not None and group not in groups:
            raise doc.error((*base, "group"), f"group {group!r} is not declared under groups")
        stored = tuple(t.get("stored") or ())
        if t["dtype"] in stored:
            raise doc.error((*base, "stored"), f"{t['dtype']} is the bound dtype, not another")
        if stored and not ({t["dtype"], *stored} <= _FLOAT_DTYPES):
            raise doc.error(
                (*base, "stored"), "exact conversion is between float dtypes (BF16, F16, F32, F64)"
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
                tie_path, f"tie target {t.tie.to.removeprefix(prefix)!r} is not a tensor"
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
        check = _expr(doc, (*where, "check"), c["check"], shape_names | algebra.RESERVED, True)
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
        _output(doc, f, v, prefix, by_full, shape_names) for f, v in d["outputs"].items()
    )
    consumed = {s for o in outputs for s in o.sources}
    for t in tensors:
        if t.name not in consumed:
            rel = t.name.removeprefix(prefix)
            raise doc.error(
                ("tensors", rel), f"tensor {rel!r} is read by no output (it would be dropped)"
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


def _never_replicated(doc: Located, d: dict[str, Any], symbols: set[str]) -> dict[str, str]:
    """``never_replicated: {unit: why}``: each a symbol some tensor shards on."""
    raw: dict[str, str] = d.get("never_replicated") or {}
    units = set()
    for t in d["tensors"].values():
        sh = t["shard"]
        if isinstance(sh, dict):
            units.add(sh.get("rows") or sh.get("cols") or sh.get("unit"))
    for u in raw:
        if u not in symbols:
            raise doc.error(("never_replicated", u), f"{u!r} is not a symbol of this block")
        if u not in units:
            raise doc.error(("never_replicated", u), f"no tensor of this block shards on {u!r}")
    return dict(raw)


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
    doc: Located, prefix: str, by_full: dict[str, TensorRule], families: dict[str, FamilyRule]
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


def ast_text(e: algebra.Expr) -> str:
    import ast

    return ast.unparse(e.node)


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


def _output(
    doc: Located, field: str, raw: Any, prefix: str, by_full: dict[str, TensorRule], names: set[str]
) -> Output:
    path: PathKey = ("outputs", field)
    check_ident(doc, path, field, "output field", _FORBIDDEN_FIELDS)
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
    sources, ts = _sources(doc, path, raw["concat"], prefix, by_full)
    for t in ts:
        if t.family is not None:
            raise doc.error(path, f"{t.name.removeprefix(prefix)!r} is a family: use `stack`")
    return _concat(doc, path, field, raw, sources, ts)


def _sources(
    doc: Located, path: PathKey, names: list[str], prefix: str, by_full: dict[str, TensorRule]
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
                    (*path, "squeeze"), f"{t.name} dim {squeeze} is {dim.text!r}, not a literal 1"
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
    doc: Located, path: PathKey, field: str, raw: Any, prefix: str, by_full: dict[str, TensorRule]
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


def parse_model(doc: Located, blocks: dict[str, Block]) -> Model:
    validate_schema(doc, "model")
    d = doc.data
    geometry = tuple(
        GeometryField(
            check_ident(doc, ("geometry", n), n, "geometry symbol"),
            g.get("config"),
            int(g["value"]),
            int(g.get("min", 1)),
            g.get("doc", ""),
            tuple(g.get("also") or ()),
            None if g.get("default") is None else str(g["default"]),
            None if g.get("expr") is None else str(g["expr"]),
        )
        for n, g in d["geometry"].items()
    )
    _geometry_expressions(doc, geometry)
    for name in (d.get("synth") or {}).get("tiny") or {}:
        computed_by = next((g.expr for g in geometry if g.name == name and g.expr), None)
        if computed_by is not None:
            raise doc.error(
                ("synth", "tiny", name), f"{name} is computed ({computed_by}): it takes no value"
            )
    for g in geometry:
        if g.also and g.config is None:
            raise doc.error(("geometry", g.name, "also"), "`also` needs the `config` it backs")
    for g in geometry:
        if g.value < g.min:
            raise doc.error(("geometry", g.name, "value"), f"value {g.value} is below min {g.min}")
    gnames = {g.name for g in geometry}
    uses: list[BlockUse] = []
    seen: set[str] = set()
    for i, b in enumerate(d["blocks"]):
        path: PathKey = ("blocks", i)
        if b["block"] not in blocks:
            raise doc.error((*path, "block"), f"unknown block {b['block']!r}")
        if b["block"] in seen:
            raise doc.error((*path, "block"), f"block {b['block']!r} listed twice")
        seen.add(b["block"])
        block = blocks[b["block"]]
        # A block symbol the map leaves out binds the geometry symbol of the same name.
        bound = {s: s for s in block.symbols if s in gnames} | dict(b.get("symbols") or {})
        missing = sorted(set(block.symbols) - set(bound))
        extra = sorted(set(bound) - set(block.symbols))
        if missing:
            raise doc.error(
                (*path, "symbols"), f"block {block.name} symbols not bound: {', '.join(missing)}"
            )
        if extra:
            raise doc.error(
                (*path, "symbols"), f"block {block.name} has no symbol(s) {', '.join(extra)}"
            )
        for s, gname in bound.items():
            if gname not in gnames:
                raise doc.error((*path, "symbols", s), f"unknown geometry symbol {gname!r}")
        uses.append(BlockUse(block.name, {s: bound[s] for s in block.symbols}))
    layers = d["layers"]
    optional = {g for u in uses for g, grp in blocks[u.block].groups.items() if grp.optional}
    rules = []
    for g, r in (layers.get("groups") or {}).items():
        if g not in optional:
            raise doc.error(("layers", "groups", g), f"{g!r} is not an optional group of any block")
        if r.get("required"):
            rules.append(LayerGroupRule(g, required=True))
            continue
        if "flag" in r:
            rules.append(schedules.flag_group(doc, ("layers", "groups", g), g, r))
            continue
        if set(r["present"]) & set(r["absent"]):
            raise doc.error(("layers", "groups", g), "a value cannot mean both present and absent")
        rules.append(LayerGroupRule(g, r["config"], tuple(r["present"]), tuple(r["absent"])))
    used = {u.block for u in uses}
    slots = []
    placed: dict[str, str] = {}
    for sname, raw in (layers.get("slots") or {}).items():
        path = ("layers", "slots", sname)
        check_ident(doc, path, sname, "slot")
        for i, b in enumerate(raw["blocks"]):
            if b not in used:
                raise doc.error((*path, "blocks", i), f"block {b!r} is not listed under blocks")
            if b in placed:
                raise doc.error(
                    (*path, "blocks", i), f"block {b!r} is already in slot {placed[b]!r}"
                )
            placed[b] = sname
        values = raw.get("values") or {}
        for b in values:
            if b not in raw["blocks"]:
                raise doc.error((*path, "values", b), f"{b!r} is not a block of this slot")
        if values and "config" not in raw:
            raise doc.error((*path, "values"), "values need the config list they are read from")
        blocks_here = tuple(raw["blocks"])
        slots.append(
            SlotRule(
                sname,
                blocks_here,
                raw.get("scope", "all"),
                raw.get("config"),
                tuple((b, tuple(v)) for b, v in values.items()),
                schedules.slot_lists(doc, path, raw, blocks_here),
                schedules.slot_schedule(doc, path, raw.get("schedule"), blocks_here),
            )
        )
    glob = d.get("globals")
    if glob is not None:
        if glob not in used:
            raise doc.error(("globals",), f"block {glob!r} is not listed under blocks")
        if glob in placed:
            raise doc.error(("globals",), f"block {glob!r} is also a layer slot")
        placed[glob] = "globals"
    if slots:
        for i, u in enumerate(uses):
            if u.block not in placed:
                raise doc.error(
                    ("blocks", i, "block"), f"block {u.block!r} is in no slot and is not globals"
                )
    unbound = tuple(UnboundRule(u["prefix"], u["why"]) for u in (d.get("unbound") or []))
    names = _names(doc, d.get("names") or [], gnames)
    _sections_not_declared_whole(doc, names, [blocks[u.block] for u in uses])
    _model_names_reach_globals(doc, names, blocks[glob] if glob is not None else None)
    flags = sorted(
        {t.tie.config for u in uses for t in blocks[u.block].tensors if t.tie is not None}
    )
    synth = _synth(doc, d.get("synth"), gnames, slots)
    schedules.check_synth(doc, tuple(slots), synth)
    return Model(
        d["model"], doc.file, d.get("doc", ""), layers["pattern"],
        tuple(layers.get("prefixes", [""])), geometry, tuple(uses), doc, tuple(rules),
        tuple(slots), glob, unbound, (layers.get("count") or {}).get("config"),
        (layers.get("mtp") or {}).get("config"), tuple(flags), synth,
        int((layers.get("count") or {}).get("value", 0)),
        int((layers.get("mtp") or {}).get("value", 0)),
        names,
        tuple(d.get("model_types") or ()),
        bool(d.get("default", False)),
        _model_constraints(doc, d.get("constraints") or [], gnames),
        d.get("extends"),
        _dtypes(doc, d.get("dtypes"), [blocks[u.block] for u in uses]),
    )  # fmt: skip


def _dtypes(doc: Located, raw: Any, blocks: list[Block]) -> tuple[str, ...]:
    """``dtypes:``; F16 only where no block computes a field (a transform's result is the
    spec's dtype, so an F16 bind would hand back a BF16 field)."""
    if raw is None:
        return ("BF16",)
    if "F16" in raw:
        for b in blocks:
            tf = next((o for o in b.outputs if o.kind == "transform"), None)
            if tf is not None:
                raise doc.error(
                    ("dtypes",),
                    f"F16: block {b.name!r} computes {tf.field} by a transform, whose result "
                    "is the spec's dtype; only blocks that bind stored tensors may follow F16",
                )
    return tuple(raw)


def _geometry_expressions(doc: Located, geometry: tuple[GeometryField, ...]) -> None:
    """``default`` and ``expr`` name only geometry symbols, form no cycle, and an ``expr``
    symbol's ``value`` is what its expression gives at the real geometry."""
    gnames = {g.name for g in geometry}
    deps: dict[str, frozenset[str]] = {}
    for g in geometry:
        path: PathKey = ("geometry", g.name)
        if g.expr is not None and g.config is not None:
            raise doc.error((*path, "expr"), "a symbol with `expr` is computed: it has no `config`")
        if g.default is not None and g.config is None:
            raise doc.error(
                (*path, "default"), "`default` needs the `config` field it stands in for"
            )
        for key, text in (("default", g.default), ("expr", g.expr)):
            if text is not None:
                e = _expr(doc, (*path, key), text, gnames - {g.name}, False)
                if not e.names:
                    raise doc.error((*path, key), f"{text!r} names no symbol: give `value` instead")
                deps[g.name] = e.names
    while deps:  # a default or expression may not depend on itself through others
        free = [n for n, d in deps.items() if not d & deps.keys()]
        if not free:
            cycle = ", ".join(sorted(deps))
            raise doc.error(("geometry",), f"geometry expressions depend on each other: {cycle}")
        for n in free:
            del deps[n]
    try:
        got = geometry_computed(geometry, {g.name: g.value for g in geometry})
    except SpecbindError as e:
        raise doc.error(("geometry",), str(e)) from None
    for g in geometry:
        if g.expr is not None and got[g.name] != g.value:
            raise doc.error(
                ("geometry", g.name, "value"),
                f"value {g.value}, but {g.expr} gives {got[g.name]} at this geometry",
            )
    lows = {g.name: g.min for g in geometry}
    for g in geometry:
        # A default stands in for a field config.json lacks; the real model may carry the
        # field with another value (Qwen3's head_dim 128, not hidden / heads), but a default
        # that no geometry turns into the value (hidden * 3 for 128) is a spec error.
        if (
            g.default is not None
            and can_equal(algebra.parse(g.default), g.value, lows, got) is False
        ):
            names = ", ".join(sorted(algebra.parse(g.default).names))
            raise doc.error(
                ("geometry", g.name, "default"),
                f"{g.name}: default {g.default} can never be its value {g.value} (no whole "
                f"values of {names} give {g.value})",
            )


def _model_constraints(
    doc: Located, raw: list[dict[str, Any]], gnames: set[str]
) -> tuple[ConstraintRule, ...]:
    """A model's own checks, over its geometry symbols (a parallel size has no place here)."""
    out = []
    for i, c in enumerate(raw):
        where: PathKey = ("constraints", i)
        cname = check_ident(doc, (*where, "name"), c["name"], "constraint name")
        check = _expr(doc, (*where, "check"), c["check"], gnames, True)
        out.append(ConstraintRule(cname, " ".join(str(c["check"]).split()), c["why"], check))
    return tuple(out)


def _names(doc: Located, raw: list[dict[str, Any]], gnames: set[str]) -> tuple[NameRule, ...]:
    """The name map: a segmented rule has one ``to`` per segment and says how many; a
    sectioned one gives each section's rows as an expression over the geometry symbols."""
    out = []
    for i, r in enumerate(raw):
        to = (r["to"],) if isinstance(r["to"], str) else tuple(r["to"])
        seg = r.get("segments")
        sizes: tuple[str, ...] = ()
        if "sections" in r:
            where: PathKey = ("names", i, "sections")
            if seg is not None:
                raise doc.error(where, "give segments (equal rows) or sections, not both")
            if len(r["sections"]) != len(to):
                raise doc.error(
                    where, f"{len(r['sections'])} sections for {len(to)} names (one each)"
                )
            exprs = [_expr(doc, (*where, k), z, gnames, False) for k, z in enumerate(r["sections"])]
            sizes = tuple(" ".join(e.text.split()) for e in exprs)
            seg = len(to)
        if len(to) > 1 and seg != len(to):
            raise doc.error(
                ("names", i, "segments"),
                f"{len(to)} names need segments: {len(to)} (one row segment each)",
            )
        if len(to) == 1 and seg is not None:
            raise doc.error(("names", i, "segments"), "segments needs one name per segment")
        scope = r.get("scope", "layer")
        if r.get("unstack"):
            out.append(_unstack(doc, i, r, to, seg, sizes, scope))
            continue
        if scope == "model" and (len(to) > 1 or seg is not None):
            raise doc.error(
                ("names", i, "scope"),
                "a model-level name is renamed whole or as a prefix, never read as sections",
            )
        held = (placeholders(r["from"]), [p for t in to for p in placeholders(t)])
        if held != ([], []):
            # one whole name with a member index, renamed member by member (Mixtral's w1 ->
            # gate_proj): the index must be carried over, once, and never by a prefix rule
            if len(held[0]) != 1 or held[0] != held[1] or len(to) != 1:
                raise doc.error(
                    ("names", i), "a placeholder ({e}) appears once in `from` and once in `to`"
                )
            if r["from"].endswith(".") or to[0].endswith("."):
                raise doc.error(
                    ("names", i), "a name with a placeholder is a whole name, not a prefix"
                )
        if scope == "model" and held != ([], []):
            raise doc.error(("names", i, "scope"), "a model-level name has no family placeholder")
        out.append(NameRule(r["from"], to, r["why"], sizes, scope))
    return tuple(out)


def _unstack(
    doc: Located, i: int, r: dict[str, Any], to: tuple[str, ...], seg: int | None,
    sizes: tuple[str, ...], scope: str,
) -> NameRule:  # fmt: skip
    """``unstack: true``: one stored [members, ...] tensor (no placeholder in ``from``) read
    member by member as ``to`` (each holding one and the same placeholder), in equal row
    segments where there are several."""
    where: PathKey = ("names", i, "unstack")
    if scope != "layer" or sizes:
        raise doc.error(where, "unstack reads a layer's stacked tensor, in equal segments only")
    if placeholders(r["from"]) or r["from"].endswith((".", "_")):
        raise doc.error(where, "unstack's `from` is one whole stored tensor, with no placeholder")
    held = {tuple(placeholders(t)) for t in to}
    if len(held) != 1 or len(next(iter(held))) != 1:
        raise doc.error(where, "each unstacked `to` holds one and the same placeholder ({e})")
    if len(to) > 1 and seg != len(to):
        raise doc.error(where, f"{len(to)} names per member need segments: {len(to)}")
    return NameRule(r["from"], to, r["why"], (), "layer", True)


def _model_names_reach_globals(
    doc: Located, names: tuple[NameRule, ...], globals_block: Block | None
) -> None:
    """A model-level rename names a tensor of the globals block (a whole name) or a prefix
    some of its tensors start with; anything else would rename into nothing."""
    for i, r in enumerate(names):
        if r.scope != "model":
            continue
        if globals_block is None:
            raise doc.error(("names", i, "scope"), "a model-level name needs a globals block")
        to = r.to[0]
        held = [t.name for t in globals_block.tensors]
        prefix = r.source.endswith((".", "_"))
        hit = any(t.startswith(to) for t in held) if prefix else to in held
        if not hit:
            raise doc.error(
                ("names", i, "to"),
                f"model-level name {r.source!r} -> {to!r}: block {globals_block.name!r} "
                f"declares no tensor {'under ' if prefix else ''}{to!r} "
                f"(it holds {', '.join(held)})",
            )


def _sections_not_declared_whole(
    doc: Located, names: tuple[NameRule, ...], blocks: list[Block]
) -> None:
    """A tensor read as sections is never seen whole: a block declaring it (with a shard rule
    over the whole, which would give rank r a contiguous slice across sections: right shape,
    wrong rows) is refused by name."""
    for i, r in enumerate(names):
        if len(r.to) < 2:
            continue
        for b in blocks:
            hit = next((t for t in b.tensors if t.name == r.source), None)
            if hit is not None:
                raise doc.error(
                    ("names", i, "from"),
                    f"{r.source} is read as sections {list(r.to)}, but block {b.name!r} "
                    f"declares it whole (shard {hit.shard.kind}"
                    f"{'' if hit.shard.unit is None else ': ' + hit.shard.unit}); declare each "
                    "section with its own shard rule instead",
                )


def _synth(doc: Located, raw: Any, gnames: set[str], slots: list[SlotRule]) -> SynthRule | None:
    if raw is None:
        return None
    for name in raw["tiny"]:
        if name not in gnames:
            raise doc.error(("synth", "tiny", name), f"unknown geometry symbol {name!r}")
    by_slot = {s.name: s for s in slots}
    for slot, block in (raw.get("mtp") or {}).items():
        if slot not in by_slot or block not in by_slot[slot].blocks:
            raise doc.error(
                ("synth", "mtp", slot), f"{slot}: {block!r} is not a block of that slot"
            )
    for cfg, sym in (raw.get("config_from") or {}).items():
        if sym not in gnames:
            raise doc.error(("synth", "config_from", cfg), f"unknown geometry symbol {sym!r}")
    lists = tuple(
        SynthList(k, tuple(v.get("head") or ()), tuple(v["pattern"]))
        for k, v in (raw.get("lists") or {}).items()
    )
    return SynthRule(
        tuple(sorted(raw["tiny"].items())), int(raw["layers"]), lists,
        tuple((raw.get("mtp") or {}).items()), json.dumps(raw.get("config") or {}, sort_keys=True),
        tuple(sorted((raw.get("config_from") or {}).items())),
        json.dumps(raw.get("nested") or {}, sort_keys=True),
    )  # fmt: skip
