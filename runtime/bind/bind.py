"""Bind every tensor of a checkpoint through the generated binders: each slot of each layer,
and the model-level tensors.

Invariants: the layout (``runtime.layout.slots``) is computed from names alone and every problem in
it is refused before any tensor byte is read; every (block, geometry, ranks) is planned and
its constraints checked before binding starts; all layers are bound before any result is
returned, so a refusal never leaves a partial result behind; declared-unbound names (a vision
tower) are never read and are counted in the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping
from functools import partial
from typing import Any, Protocol

from specbind.core.dtypes import DTYPES
from specbind.core.errors import BindError, SpecbindError
from specbind.core.ir import FieldRule
from specbind.core.planning import BlockPlan, Ranks
from specbind.core.rank_args import check_ranks
from specbind.core.record import field, record, replace
from specbind.runtime.bind.preamble import open_layout, slot_quant
from specbind.runtime.binder.backends import ALIGN as ARENA_ALIGN
from specbind.runtime.binder.backends import NUMPY, Arena, Backend
from specbind.runtime.binder.checks import (
    BindReport,
    Stored,
    UnrecognisedError,
    fields_in,
    stored,
    stored_names,
)
from specbind.runtime.binder.quant import OUTPUTS as QUANT_OUTPUTS
from specbind.runtime.binder.quant import (
    LayerQuant,
    quant_metadata,
    quantize_rules,
    quantized_names,
)
from specbind.runtime.binder.tables import (
    BlockEntry,
    ModelTable,
    Weights,
    map_arrays,
)
from specbind.runtime.binder.tp import gather_room
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.io.progress import byte_bar, shown
from specbind.runtime.io.source import RawTensor, TensorSource
from specbind.runtime.layout.config import choose, config_flags, values_from_config
from specbind.runtime.layout.slots import LayerSource, Layout, declaring, global_full

GLOBALS = -1  # the "layer" index the model-level tensors are reported under


@record(frozen=False)
class SlotResult:
    slot: str
    block: str
    weights: Weights
    report: BindReport
    fields: Mapping[str, FieldRule]  # how each bound field is made and laid out


@record(frozen=False)
class LayerResult:
    index: int
    role: str  # "decoder" | "mtp"
    slots: dict[str, SlotResult] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(s.report.bytes for s in self.slots.values())

    @property
    def bound(self) -> int:
        return sum(s.report.bound for s in self.slots.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "role": self.role,
            "bound": self.bound,
            "bytes": self.bytes,
            "slots": {name: s.report.as_dict() for name, s in self.slots.items()},
        }


@record(frozen=False)
class BindResult:
    ranks: Ranks
    layers: list[LayerResult]
    globals: SlotResult | None
    unbound: dict[str, int]  # declared-unbound prefix -> tensors left unread, as declared
    seconds: float
    flags: dict[str, bool] = field(default_factory=dict)
    quant: str | None = None  # the --out metadata "quant": scheme, weight_only, outputs (JSON)
    mtp_skipped: list[int] = field(default_factory=list)  # MTP layers not bound (mtp=False)
    # "<block>.<tensor>" -> [stored rows, padded rows]: a vocabulary tp does not divide,
    # padded as vLLM pads it (``ModelTable.padding``); empty when nothing is padded
    padding: dict[str, list[int]] = field(default_factory=dict)

    def slots(self) -> Iterator[tuple[str, SlotResult]]:
        """Every bound slot by its ``--out`` name prefix: ``layers.{i}.{slot}`` or ``globals``."""
        for layer in self.layers:
            for name, slot in layer.slots.items():
                yield f"layers.{layer.index}.{name}", slot
        if self.globals is not None:
            yield "globals", self.globals

    def fields(self) -> dict[str, tuple[FieldRule, Any]]:
        """Every bound field by its ``--out`` name, with its rule (dtype, layout) and array."""
        return {
            f"{where}.{name}": (slot.fields[name], arr)
            for where, slot in self.slots()
            for name, arr in slot.weights.arrays().items()
        }

    @property
    def tp_size(self) -> int:
        return self.ranks.tp_size

    @property
    def tp_rank(self) -> int:
        return self.ranks.tp_rank

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp_size": self.ranks.tp_size,
            "tp_rank": self.ranks.tp_rank,
            "ep_size": self.ranks.ep_size,
            "ep_rank": self.ranks.ep_rank,
            "globals": None if self.globals is None else self.globals.report.as_dict(),
            "layers": [layer.as_dict() for layer in self.layers],
            "declared_unbound": dict(self.unbound),
            **({"mtp_not_bound": list(self.mtp_skipped)} if self.mtp_skipped else {}),
            **({"padding": dict(self.padding)} if self.padding else {}),
            "bytes": sum(x.bytes for x in self.layers)
            + (self.globals.report.bytes if self.globals else 0),
            "seconds": round(self.seconds, 6),
        }


class GlobalSource:
    """The model-level tensors by the globals block's names (some sit at the checkpoint root)."""

    def __init__(
        self, ckpt: TensorSource, names: Mapping[str, str], absent: Callable[[str], str] = str
    ) -> None:
        self._ckpt = ckpt
        self._full = dict(names)
        self._absent = absent  # the full name an absent one would have (``slots.global_full``)

    def names(self) -> list[str]:
        return list(self._full)

    def get(self, name: str) -> RawTensor | None:
        full = self._full.get(name)
        return None if full is None else self._ckpt.get(full)

    def stored(self, name: str) -> Stored:
        """As ``NamedView.stored``, for the globals block's name (``lm_head.weight``); an
        absent one under the checkpoint's layer prefix, or at the root where it sits there."""
        full = self._full.get(name) or self._absent(name)
        got = stored(self._ckpt, full)
        return got if got.read_as is None else replace(got, read_as=name)


def bind_checkpoint(
    ckpt: CheckpointDir,
    table: ModelTable[Any],
    overrides: dict[str, int] | None = None,
    tp_size: int = 1,
    tp_rank: int = 0,
    progress: bool | None = None,
    kinds: Collection[str] | None = None,
    backend: Backend = NUMPY,
    ep_size: int = 1,
    ep_rank: int = 0,
    allow_unshared_scales: bool = False,
    mtp: bool = True,
    quant_outputs: Collection[str] = (),
    sink: Sink | None = None,
    into: Arena | None = None,
    dtype: str | None = None,
) -> BindResult:
    """Bind every tensor (or, when ``kinds`` names blocks, those blocks' slots only; the whole
    layout is still checked, so an unknown or unclaimed tensor is refused either way).

    A quantized checkpoint (its config names one of ``table.schemes``) binds its quantized
    linears packed, with their companions; ``quant_outputs`` asks for the optional layouts
    (``swizzled`` block scales, ``dequantized`` BF16); scales the blocks declare shared must be
    equal unless ``allow_unshared_scales``. ``mtp=False`` binds the decoder alone: the MTP
    layers config.json counts are not required, and those present are not read
    (``BindResult.mtp_skipped``).

    With a ``sink`` the bind streams: ``sink.start`` learns every field that may come, before
    any tensor is read; each slot goes to ``sink.slot`` as soon as it is bound, then its
    weights are dropped from the result (its report stays) and the map pages of the layer's
    source tensors are released, so memory holds one slot's output at a time, not the rank's.

    With ``into`` (an ``Arena``: the caller's host memory) every field of the result lies in
    the arena: the ops write the fields they make there, and each field that would be a view of
    the mapped checkpoint is copied in once, so each byte of the rank is written once, where the
    caller wants it. The arena reserves the rank's planned bytes first (their pages mapped in
    ahead of the writes, on another core), and, as a streaming bind does, each layer's map
    pages are released once it is bound: memory holds the arena, not the arena and the mapped
    checkpoint. A streaming bind (``sink``) keeps no field, so the two are refused together.

    ``dtype`` (BF16 or F16): the half dtype the spec's BF16 tensors bind in; None: the
    checkpoint's own, from config.json (``config.choose``), where the model spec allows it.
    """
    t0 = time.perf_counter()
    if into is not None and sink is not None:
        raise BindError(
            "into=Arena keeps every field; a streaming bind (--out, report-only) keeps none"
        )
    if into is not None and backend.device:
        raise BindError(
            f"into=Arena holds host memory; the {backend.name} backend binds on the device"
        )
    # every bind comes through here: True (== 1) or 2.0 is refused here, whoever calls
    tp_size, tp_rank = check_ranks("bind", tp_size, tp_rank)
    ep_size, ep_rank = check_ranks("bind", ep_size, ep_rank, "ep")
    ranks = Ranks(tp_size, tp_rank, ep_size, ep_rank)
    values = values_from_config(table, ckpt.config, overrides)
    geometry = table.make_geometry(values)
    flags = config_flags(table, ckpt.config)
    unknown_out = sorted(set(quant_outputs) - set(QUANT_OUTPUTS))
    if unknown_out:
        raise BindError(f"unknown quantized output(s) {unknown_out} (known: {list(QUANT_OUTPUTS)})")
    qout = frozenset(quant_outputs)
    half = choose(table.name, table.dtypes, ckpt.config, dtype)
    opened = open_layout(ckpt, table, values, mtp)
    qconf, view, lay = opened.qconf, opened.view, opened.lay
    if qconf is not None and half != "BF16":
        raise BindError(
            f"{ckpt.root}: a {qconf.scheme.name} checkpoint binds in its spec's dtypes; "
            f"{half} is for unquantized checkpoints"
        )
    qmeta = None
    if qconf is not None:
        s = qconf.scheme
        qmeta = quant_metadata(s.name, qconf.weight_only, qout, s.values, s.sym)
    used: dict[str, BlockEntry[Any]] = {}
    for lay_layer in lay.layers.values():
        for fill in lay_layer.slots.values():
            assert fill.block is not None
            used[fill.block.name] = fill.block
    glob_block = table.block(table.globals) if table.globals and lay.globals else None
    if glob_block is not None:
        used[glob_block.name] = glob_block
    refuse_idle_ep(table.name, table.blocks, ranks.ep_size)
    plans: dict[str, BlockPlan] = {}  # a bad (geometry, ranks) is refused before any read
    for b in used.values():
        plans[b.name] = b.plan(geometry, ranks)
        b.check(geometry, ranks)
    # each slot's quantization, from names and configs alone: refused before any byte is read
    quant = slot_quant(table, opened, geometry, qout, allow_unshared_scales)
    if not any(
        lq is not None and (kinds is None or _block_of(lay, i, s) in kinds)
        for (i, s), lq in quant.items()
    ):
        qmeta = None  # no bound field is stored by the scheme: no record a reload could check
    if into is not None:  # what the bind will carve: its pages mapped ahead of the writes
        into.reserve(_arena_bytes(lay, kinds, glob_block, plans, geometry, ranks, quant))
    if sink is not None:
        sink.start(_expected(lay, kinds, glob_block, quant, qmeta))
    out: list[LayerResult] = []
    # progress=None: a bar only when stderr is a terminal, unless the caller says otherwise;
    # it counts the bytes of this rank's share each layer reads, sized only when it is drawn.
    on = (
        glob_block
        if glob_block is not None and (kinds is None or glob_block.name in kinds)
        else None
    )
    sizes = _read_bytes(lay, kinds, plans, quant, on) if shown(progress) else None
    total = None if sizes is None else sum(sizes.values())
    with byte_bar(total, progress, "bind") as step:
        for lay_layer in lay.layers.values():
            bound = LayerResult(lay_layer.index, lay_layer.role)
            full = lay.split.full_name(table, lay_layer.index, "")
            for slot, fill in lay_layer.slots.items():
                assert fill.block is not None
                if kinds is not None and fill.block.name not in kinds:
                    continue
                src: TensorSource = LayerSource(view, full, fill.names)
                lq = quant[(lay_layer.index, slot)]
                try:
                    bound.slots[slot] = _bind_one(
                        fill.block,
                        slot,
                        geometry,
                        ranks,
                        lay_layer.index,
                        src,
                        backend,
                        flags,
                        lq,
                        into,
                        half,
                    )
                except UnrecognisedError as e:
                    raise BindError(str(e) + _variant(table, slot, fill.names, e, src)) from None
                if sink is not None:
                    where = f"layers.{lay_layer.index}.{slot}"
                    bound.slots[slot] = _handed(sink, where, bound.slots[slot])
            if sink is not None or into is not None:  # no field views the map: drop its pages
                ckpt.release(
                    view.on_disk(full + n) for fill in lay_layer.slots.values() for n in fill.names
                )
            out.append(bound)
            step(sizes[lay_layer.index] if sizes else 0)
        glob = None
        if on is not None:
            gsrc = GlobalSource(view, lay.globals, partial(global_full, on, lay.split.prefix))
            glob = _bind_one(
                on, "globals", geometry, ranks, GLOBALS, gsrc, backend, flags, None, into, half
            )
            if sink is not None:
                glob = _handed(sink, "globals", glob)
            if sink is not None or into is not None:
                ckpt.release(view.on_disk(n) for n in lay.globals.values())
            step(sizes[GLOBALS] if sizes else 0)
    unbound = {p: len(ns) for p, ns in lay.unbound.items() if ns}
    # no shard shrank under the bind, on every route (CLI, API, torchrun), before a sink's
    # file is kept: a cut inside the last page reads as zeros, never a fault (checkpoint.py)
    ckpt.check_sizes()
    seconds = time.perf_counter() - t0
    return BindResult(
        ranks, out, glob, unbound, seconds, flags, qmeta, sorted(lay.mtp_skipped),
        table.padding(values, ranks),
    )  # fmt: skip


def _variant(
    table: ModelTable[Any], slot: str, names: list[str], e: UnrecognisedError, src: TensorSource
) -> str:
    """What a refusal of unrecognised tensors adds when another block of the slot declares
    them all: that block, and the tensors it needs that the layer lacks (stored names)."""
    other = declaring(table, slot, names, e.names)
    if other is None:
        return ""
    block, missing = other
    return (
        f"; they are tensors of a {block.name} block, which also needs "
        f"{stored_names(src, missing)}, absent from this layer"
    )


def _read_bytes(
    lay: Layout, kinds: Collection[str] | None, plans: Mapping[str, BlockPlan],
    quant: Mapping[tuple[int, str], LayerQuant | None], glob: BlockEntry[Any] | None,
) -> dict[int, int]:  # fmt: skip
    """By layer index (the model-level tensors under ``GLOBALS``), the bytes of this rank's
    share of the tensors its bound slots hold (packed where a slot is stored quantized), from
    the plans alone: the progress bar's steps."""
    cache: dict[tuple[str, Any], BlockPlan] = {}

    def held(block: BlockEntry[Any], names: Collection[str], lq: LayerQuant | None) -> int:
        key = (block.name, None if lq is None else lq.quantized)
        if key not in cache:
            cache[key] = quantize_rules(block.name, block.tensors, plans[block.name], lq)[1]
        plan = cache[key].tensors
        return sum(plan[n].local_bytes for n in names if n in plan)

    out = {
        x.index: sum(
            held(fill.block, fill.names, quant.get((x.index, slot)))
            for slot, fill in x.slots.items()
            if fill.block is not None and (kinds is None or fill.block.name in kinds)
        )
        for x in lay.layers.values()
    }
    if glob is not None:
        out[GLOBALS] = held(glob, lay.globals, None)
    return out


def _block_of(lay: Any, index: int, slot: str) -> str:
    fill = lay.layers[index].slots[slot]
    assert fill.block is not None
    return str(fill.block.name)


def _arena_bytes(
    lay: Layout,
    kinds: Collection[str] | None,
    glob: BlockEntry[Any] | None,
    plans: Mapping[str, BlockPlan],
    geometry: Any,
    ranks: Ranks,
    quant: Mapping[tuple[int, str], LayerQuant | None],
) -> int:
    """What a bind into an arena carves out of it, from shapes alone: every bound field (the
    binder's own shapes, ``BlockEntry.bound_shapes``, with the slot's quantization and without
    the optional groups its names lack; a tied field shares its source's bytes), plus the room
    a column shard is gathered into when a transform, not a field, keeps it (an ``o_proj`` an
    absorb reads), each rounded up to the arena's alignment. Exact where the ops make every
    field in the arena: the reservation then populates no page the bind does not write."""
    shapes: dict[tuple[str, frozenset[str], frozenset[str]], int] = {}

    def slot_bytes(block: BlockEntry[Any], index: int, names: Collection[str], lq: Any) -> int:
        plan = plans[block.name]
        held = [p for n, p in plan.tensors.items() if n in names]
        group = {r.name: r.group for r in block.tensors}
        absent = frozenset(block.optional_groups) - {group.get(p.pattern) for p in held}
        key = (block.name, frozenset() if lq is None else lq.quantized, absent)
        if key not in shapes:
            bound = block.bound_shapes(geometry, ranks, index, lq, absent)
            shapes[key] = sum(
                _aligned(DTYPES[x.dtype].nbytes(x.shape))
                for f, x in bound.items()
                if f not in block.fields or block.fields[f].kind != "tie"
            )
        # a column shard gathered into room of its own that no field keeps as it is (an absorb's
        # o_proj); one a verbatim field is made of is that field's bytes, counted above
        kept = {s[0] for f, s in block.sources.items() if block.fields[f].kind == "verbatim"}
        room = sum(
            _aligned(p.local_bytes)
            for p in held
            if gather_room(plan, p) == "shard" and p.pattern not in kept
        )
        return shapes[key] + room

    total = 0
    for x in lay.layers.values():
        for slot, fill in x.slots.items():
            if fill.block is not None and (kinds is None or fill.block.name in kinds):
                total += slot_bytes(fill.block, x.index, fill.names, quant.get((x.index, slot)))
    if glob is not None and (kinds is None or glob.name in kinds):
        total += slot_bytes(glob, GLOBALS, lay.globals, None)
    return total


def _aligned(n: int) -> int:
    return -(-n // ARENA_ALIGN) * ARENA_ALIGN


def refuse_idle_ep(model: str, blocks: Collection[BlockEntry[Any]], ep_size: int) -> None:
    """Expert parallelism splits expert families only: a model none of whose blocks has one
    would give every ep rank the same weights, so ``ep > 1`` is refused. (A checkpoint of a
    MoE model that holds only its dense layers binds: ep ranks replicate dense layers.)"""
    if ep_size > 1 and not any(b.module.FAMILIES for b in blocks):
        names = ", ".join(sorted(b.name for b in blocks))
        raise BindError(
            f"--ep-size {ep_size}: {model} has no expert family in its layers ({names}); "
            "expert parallelism would give every ep rank the same weights"
        )


class Sink(Protocol):
    """Where a streaming bind puts each slot as soon as it is bound (``StreamWriter``)."""

    def start(self, expected: Expected) -> None: ...
    def slot(self, where: str, bound: SlotResult) -> None: ...


@record
class Expected:
    """What a bind will produce, known before any tensor is read: every field name that may be
    written (optional fields may not be) and each layer's role and slot blocks."""

    names: list[str]
    layers: dict[int, tuple[str, dict[str, str]]]  # index -> (role, slot -> block)
    quant: str | None = None  # as BindResult.quant


class ReportOnly:
    """The ``Sink`` of a bind that only checks and reports (``bind`` without ``--out``): each
    slot's arrays are dropped as soon as it is bound and the layer's map pages released, so a
    whole rank is never in memory at once; the result keeps every report and no array."""

    def start(self, expected: Expected) -> None:
        pass

    def slot(self, where: str, bound: SlotResult) -> None:
        pass


class _NoWeights:
    """The weights of a slot already handed to a sink: none kept."""

    def arrays(self) -> dict[str, Any]:
        return {}


def _handed(sink: Sink, where: str, bound: SlotResult) -> SlotResult:
    sink.slot(where, bound)
    return SlotResult(bound.slot, bound.block, _NoWeights(), bound.report, bound.fields)


def _expected(
    lay: Layout,
    kinds: Collection[str] | None,
    glob: BlockEntry[Any] | None,
    quant: Mapping[tuple[int, str], LayerQuant | None],
    qmeta: str | None,
) -> Expected:
    names: list[str] = []
    layers: dict[int, tuple[str, dict[str, str]]] = {}
    for x in lay.layers.values():
        slots: dict[str, str] = {}
        for slot, fill in x.slots.items():
            assert fill.block is not None
            if kinds is None or fill.block.name in kinds:
                slots[slot] = fill.block.name
                lq = quant.get((x.index, slot))
                fields = [n for f in fill.block.fields for n in (f, *quantized_names(f, lq))]
                names += [f"layers.{x.index}.{slot}.{f}" for f in fields]
        layers[x.index] = (x.role, slots)
    if glob is not None and (kinds is None or glob.name in kinds):
        names += [f"globals.{f}" for f in glob.fields]
    return Expected(names, layers, qmeta)


def _bind_one(
    block: BlockEntry[Any],
    slot: str,
    geometry: Any,
    ranks: Ranks,
    index: int,
    src: TensorSource,
    backend: Backend,
    flags: Mapping[str, bool],
    quant: LayerQuant | None,
    into: Arena | None = None,
    half: str = "BF16",
) -> SlotResult:
    where = f"layer {index}" if index >= 0 else "model"
    try:
        weights, report = block.bind(geometry, ranks, index, src, backend, flags, quant, into, half)
        if into is not None:  # what the ops did not make in the arena: views of the map
            keep = {f for b, f in into.views if b == block.name}  # left as views for the caller
            weights = map_arrays(weights, lambda f, a: a if f in keep else into.place(a))
    except SpecbindError as e:
        if str(e).startswith(f"{where}: "):
            raise
        raise type(e)(f"{where}: {e}") from None  # an op error names the field only
    report.slot = slot
    extra = getattr(weights, "quant", None)  # QuantFields of a quantized block, else None
    fields = fields_in(block.fields, half) | (extra.rules if extra is not None else {})
    return SlotResult(slot, block.name, weights, report, fields)
