"""Model specs (``specs/models/*.yaml``) parsed into a ``Model``, against the parsed blocks:
geometry, the blocks used and their symbol maps, layer slots and optional groups, the name map,
the model's own constraints and the synth recipe.

Invariants (each refusal is a ``SpecError`` naming file, path and line):
- a model binds every symbol of each block it uses to one of its geometry symbols;
- a geometry ``default`` or ``expr`` names only geometry symbols and forms no cycle; an ``expr``
  symbol's ``value`` is what its expression gives, and a default can be its value;
- each block it lists is in exactly one slot or is the globals block, and is listed once;
- a tensor read as sections (``names``) is never declared whole by a block.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from specbind.core import algebra
from specbind.core.errors import SpecbindError
from specbind.core.geometry import computed as geometry_computed
from specbind.core.ir import (
    ConfigRequirement,
    ConstraintRule,
    GeometryField,
    LayerGroupRule,
    NameRule,
    SlotRule,
    SynthList,
    SynthRule,
    UnboundRule,
)
from specbind.core.patterns import placeholders
from specbind.core.polynomial import can_equal
from specbind.generator import schedules
from specbind.generator.block_spec import Block
from specbind.generator.identifiers import check_ident, symbol_expr, validate_schema
from specbind.generator.yamlio import Located, PathKey


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
    requires: tuple[ConfigRequirement, ...] = ()  # config.json values the spec alone can say

    def values(self) -> dict[str, int]:
        return {s.name: s.value for s in self.geometry}


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
            bool(g.get("null_is_absent", False)),
            None if g.get("null_default") is None else str(g["null_default"]),
        )
        for n, g in d["geometry"].items()
    )
    _geometry_expressions(doc, geometry)
    for name in (d.get("synth") or {}).get("tiny") or {}:
        computed_by = next((g.expr for g in geometry if g.name == name and g.expr), None)
        if computed_by is not None:
            raise doc.error(
                ("synth", "tiny", name),
                f"{name} is computed ({computed_by}): it takes no value",
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
                (*path, "symbols"),
                f"block {block.name} symbols not bound: {', '.join(missing)}",
            )
        if extra:
            raise doc.error(
                (*path, "symbols"),
                f"block {block.name} has no symbol(s) {', '.join(extra)}",
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
                    (*path, "blocks", i),
                    f"block {b!r} is already in slot {placed[b]!r}",
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
                    ("blocks", i, "block"),
                    f"block {u.block!r} is in no slot and is not globals",
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
        _requires(d.get("requires") or {}),
    )  # fmt: skip


def _requires(raw: dict[str, Any]) -> tuple[ConfigRequirement, ...]:
    """``requires:``, one rule per config.json field, sorted by field (the schema checked
    each value's type; a child's ``null`` has already removed an inherited field)."""
    return tuple(
        ConfigRequirement(
            name, tuple(r["is"]), r["why"], () if "missing" not in r else (r["missing"],)
        )
        for name, r in sorted(raw.items())
    )


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
                (*path, "default"),
                "`default` needs the `config` field it stands in for",
            )
        if g.null_is_absent and g.default is None:
            raise doc.error(
                (*path, "null_is_absent"),
                "`null_is_absent` needs the `default` a null then stands for",
            )
        if g.null_default is not None and (g.null_is_absent or g.config is None):
            raise doc.error(
                (*path, "null_default"),
                "`null_default` needs a `config` field, and says what `null_is_absent` would",
            )
        exprs = (("default", g.default), ("expr", g.expr), ("null_default", g.null_default))
        for key, text in exprs:
            if text is not None:
                e = symbol_expr(doc, (*path, key), text, gnames - {g.name}, False)
                if not e.names and key == "expr":
                    raise doc.error((*path, key), f"{text!r} names no symbol: give `value` instead")
                deps[g.name] = deps.get(g.name, frozenset()) | e.names
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
        # A number is the config class's own default: the real model may carry another value.
        if (
            g.default is not None
            and algebra.parse(g.default).names
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
        check = symbol_expr(doc, (*where, "check"), c["check"], gnames, True)
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
                    where,
                    f"{len(r['sections'])} sections for {len(to)} names (one each)",
                )
            exprs = [
                symbol_expr(doc, (*where, k), z, gnames, False) for k, z in enumerate(r["sections"])
            ]
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
        axis = _section_axis(doc, i, r, seg)
        if r.get("unstack"):
            if axis:
                raise doc.error(("names", i, "axis"), "an unstacked tensor is split by rows only")
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
                    ("names", i),
                    "a placeholder ({e}) appears once in `from` and once in `to`",
                )
            if r["from"].endswith(".") or to[0].endswith("."):
                raise doc.error(
                    ("names", i),
                    "a name with a placeholder is a whole name, not a prefix",
                )
        if scope == "model" and held != ([], []):
            raise doc.error(("names", i, "scope"), "a model-level name has no family placeholder")
        out.append(NameRule(r["from"], to, r["why"], sizes, scope, False, axis))
    return tuple(out)


def _section_axis(doc: Located, i: int, r: dict[str, Any], seg: int | None) -> int:
    """``axis:`` of a sectioned or segmented rule: the axis its sections split (rows, 0, when
    absent; negative counts from the last). Nothing else is split, so nothing else takes one."""
    if "axis" not in r:
        return 0
    axis = r["axis"]
    if seg is None or isinstance(axis, bool) or not isinstance(axis, int):
        raise doc.error(
            ("names", i, "axis"),
            "axis belongs to a rule read as sections or segments, and is an integer",
        )
    return axis


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
