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
from functools import cache
from pathlib import Path
from typing import Any, Literal

import jsonschema

from generator import algebra, transforms
from generator.yamlio import Located, PathKey
from runtime.errors import AlgebraError
from runtime.model import GeometryField, LayerGroupRule

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "specs" / "schema"
# Names a symbol may not take: symbols become locals and attributes in generated functions
# (``H = g.H // g.tp``), next to these module names and locals.
_GENERATED_NAMES = {"g", "t", "p", "a", "b", "x", "y", "ops", "algebra_ops", "np", "src", "layer",
                    "rank", "sharded", "report", "weights", "tp", "self", "cls", "values", "env",
                    "plan", "matches"}  # fmt: skip
_FORBIDDEN_IDENTS = frozenset(dir(builtins)) | _GENERATED_NAMES
# A field is only ever an attribute and a keyword argument; it may not shadow a method.
_FORBIDDEN_FIELDS = frozenset({"arrays", "self"})


@dataclass(frozen=True)
class Shard:
    kind: Literal["replicated", "rows", "cols"]
    unit: str | None = None


@dataclass(frozen=True)
class Tensor:
    name: str  # relative to the block prefix, as written in the spec
    full_name: str  # layer-relative name in the checkpoint: prefix + name
    dtype: str
    shape: tuple[algebra.Expr, ...]
    shard: Shard
    group: str | None
    why_dtype: str | None


@dataclass(frozen=True)
class Output:
    field: str
    sources: tuple[str, ...]  # full names
    kind: Literal["verbatim", "concat", "transform"]
    axis: int = 0
    squeeze: int | None = None
    group: str | None = None
    transform: transforms.Transform | None = None


@dataclass(frozen=True)
class Constraint:
    name: str
    check: algebra.Expr
    why: str


@dataclass(frozen=True)
class Group:
    name: str
    optional: bool
    why: str


@dataclass(frozen=True)
class Block:
    name: str
    file: str
    prefix: str
    doc: str
    symbols: dict[str, str]
    derived: dict[str, algebra.Expr]
    constraints: tuple[Constraint, ...]
    markers: tuple[str, ...]  # full names
    groups: dict[str, Group]
    tensors: tuple[Tensor, ...]
    outputs: tuple[Output, ...]
    located: Located

    def tensor(self, full_name: str) -> Tensor:
        return next(t for t in self.tensors if t.full_name == full_name)


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

    def values(self) -> dict[str, int]:
        return {s.name: s.value for s in self.geometry}


@cache
def _schema(kind: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text())
    return loaded


def validate_schema(doc: Located, kind: Literal["block", "model"]) -> None:
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


_TENSOR_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]{0,127}")
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


def parse_block(doc: Located) -> Block:
    validate_schema(doc, "block")
    _names_fullmatch(doc)
    d = doc.data
    name = check_ident(doc, ("block",), d["block"], "block name")
    prefix: str = d["prefix"]
    symbols: dict[str, str] = {}
    for s, text in d["symbols"].items():
        if s in algebra.RESERVED:
            raise doc.error(("symbols", s), f"symbol {s!r} is reserved (the tensor-parallel size)")
        check_ident(doc, ("symbols", s), s, "symbol")
        symbols[s] = text
    derived: dict[str, algebra.Expr] = {}
    for s, text in (d.get("derived") or {}).items():
        check_ident(doc, ("derived", s), s, "derived symbol")
        if s in symbols or s in algebra.RESERVED:
            raise doc.error(("derived", s), f"derived symbol {s!r} shadows a symbol")
        derived[s] = _expr(doc, ("derived", s), text, set(symbols) | set(derived), False)
    shape_names = set(symbols) | set(derived)

    groups = {
        g: Group(check_ident(doc, ("groups", g), g, "group"), bool(v["optional"]), v["why"])
        for g, v in (d.get("groups") or {}).items()
    }
    tensors: list[Tensor] = []
    for tname, t in d["tensors"].items():
        base: PathKey = ("tensors", tname)
        shape = tuple(
            _expr(doc, (*base, "shape", i), dim, shape_names, False)
            for i, dim in enumerate(t["shape"])
        )
        shard = _shard(doc, (*base, "shard"), t["shard"], set(symbols), len(shape))
        group = t.get("group")
        if group is not None and group not in groups:
            raise doc.error((*base, "group"), f"group {group!r} is not declared under groups")
        tensors.append(
            Tensor(tname, prefix + tname, t["dtype"], shape, shard, group, t.get("why_dtype"))
        )
    by_full = {t.full_name: t for t in tensors}
    used_groups = {t.group for t in tensors}
    for g in groups:
        if g not in used_groups:
            raise doc.error(("groups", g), f"group {g!r} has no tensors")

    constraints = tuple(
        Constraint(
            check_ident(doc, ("constraints", i, "name"), c["name"], "constraint name"),
            _expr(
                doc, ("constraints", i, "check"), c["check"], shape_names | algebra.RESERVED, True
            ),
            c["why"],
        )
        for i, c in enumerate(d.get("constraints") or [])
    )

    markers_all = "all_required" in d["markers"]
    markers: tuple[str, ...]
    if markers_all:
        markers = tuple(t.full_name for t in tensors if not _optional(groups, t))
    else:
        markers = tuple(prefix + m for m in d["markers"]["all_of"])
        for i, m in enumerate(markers):
            path: PathKey = ("markers", "all_of", i)
            if m not in by_full:
                raise doc.error(path, f"marker {m!r} is not a tensor of this block")
            if _optional(groups, by_full[m]):
                raise doc.error(path, f"marker {m!r} is in an optional group")
    if not markers:
        raise doc.error(("markers",), "a block needs at least one required marker tensor")

    outputs = tuple(
        _output(doc, f, v, prefix, by_full, shape_names) for f, v in d["outputs"].items()
    )
    consumed = {s for o in outputs for s in o.sources}
    for t in tensors:
        if t.full_name not in consumed:
            raise doc.error(
                ("tensors", t.name), f"tensor {t.name!r} is read by no output (it would be dropped)"
            )
    return Block(
        name, doc.file, prefix, d.get("doc", ""), symbols, derived, constraints,
        markers, groups, tuple(tensors), outputs, doc,
    )  # fmt: skip


def _optional(groups: dict[str, Group], t: Tensor) -> bool:
    return t.group is not None and groups[t.group].optional


def _shard(doc: Located, path: PathKey, raw: Any, names: set[str], rank: int) -> Shard:
    if raw == "replicated":
        return Shard("replicated")
    kind: Literal["rows", "cols"] = "rows" if "rows" in raw else "cols"
    unit = raw[kind]
    if unit not in names:
        raise doc.error(
            (*path, kind),
            f"shard unit {unit!r} is not a symbol of this block (nor may it be derived)",
        )
    if kind == "cols" and rank < 2:
        raise doc.error((*path, kind), "a column shard needs a tensor of rank 2 or more")
    return Shard(kind, unit)


def _output(
    doc: Located, field: str, raw: Any, prefix: str, by_full: dict[str, Tensor], names: set[str]
) -> Output:
    path: PathKey = ("outputs", field)
    check_ident(doc, path, field, "output field", _FORBIDDEN_FIELDS)
    if isinstance(raw, str):
        src = prefix + raw
        if src not in by_full:
            raise doc.error(path, f"output {field!r} reads unknown tensor {raw!r}")
        return Output(field, (src,), "verbatim", group=by_full[src].group)
    if "concat" not in raw:
        tf = transforms.parse(doc, path, raw, prefix, dict(by_full), names)
        srcs = tuple(o.tensor for o in tf.operands)
        return Output(field, srcs, "transform", group=by_full[srcs[0]].group, transform=tf)
    sources = tuple(prefix + s for s in raw["concat"])
    for i, s in enumerate(sources):
        if s not in by_full:
            raise doc.error(
                (*path, "concat", i), f"concat reads unknown tensor {raw['concat'][i]!r}"
            )
    if len(set(sources)) != len(sources):
        raise doc.error((*path, "concat"), "concat names a tensor twice")
    ts = [by_full[s] for s in sources]
    if len({t.dtype for t in ts}) != 1:
        raise doc.error((*path, "concat"), "concat joins tensors of different dtypes")
    if len({len(t.shape) for t in ts}) != 1:
        raise doc.error((*path, "concat"), "concat joins tensors of different ranks")
    if len({t.group for t in ts}) != 1:
        raise doc.error((*path, "concat"), "concat joins tensors of different groups")
    if len({t.shard for t in ts}) != 1:
        raise doc.error((*path, "concat"), "concat joins tensors of different shard rules")
    rank = len(ts[0].shape)
    axis = int(raw["axis"])
    if axis >= rank:
        raise doc.error((*path, "axis"), f"axis {axis} is out of range for rank {rank}")
    squeeze = raw.get("squeeze")
    if squeeze is not None:
        if squeeze >= rank or squeeze == axis:
            raise doc.error(
                (*path, "squeeze"),
                f"cannot squeeze dim {squeeze} of a rank-{rank} concat on axis {axis}",
            )
        for t in ts:
            dim = t.shape[squeeze]
            if dim.text.strip() != "1":
                raise doc.error(
                    (*path, "squeeze"), f"{t.name} dim {squeeze} is {dim.text!r}, not a literal 1"
                )
    return Output(field, sources, "concat", axis, squeeze, ts[0].group)


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
        )
        for n, g in d["geometry"].items()
    )
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
        missing = sorted(set(block.symbols) - set(b["symbols"]))
        extra = sorted(set(b["symbols"]) - set(block.symbols))
        if missing:
            raise doc.error(
                (*path, "symbols"), f"block {block.name} symbols not bound: {', '.join(missing)}"
            )
        if extra:
            raise doc.error(
                (*path, "symbols"), f"block {block.name} has no symbol(s) {', '.join(extra)}"
            )
        for s, gname in b["symbols"].items():
            if gname not in gnames:
                raise doc.error((*path, "symbols", s), f"unknown geometry symbol {gname!r}")
        uses.append(BlockUse(block.name, dict(b["symbols"])))
    layers = d["layers"]
    optional = {g for u in uses for g, grp in blocks[u.block].groups.items() if grp.optional}
    rules = []
    for g, r in (layers.get("groups") or {}).items():
        if g not in optional:
            raise doc.error(("layers", "groups", g), f"{g!r} is not an optional group of any block")
        if set(r["present"]) & set(r["absent"]):
            raise doc.error(("layers", "groups", g), "a value cannot mean both present and absent")
        rules.append(LayerGroupRule(g, r["config"], tuple(r["present"]), tuple(r["absent"])))
    return Model(
        d["model"], doc.file, d.get("doc", ""), layers["pattern"],
        tuple(layers.get("prefixes", [""])), geometry, tuple(uses), doc, tuple(rules),
    )  # fmt: skip
