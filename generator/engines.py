"""Engine layouts: for one engine and one model, which bound fields it takes, under which of its
parameter names (``specs/engines/<engine>/<model>.yaml``).

An engine layout is a variant of each of the model's blocks: the same tensors, rules, plans and
checks, with the outputs replaced by the ones the engine reads (a block's own fields by name, or
new ones in the block spec's output constructs: verbatim head shards instead of absorbs, a
replicated concat). Each variant is rendered by the block template into ``generated/engines/``.

Invariants (each refusal is a ``SpecError`` naming the engine file, its path and line):
- every block of the model has an entry (but those only MTP layers hold, where the layout
  says ``skip_mtp``: the engine's model has no MTP layers, which are then not bound), and
  every engine parameter names exactly one field; a field fills one parameter, and an engine
  output no parameter takes is refused;
- every tensor of every block feeds some engine field, and every element of it is read
  (the model's generate-time checks run again on the variants: shapes, transforms at every tp,
  coverage at the tiny geometry), so an engine layout cannot drop a tensor;
- a declared engine shape (``shape:``, in the model's geometry symbols and ``tp``) equals the
  field's rank-local shape at every tp in 1, 2, 4, 8 that the block's units allow, at the real
  geometry and at the tiny one (its computed symbols recomputed there, tiny values throughout);
- a ``pad:`` (the engine pads the field's split axis to a multiple, then splits it into tp
  equal shares) reads one tensor verbatim whose shard unit is one row of that axis; every field
  reading that tensor, and both sides of a tie, are padded too; the padded size splits at every
  tp checked; the variant reads the tensor whole (the bind slices it);
- ``apply`` (element-wise exp/neg, in F32) and ``dtype`` (F32 widens, BF16 rounds to nearest
  even as the engine's copy into a model-dtype parameter does) read a float field no
  quantization scheme may pack; ``ranks: first`` reads only replicated tensors; an engine
  ``constraints`` entry names only geometry symbols, tp and the flags of the model's groups
  (``use_qk_norm``, 1 where the checkpoint sets it), and holds at tp 1 with each flag set or not;
- a ``split:`` (the engine splits the whole field into tp contiguous equal shares of its axis,
  as vLLM's ColumnParallelLinear does a stored fused tensor) reads its tensors whole (the
  variant binds them replicated, the bind takes the rank's rows) and never with ``pad``; every
  field reading one of those tensors is split too; the field's axis splits at every tp checked;
- ``architectures`` lists the config.json architectures the engine serves with the layout; a
  model's second layout lives in ``<model>-<name>.yaml`` and must list them; no architecture is
  listed by two layouts of one engine;
- ``proof:`` names the suite's test file that proves the layout parameter-identical to the
  engine's own loader and the tps it does (tests/spec/test_engine_layouts.py checks that the file
  holds it), and ``proof.except`` the blocks of the layout it cannot reach (measured: the
  engine cannot build a checkpoint holding them), which the generated table keeps for
  ``bind_for_engine`` to warn of when a bound layer holds one; a layout without a proof is
  unproven: ``unproven`` lists it for ``generate`` to report, and the generated table says so,
  for ``bind_for_engine`` to warn; its ``unproven:`` says why (the engine's measured error
  line), for the supported-models table;
- a file with ``unavailable:`` is no layout: the engine's own loader cannot build or load the
  model (its measured error line), and the file holds nothing else (the schema says so); the
  generated registry keeps the reason (``UNAVAILABLE``) for the supported-models table and for
  ``bind_for_engine`` to refuse the model with;
- a block a model's layout does not name is bound by the engine's block layout
  (``<engine>/blocks/<block>.yaml``, shapes in the block's own symbols), a named one by the
  model's entry alone (shapes in the model's geometry symbols); a block neither lays out is
  refused, as is a block layout of an unknown block or in a file not named after it;
- parameter names are unique across the whole model (layer names under ``layers``, the globals
  block's as full names), but between the alternative blocks of one slot (StableLM's gqa or
  gqa_bias: a layer holds one of them).
- a scheme layout (``<engine>/schemes/<scheme>.yaml``) names a scheme of specs/schemes and
  accounts for each of its companions once: held (with the engine's dtype where it widens a
  BF16 or F16 one to F32) or refused with a reason; the packed weight is always held; its
  proof names a file of the suite and models the engine has layouts of; a scheme the engine
  cannot load says only why (``unavailable:``, measured). A scheme with no file is refused
  for the engine by ``bind_for_engine``.
Trap: the engine's names reach generated code only through ``repr``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import jsonschema

from specbind.core import algebra, vocab_pad
from specbind.core.errors import AlgebraError, SpecbindError, SpecError
from specbind.core.ir import ShardRule
from specbind.core.planning import plan_tensor
from specbind.core.quant import SchemeRule
from specbind.generator import transforms, yamlio
from specbind.generator.block_spec import Block
from specbind.generator.evaluate import (
    block_env,
    check_model_geometry,
    local_env,
    local_shapes,
    shapes_at,
    tiny_geometry,
)
from specbind.generator.identifiers import SCHEMA_DIR, check_ident, symbol_expr, validate_schema
from specbind.generator.model_spec import Model
from specbind.generator.output_spec import Output, parse_output
from specbind.generator.yamlio import Located, PathKey, format_path

_TPS = (1, 2, 4, 8)


@dataclass
class _Under(Located):
    """A view of a document below ``base``: paths and lines resolve in the whole file."""

    base: PathKey = ()

    def line(self, path: PathKey) -> int | None:
        return super().line((*self.base, *path))

    def error(self, path: PathKey, message: str) -> SpecError:
        return SpecError(self.file, format_path((*self.base, *path)), self.line(path), message)


@dataclass(frozen=True)
class Parameter:
    name: str  # the engine's name, relative to the layer prefix (full for the globals block)
    field: str
    shape: tuple[algebra.Expr, ...] | None  # in the model's geometry symbols and tp
    # ``pad``: the engine pads the field's shard axis to a multiple of this and splits the
    # padded size into tp equal shares (rows past the stored ones zero); with its axis
    pad: int | None = None
    pad_axis: int = 0
    apply: tuple[str, ...] = ()  # element-wise functions the engine applies, in order, in F32
    dtype: str | None = None  # the engine's dtype, where it widens or rounds the field
    first_rank: bool = False  # the engine holds the values on tp rank 0 only, zeros elsewhere
    split: bool = False  # ``pad`` of multiple 1 over the whole field's axis: contiguous shares


@dataclass(frozen=True)
class EngineConstraint:
    name: str
    check: algebra.Expr  # over the model's geometry symbols and tp
    why: str


@dataclass(frozen=True)
class EngineBlock:
    block: Block  # the model's block with the engine's outputs
    parameters: tuple[Parameter, ...]
    # where the entry is written: the model's layout (``blocks.<block>``, shapes in the model's
    # geometry symbols) or the engine's block layout (top level, shapes in the block's symbols)
    located: Located | None = None
    base: PathKey = ()
    block_symbols: bool = False


@dataclass(frozen=True)
class BlockLayout:
    """``specs/engines/<engine>/blocks/<block>.yaml``: how the engine holds one block, for
    every model that uses the block and does not say otherwise."""

    engine: str
    block: str
    doc: Located


@dataclass(frozen=True)
class EngineLayout:
    engine: str
    model: str
    file: str
    doc: str
    layers: str
    skip_mtp: str | None
    blocks: dict[str, EngineBlock]
    located: Located
    constraints: tuple[EngineConstraint, ...] = ()
    proof: str | None = None  # the suite's test file proving it against the engine's loader
    proof_tp: tuple[int, ...] = ()  # the tp sizes it proves the layout at
    unproven: str | None = None  # the measured reason no proof runs (the engine's error line)
    proof_except: tuple[str, ...] = ()  # blocks the proof cannot reach (``proof.except``)
    proof_except_why: str | None = None  # why (measured)
    name: str = ""  # the file's stem: the model, or ``<model>-<name>`` for a second layout
    architectures: tuple[str, ...] = ()  # config.json architectures it serves (``architectures``)


@dataclass(frozen=True)
class EngineUnavailable:
    """``specs/engines/<engine>/<model>.yaml`` with ``unavailable:``: no layout, the reason."""

    engine: str
    model: str
    file: str
    reason: str


def _outputs_schema() -> dict[str, Any]:
    """The block schema's ``outputs`` definition, standalone, to validate engine outputs."""
    block = json.loads((SCHEMA_DIR / "block.schema.json").read_text())
    outputs = {k: v for k, v in block["properties"]["outputs"].items() if k != "minProperties"}
    return {"$defs": block["$defs"], **outputs}


def parse_engine(
    doc: Located,
    models: dict[str, Model],
    blocks: dict[str, Block],
    block_layouts: dict[str, BlockLayout] | None = None,
) -> EngineLayout:
    """A model's layout: its own ``blocks:`` entries, and for every other block of the model
    the engine's block layout (``block_layouts``, by block name)."""
    validate_schema(doc, "engine")
    d = doc.data
    if d["model"] not in models:
        raise doc.error(("model",), f"unknown model {d['model']!r} (specs: {', '.join(models)})")
    model = models[d["model"]]
    own_blocks: dict[str, Any] = d.get("blocks") or {}
    shared = {b: bl for b, bl in (block_layouts or {}).items() if bl.engine == d["engine"]}
    used = [u.block for u in model.blocks]
    for b in own_blocks:
        if b not in used:
            raise doc.error(("blocks", b), f"block {b!r} is not a block of {model.name}")
    mtp_only = {  # blocks no decoder layer holds: the engine binds them only with MTP layers
        b
        for b in used
        if b != model.globals and all(s.scope == "mtp" for s in model.slots if b in s.blocks)
    }
    skip = set(mtp_only) if d.get("skip_mtp") else set()
    missing = [b for b in used if b not in own_blocks and b not in shared and b not in skip]
    if missing:
        raise doc.error(
            ("blocks",),
            f"no engine parameters for block(s) {', '.join(missing)}: no entry here and no "
            f"specs/engines/{d['engine']}/blocks/<block>.yaml",
        )
    gnames = {g.name for g in model.geometry} | {"tp"}
    out: dict[str, EngineBlock] = {}
    seen: dict[str, str] = {}  # full engine name -> block
    for bname in (b for b in used if b in own_blocks or (b in shared and b not in skip)):
        if bname in own_blocks:
            eb = _engine_block(doc, ("blocks", bname), bname, own_blocks[bname], blocks[bname],
                               gnames)  # fmt: skip
        else:
            bl = shared[bname]
            bsyms = set(blocks[bname].symbols) | set(blocks[bname].derived) | {"tp"}
            eb = _engine_block(bl.doc, (), bname, bl.doc.data, blocks[bname], bsyms, True)
        for p in eb.parameters:
            full = p.name if bname == model.globals else d["layers"] + p.name
            alternatives = any(  # one slot's either-or blocks: never both in one layer
                bname in sl.blocks and seen.get(full) in sl.blocks for sl in model.slots
            )
            if full in seen and not alternatives:
                raise doc.error(
                    ("blocks", bname, "parameters", p.name),
                    f"engine parameter {full!r} is also filled by block {seen[full]!r}",
                )
            seen[full] = bname
        out[bname] = eb
    variant = {n: e.block for n, e in out.items()}
    check_model_geometry(
        dataclasses.replace(model, blocks=tuple(u for u in model.blocks if u.block in variant)),
        variant,
    )
    proof = d.get("proof") or {}
    if proof and d.get("unproven"):
        raise doc.error(("unproven",), "a layout with a proof: is not unproven; drop one")
    left_out = (proof.get("except") or {}).get("blocks") or []
    for i, b in enumerate(left_out):
        if b not in out:
            raise doc.error(
                ("proof", "except", "blocks", i),
                f"block {b!r} is not a block this layout binds ({', '.join(out)})",
            )
    layout = EngineLayout(
        check_ident(doc, ("engine",), d["engine"], "engine name"), model.name, doc.file,
        d.get("doc", ""), d["layers"], d.get("skip_mtp"), out, doc,
        _constraints(doc, d.get("constraints") or [], model, gnames),
        proof.get("test"), tuple(proof.get("tp") or ()), d.get("unproven"), tuple(left_out),
        (proof.get("except") or {}).get("why"), Path(doc.file).stem,
        tuple(d.get("architectures") or ()),
    )  # fmt: skip
    check_engine_shapes(layout, model)
    return layout


def parse_block_layout(doc: Located, engine: str, blocks: dict[str, Block]) -> BlockLayout:
    """An engine's layout of one block (its file ``<engine>/blocks/<block>.yaml``): checked
    here against the block's schema entry; against each model when a layout uses it."""
    validate_schema(doc, "engine_block")
    d = doc.data
    if d["engine"] != engine:
        raise doc.error(("engine",), f"a block layout under specs/engines/{engine}/ is {engine}'s")
    if d["block"] not in blocks:
        raise doc.error(("block",), f"unknown block {d['block']!r} (specs: {', '.join(blocks)})")
    return BlockLayout(engine, d["block"], doc)


def _engine_block(
    doc: Located,
    base: PathKey,
    bname: str,
    raw: dict[str, Any],
    block: Block,
    gnames: set[str],
    block_symbols: bool = False,
) -> EngineBlock:
    own = {o.field: o for o in block.outputs}
    extra_raw: dict[str, Any] = raw.get("outputs") or {}
    validator = jsonschema.Draft202012Validator(_outputs_schema())
    err = jsonschema.exceptions.best_match(validator.iter_errors(extra_raw))
    if err is not None:
        raise doc.error((*base, "outputs", *err.absolute_path), f"schema: {err.message[:200]}")
    under = _Under(doc.file, {"outputs": extra_raw}, doc.lines, base)
    names = set(block.symbols) | set(block.derived)
    by_full = {t.name: t for t in block.tensors}
    extra = {}
    for f, v in extra_raw.items():
        if f in own:
            raise doc.error(
                (*base, "outputs", f), f"{f!r} is already a field of block {bname!r}; use it"
            )
        extra[f] = parse_output(under, f, v, block.prefix, by_full, names)
    params: list[Parameter] = []
    outputs: list[Output] = []
    taken: dict[str, str] = {}
    for pname, v in raw["parameters"].items():
        where: PathKey = (*base, "parameters", pname)
        field = v if isinstance(v, str) else v["field"]
        o = extra.get(field) or own.get(field)
        if o is None:
            raise doc.error(
                where,
                f"field {field!r} is neither a field of block {bname!r} "
                f"({', '.join(own)}) nor one of its engine outputs",
            )
        if field in taken:
            raise doc.error(where, f"field {field!r} already fills {taken[field]!r}")
        taken[field] = pname
        outputs.append(o)
        shape = None
        if isinstance(v, dict) and "shape" in v:
            shape = tuple(
                _expr(doc, (*where, "shape", i), e, gnames) for i, e in enumerate(v["shape"])
            )
        pad, pad_axis, split = None, 0, False
        if isinstance(v, dict) and "pad" in v:
            if "split" in v:
                raise doc.error((*where, "split"), "split and pad are two rules; give one")
            pad = int(v["pad"]["multiple"])
            pad_axis = _pad_axis(doc, (*where, "pad"), o, block)
        if isinstance(v, dict) and "split" in v:
            pad, pad_axis, split = 1, _split_axis(doc, (*where, "split"), o), True
        apply, dtype, first = _values(doc, where, v, o, block)
        params.append(Parameter(pname, field, shape, pad, pad_axis, apply, dtype, first, split))
    for f in extra:
        if f not in taken:
            raise doc.error((*base, "outputs", f), f"engine output {f!r} fills no parameter")
    consumed = {s for o in outputs for s in o.sources}
    for t in block.tensors:
        if t.name not in consumed:
            raise doc.error(
                (*base, "parameters"),
                f"tensor {block.rel(t.name)!r} of block {bname!r} feeds no engine parameter "
                "(it would be dropped)",
            )
    padded = _padded_tensors(doc, base, block, params, outputs)
    tensors = tuple(
        dataclasses.replace(t, shard=ShardRule("replicated")) if t.name in padded else t
        for t in block.tensors
    )  # a padded split is the engine's: the variant reads the tensor whole, the bind slices it
    variant = dataclasses.replace(block, outputs=tuple(outputs), tensors=tensors, located=under)
    return EngineBlock(variant, tuple(params), doc, base, block_symbols)


_FLOATS = ("BF16", "F16", "F32")


def _values(
    doc: Located, where: PathKey, raw: Any, out: Output, block: Block
) -> tuple[tuple[str, ...], str | None, bool]:
    """A parameter's ``apply``, ``dtype`` and ``ranks: first``, checked against its field: the
    functions and a widening need a float field no quantization scheme replaces (its values
    are the stored ones, not packed codes); rank 0 alone needs a field every rank holds whole."""
    if not isinstance(raw, dict):
        return (), None, False
    apply, dtype, first = tuple(raw.get("apply") or ()), raw.get("dtype"), raw.get("ranks")
    srcs = [t for t in block.tensors if t.name in out.sources]
    if apply or dtype:
        key = "apply" if apply else "dtype"
        bad = next((t for t in srcs if t.dtype not in _FLOATS or t.linear), None)
        if bad is not None or out.transform is not None:
            what = "is a transform" if bad is None else (
                f"reads {block.rel(bad.name)!r}, "
                + ("a linear a quantization scheme may pack" if bad.linear else bad.dtype)
            )  # fmt: skip
            raise doc.error(
                (*where, key),
                f"{key} computes on the stored float values; field {out.field!r} {what}",
            )
    if first:
        split = next((t for t in srcs if t.shard.kind != "replicated"), None)
        if split is not None:
            raise doc.error(
                (*where, "ranks"),
                f"ranks: first puts the whole field on rank 0; field {out.field!r} reads "
                f"{block.rel(split.name)!r}, which is split across ranks",
            )
    return apply, dtype, first is not None


def _constraints(
    doc: Located, raw: list[dict[str, str]], model: Model, gnames: set[str]
) -> tuple[EngineConstraint, ...]:
    """The engine's own checks of the geometry and tp (and the flags of the model's groups,
    1 where the checkpoint sets one); each holds at the model's real and tiny geometry at tp 1,
    every flag set or not (else the engine cannot load the model at all)."""
    out = []
    flags = {r.flag for r in model.layer_groups if r.flag}
    geometries = [("real", model.values())]
    if model.synth is not None:
        geometries.append(("synth tiny", tiny_geometry(model)))
    gnames = gnames | flags
    for i, c in enumerate(raw):
        path: PathKey = ("constraints", i, "check")
        try:
            e = algebra.parse(c["check"], check=True)
        except AlgebraError as exc:
            raise doc.error(path, str(exc)) from None
        unknown = sorted(e.names - gnames)
        if unknown:
            raise doc.error(path, f"unknown symbol(s) {', '.join(unknown)} in {c['check']!r}")
        used = sorted(e.names & flags)
        for (what, values), on in (
            (g, on) for g in geometries for on in ({f: 0 for f in used}, {f: 1 for f in used})
        ):
            try:
                ok = algebra.evaluate(e, values | on | {"tp": 1})
            except SpecbindError as exc:
                raise doc.error(path, f"at the {what} geometry, tp 1: {exc}") from None
            if not ok:
                raise doc.error(
                    path, f"at the {what} geometry, tp 1: constraint {c['name']} fails: {c['why']}"
                )
        out.append(EngineConstraint(check_ident(doc, ("constraints", i, "name"), c["name"],
                                                "constraint name"), e, c["why"]))  # fmt: skip
    return tuple(out)


def _pad_axis(doc: Located, where: PathKey, out: Output, block: Block) -> int:
    """The axis a padded split pads: the shard axis of the field's one tensor, read verbatim,
    whose shard unit is one element of that axis (a vocabulary row)."""
    if out.kind != "verbatim" or len(out.sources) != 1:
        raise doc.error(where, f"a padded split reads one tensor verbatim; {out.field!r} does not")
    t = block.tensor(out.sources[0])
    if t.shard.kind == "replicated" or t.shard.unit is None:
        raise doc.error(
            where, f"tensor {block.rel(t.name)!r} is replicated: there is no split to pad"
        )
    axis = t.shard.resolved(len(t.dims))
    if t.dims[axis].text.replace(" ", "") != t.shard.unit:
        raise doc.error(
            where,
            f"tensor {block.rel(t.name)!r} splits dim {axis} ({t.dims[axis].text}) by "
            f"{t.shard.unit} units: a padded split pads single rows, a dim that is its unit",
        )
    return axis


def _split_axis(doc: Located, where: PathKey, out: Output) -> int:
    """The axis a ``split:`` cuts: a verbatim field's axis 0, a concat's own axis (its tensors
    whole, one after another, as the engine reads the stored fused tensor)."""
    if out.transform is not None or out.kind not in ("verbatim", "concat") or out.squeeze:
        raise doc.error(
            where, f"a split cuts a verbatim or concatenated field; {out.field!r} is neither"
        )
    if out.permute is not None or out.halves:
        raise doc.error(where, f"a split cuts a field as stored; {out.field!r} is reordered")
    return out.axis if out.kind == "concat" else 0


def _padded_tensors(
    doc: Located, base: PathKey, block: Block, params: list[Parameter], outputs: list[Output]
) -> set[str]:
    """The tensors of padded parameters; every field reading one, and every tensor tied to
    one, is padded too (else the variant, which reads them whole, would bind it unsplit)."""
    by_field = {o.field: o for o in outputs}
    padded = {s for p in params if p.pad is not None for s in by_field[p.field].sources}
    for p in params:
        o = by_field[p.field]
        if p.pad is None and padded & set(o.sources):
            raise doc.error(
                (*base, "parameters", p.name),
                f"field {p.field!r} reads a tensor another parameter pads or splits whole; "
                "pad or split it as well",
            )
    for t in block.tensors:
        if t.tie is not None and (t.name in padded) != (t.tie.to in padded):
            raise doc.error(
                (*base, "parameters"),
                f"tensor {block.rel(t.name)!r} is tied to {block.rel(t.tie.to)!r}: pad both "
                "parameters or neither",
            )
    return padded


def _expr(doc: Located, path: PathKey, text: str | int, allowed: set[str]) -> algebra.Expr:
    """An engine shape's expression (parsed unchecked, as before)."""
    return symbol_expr(doc, path, text, allowed, check=False)


def field_shape(
    block: Block, out: Output, values: dict[str, int], tp: int, ctx: str
) -> tuple[int, ...]:
    """The field's shape on tp rank 0 at ``values`` (the block's symbols), ep 1."""
    env = block_env(block, values, tp)
    full = shapes_at(block, block_env(block, values), ctx)
    local = {
        t.name: plan_tensor(block.name, t, full[t.name], env, tp, 0).local_shape
        for t in block.tensors
    }
    if out.transform is not None:
        tf = out.transform
        units = {u for o in tf.operands if (u := block.tensor(o.tensor).shard.unit) is not None}
        return transforms.result_shape(
            tf, {t.name: t for t in block.tensors}, local_env(block, values, tp, units),
            local_shapes(block, full, env), block.located, ("outputs", out.field), ctx,
        )  # fmt: skip
    dims = list(local[out.sources[0]])
    if len(out.sources) > 1:
        dims[out.axis] = sum(local[s][out.axis] for s in out.sources)
    if out.squeeze is not None:
        del dims[out.squeeze]
    if out.permute is not None:
        dims = [dims[a] for a in out.permute]
    if out.kind == "stack":
        fam = block.families[out.family or ""]
        dims = [values[fam.count], *dims]
    return tuple(dims)


def check_engine_shapes(layout: EngineLayout, model: Model) -> None:
    """Each declared engine shape equals its field's at every tp the block allows, at the real
    geometry and the tiny one."""
    geometries = [("real", model.values())]
    if model.synth is not None:  # computed symbols recomputed there: tiny values throughout
        geometries.append(("synth tiny", tiny_geometry(model)))
    for use in (u for u in model.blocks if u.block in layout.blocks):
        eb = layout.blocks[use.block]
        b = eb.block
        by_field = {o.field: o for o in b.outputs}
        for what, gv in geometries:
            values = {s: gv[g] for s, g in use.symbols.items()}
            units = {t.shard.unit for t in b.tensors if t.shard.unit is not None}
            env = block_env(b, values)
            for tp in (tp for tp in _TPS if all(env[u] % tp == 0 for u in units)):
                # a block layout's shapes are in the block's symbols, a model's in its geometry's
                at = block_env(b, values, tp) if eb.block_symbols else gv | {"tp": tp}
                for p in eb.parameters:
                    ctx = (
                        f"{layout.engine} {p.name} of {model.name} at the {what} geometry, tp {tp}"
                    )
                    got = field_shape(b, by_field[p.field], values, tp, ctx)
                    if p.pad is not None:  # the padded split is checked with or without shape:
                        got = _padded_share(eb, p, got, tp, ctx)
                    if p.shape is None:
                        continue
                    where = (*eb.base, "parameters", p.name, "shape")
                    located = eb.located or layout.located
                    try:
                        want = tuple(int(algebra.evaluate(e, at)) for e in p.shape)
                    except SpecbindError as exc:
                        raise located.error(where, f"{ctx}: {exc}") from None
                    if got != want:
                        raise located.error(
                            where,
                            f"{ctx}: the engine's shape is {list(want)}, field {p.field!r} "
                            f"binds {list(got)}",
                        )


def _padded_share(
    eb: EngineBlock, p: Parameter, whole: tuple[int, ...], tp: int, ctx: str
) -> tuple[int, ...]:
    """One rank's shape of a padded split of ``whole``: its axis padded up to a multiple of
    ``p.pad``, then split into tp equal shares (refused where tp does not split it)."""
    assert p.pad is not None
    padded = vocab_pad.padded_size(whole[p.pad_axis], p.pad)  # the one arithmetic of padding
    if padded % tp:
        assert eb.located is not None
        raise eb.located.error(
            (*eb.base, "parameters", p.name, "split" if p.split else "pad"),
            f"{ctx}: {whole[p.pad_axis]} rows, which tp {tp} does not split into equal shares"
            if p.split
            else f"{ctx}: {whole[p.pad_axis]} padded to a multiple of {p.pad} is {padded}, "
            f"which tp {tp} does not split",
        )
    return tuple(padded // tp if i == p.pad_axis else d for i, d in enumerate(whole))


def load_engines(
    root: Path, models: dict[str, Model], blocks: dict[str, Block]
) -> list[EngineLayout]:
    """Every ``specs/engines/<engine>/<model>.yaml``, parsed and checked, each block the file
    does not name taken from ``specs/engines/<engine>/blocks/<block>.yaml``."""
    out: list[EngineLayout] = []
    folder = root / "specs" / "engines"
    if not folder.is_dir():
        return out
    unavailable = {(u.engine, u.model) for u in load_unavailable(root, models)}
    shared: dict[str, dict[str, BlockLayout]] = {}  # engine -> block -> its layout
    for p in sorted(folder.glob("*/blocks/*.yaml")):
        rel = p.relative_to(root).as_posix()
        bl = parse_block_layout(yamlio.load(p, rel), p.parent.parent.name, blocks)
        if p.stem != bl.block:
            raise _lives_in(rel, bl.engine, "block", bl.block)
        shared.setdefault(bl.engine, {})[bl.block] = bl
    for p in sorted(folder.glob("*/*.yaml")):
        if (p.parent.name, p.stem) in unavailable:
            continue
        rel = p.relative_to(root).as_posix()
        layout = parse_engine(yamlio.load(p, rel), models, blocks, shared.get(p.parent.name))
        second = p.stem.startswith(f"{layout.model}-")
        if p.parent.name != layout.engine or not (p.stem == layout.model or second):
            raise SpecError(
                rel, "engine", None,
                f"the layout of {layout.engine} for {layout.model} lives in "
                f"specs/engines/{layout.engine}/{layout.model}.yaml (or, a second layout of "
                f"it, {layout.model}-<name>.yaml)",
            )  # fmt: skip
        if second and not layout.architectures:
            raise layout.located.error(
                ("model",),
                f"a second layout of {layout.model} is chosen by the checkpoint's "
                "architectures: say which (architectures:)",
            )
        _proof_file(root, layout.proof, "layout", partial(layout.located.error, ("proof", "test")))
        out.append(layout)
    _one_layout_an_architecture(out)
    return out


def _proof_file(
    root: Path, proof: str | None, what: str, error: Callable[[str], Exception]
) -> None:
    """A ``proof.test`` is a file of the suite: a proof naming no test proves nothing. Checked
    where the suite is (``root/tests``, a clone); an installed wheel ships no tests to name.
    ``error``: the refusal at the file's ``proof.test``, from its message."""
    if proof is None or not (root / "tests").is_dir():
        return
    if not (root / proof).is_file():
        raise error(
            f"{proof} is not a file of the suite: the proof names the test that runs the "
            f"{what} against the engine's own loader"
        )


def _lives_in(rel: str, engine: str, kind: str, name: str) -> SpecError:
    """The refusal of an engine's block or scheme layout filed under another name."""
    return SpecError(
        rel, kind, None,
        f"the {engine} layout of {kind} {name} lives in specs/engines/{engine}/{kind}s/{name}.yaml",
    )  # fmt: skip


def _one_layout_an_architecture(layouts: list[EngineLayout]) -> None:
    """No config.json architecture is served by two layouts of one engine."""
    seen: dict[tuple[str, str], str] = {}
    for e in layouts:
        for i, a in enumerate(e.architectures):
            other = seen.setdefault((e.engine, a), e.file)
            if other != e.file:
                raise e.located.error(
                    ("architectures", i), f"architecture {a!r} is also served by {other}"
                )


def load_unavailable(root: Path, models: dict[str, Model]) -> list[EngineUnavailable]:
    """Every ``specs/engines/<engine>/<model>.yaml`` that says ``unavailable:``, checked: the
    schema (nothing beside the reason), a known model, the file named after both."""
    folder = root / "specs" / "engines"
    out: list[EngineUnavailable] = []
    for p in sorted(folder.glob("*/*.yaml")) if folder.is_dir() else []:
        rel = p.relative_to(root).as_posix()
        doc = yamlio.load(p, rel)
        if not (isinstance(doc.data, dict) and "unavailable" in doc.data):
            continue
        validate_schema(doc, "engine")
        d = doc.data
        if d["model"] not in models:
            raise doc.error(
                ("model",), f"unknown model {d['model']!r} (specs: {', '.join(models)})"
            )
        engine = check_ident(doc, ("engine",), d["engine"], "engine name")
        if (p.parent.name, p.stem) != (engine, d["model"]):
            raise SpecError(
                rel, "engine", None,
                f"why {engine} cannot run {d['model']} lives in "
                f"specs/engines/{engine}/{d['model']}.yaml",
            )  # fmt: skip
        out.append(EngineUnavailable(engine, d["model"], rel, " ".join(d["unavailable"].split())))
    return out


def unproven(root: Path) -> list[str]:
    """The engine layout files (relative to ``root``) that name no ``proof:`` (a file saying
    ``unavailable:`` is no layout)."""
    folder = root / "specs" / "engines"
    out = []
    for p in sorted(folder.glob("*/*.yaml")) if folder.is_dir() else []:
        rel = p.relative_to(root).as_posix()
        data = yamlio.load(p, rel).data
        if isinstance(data, dict) and "unavailable" in data:
            continue
        if not (isinstance(data, dict) and data.get("proof")):
            out.append(rel)
    return out


@dataclass(frozen=True)
class SchemeLayout:
    """``specs/engines/<engine>/schemes/<scheme>.yaml``: how the engine holds the scheme's
    companions beside each quantized linear (or, ``unavailable``, why it cannot serve it)."""

    engine: str
    scheme: str
    file: str
    dtypes: dict[str, str]  # companion suffix -> the engine's dtype where wider than stored
    refused: dict[str, str]  # companion suffix -> why the engine does not serve it
    proof: str | None = None  # the suite's test file proving it against the engine's loader
    proof_tp: tuple[int, ...] = ()
    proof_models: tuple[str, ...] = ()
    unavailable: str | None = None  # the engine's own measured error line
    made_by_engine: tuple[str, ...] = ()  # parameter name endings the engine fills itself
    last: tuple[str, ...] = ()  # companions a fused linear holds of its last partner alone


_WIDENS = {"BF16", "F16"}  # stored float dtypes a ``dtype: F32`` widens exactly


def parse_scheme_layout(
    doc: Located, engine: str, schemes: dict[str, SchemeRule], models: Collection[str]
) -> SchemeLayout:
    """One engine's layout of one scheme, checked against the scheme: each of its companions is
    held (``companions``) or refused (``refused``), never both, none unknown; ``dtype: F32``
    widens only a BF16 or F16 companion; the proof's models are models of the specs."""
    validate_schema(doc, "engine_scheme")
    d = doc.data
    if d["engine"] != engine:
        raise doc.error(("engine",), f"a scheme layout under specs/engines/{engine}/ is {engine}'s")
    scheme = schemes.get(d["scheme"])
    if scheme is None:
        raise doc.error(
            ("scheme",), f"unknown scheme {d['scheme']!r} (specs/schemes: {', '.join(schemes)})"
        )
    if "unavailable" in d:
        reason = " ".join(d["unavailable"].split())
        return SchemeLayout(engine, scheme.name, doc.file, {}, {}, unavailable=reason)
    held: dict[str, Any] = d["companions"]
    refused: dict[str, str] = d.get("refused") or {}
    by_suffix = {c.suffix: c for c in scheme.companions}
    for key, table in (("companions", held), ("refused", refused)):
        for suffix in table:
            if suffix not in by_suffix:
                raise doc.error(
                    (key, suffix),
                    f"{scheme.name} has no companion {suffix!r} (it stores: "
                    f"{', '.join(by_suffix)})",
                )
    both = sorted(set(held) & set(refused))
    if both:
        raise doc.error(("refused", both[0]), f"companion {both[0]!r} is also held (companions)")
    left = [s for s in by_suffix if s not in held and s not in refused]
    if left:
        raise doc.error(
            ("companions",),
            f"companion {left[0]!r} of {scheme.name} is neither held nor refused: say which",
        )
    if scheme.weight.suffix in refused:
        raise doc.error(
            ("refused", scheme.weight.suffix), "the packed weight itself cannot be refused"
        )
    dtypes: dict[str, str] = {}
    for suffix, entry in held.items():
        want = entry.get("dtype")
        if want is None:
            continue
        stored = by_suffix[suffix].dtype
        if stored not in _WIDENS:
            raise doc.error(
                ("companions", suffix, "dtype"),
                f"{want} widens a BF16 or F16 companion; {scheme.name} stores {suffix!r} as "
                f"{stored}",
            )
        dtypes[suffix] = want
    proof = d["proof"]
    for i, m in enumerate(proof["models"]):
        if m not in models:
            raise doc.error(("proof", "models", i), f"unknown model {m!r} (specs/models)")
    return SchemeLayout(
        engine, scheme.name, doc.file, dtypes, {k: " ".join(v.split()) for k, v in refused.items()},
        proof["test"], tuple(proof["tp"]), tuple(proof["models"]), None,
        tuple((d.get("made_by_engine") or {}).get("params") or ()),
        tuple(k for k, e in held.items() if e.get("fused") == "last"),
    )  # fmt: skip


def load_scheme_layouts(
    root: Path, schemes: dict[str, SchemeRule], models: Collection[str]
) -> list[SchemeLayout]:
    """Every ``specs/engines/<engine>/schemes/<scheme>.yaml``, parsed and checked; the file is
    named after its scheme, and a proof names a file of the suite (where the suite is)."""
    folder = root / "specs" / "engines"
    out: list[SchemeLayout] = []
    for p in sorted(folder.glob("*/schemes/*.yaml")) if folder.is_dir() else []:
        rel = p.relative_to(root).as_posix()
        sl = parse_scheme_layout(yamlio.load(p, rel), p.parent.parent.name, schemes, models)
        if p.stem != sl.scheme:
            raise _lives_in(rel, sl.engine, "scheme", sl.scheme)
        _proof_file(root, sl.proof, "scheme", partial(SpecError, rel, "proof.test", None))
        out.append(sl)
    return out
