"""What a rank's bound file must hold, from the spec alone: every field's name, shape and dtype.

``check_fields`` takes a reloaded file's entries (name -> dtype, shape) and the record's
model table, geometry, ranks, layers and quantization, and refuses, naming the tensor:
- a tensor that no recorded (layer, slot) or the globals explain;
- a field the spec's block requires there that the file lacks (each recorded layer holds
  exactly the slots of its role, ``ModelTable.slot_blocks``; a model with a globals block
  holds the globals: a bind always writes them), or an optional group present in part;
- a field whose shape or dtype is not what the block's binder makes at the recorded geometry
  and ranks. The expected values are the binder's own: the generated ``assemble`` run on
  shapes alone (``BlockEntry.bound_shapes``), quantized outputs included.
So a geometry that disagrees with the tensors is refused naming the first field it misshapes.
Quantization: the record names the scheme, not which linears it stored packed; a field whose
stored dtype is the scheme's packed dtype (and not its own) is taken as packed, and then its
companions, at their shapes, are required beside it; any other field must be unpacked. A
record whose scheme no field is stored by is refused (a bind records none then).
Invariant: nothing here reads tensor bytes; one slot's expectation is computed once per
(block, packed sources, absent groups) and reused across layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specbind.core.errors import ReloadError, SpecbindError
from specbind.core.planning import Ranks
from specbind.core.record import record
from specbind.runtime.binder.quant import LayerQuant
from specbind.runtime.binder.shapes import Shaped
from specbind.runtime.binder.tables import BlockEntry, ModelTable
from specbind.runtime.bound.bound_format import Layers

GLOBALS = -1  # the layer index the model-level tensors are bound under (runtime.bind.bind)


@record
class Entry:
    dtype: str
    shape: tuple[int, ...]


@record
class _Slot:
    where: str  # "layers.3.mlp", or "globals"
    index: int
    block: BlockEntry[Any]


def check_fields(
    where: str,
    table: ModelTable[Any],
    values: Mapping[str, int],
    ranks: Ranks,
    layers: Layers,
    quant: LayerQuant | None,
    entries: Mapping[str, Entry],
    half: str = "BF16",
) -> None:
    """Refuse, naming ``where`` and the tensor, any way ``entries`` differ from what a bind of
    ``table`` at ``values`` and ``ranks`` writes for ``layers`` (the module docstring); the
    spec's BF16 fields are expected in ``half``, the half dtype the bind chose."""
    g = table.make_geometry(dict(values))
    slots = _slots(where, table, layers)
    prefixes = {s.where + ".": s for s in slots}
    owned: dict[str, list[str]] = {s.where: [] for s in slots}
    for name in sorted(entries):
        head, _, rest = name.rpartition(".")
        slot = prefixes.get(head + ".") if rest else None
        if slot is None:
            raise ReloadError(
                f"{where}: tensor {name} is no field of the layers its metadata names"
            )
        owned[slot.where].append(rest)
    cache: dict[tuple[str, frozenset[str], frozenset[str]], dict[str, Shaped]] = {}
    packed = False
    for s in slots:
        have = {f: entries[f"{s.where}.{f}"] for f in owned[s.where]}
        packed |= _check_slot(where, s, g, ranks, quant, have, cache, half)
    if quant is not None and not packed:
        raise ReloadError(
            f"{where}: metadata quant records scheme {quant.scheme.name}, but no field is "
            f"stored in its packed layout ({quant.scheme.weight.dtype} beside its companions): "
            "the record and the tensors disagree"
        )


def _slots(where: str, table: ModelTable[Any], layers: Layers) -> list[_Slot]:
    out: list[_Slot] = []
    for index, (role, blocks) in sorted(layers.items()):
        want = [r.name for r in table.slot_blocks(role)]
        missing = [s for s in want if s not in blocks]
        if missing:
            raise ReloadError(
                f"{where}: layer {index} ({role}) records no slot {missing[0]}; a {role} layer "
                f"of {table.name} holds {want}"
            )
        for slot, block in blocks.items():
            if slot not in want:
                raise ReloadError(
                    f"{where}: layer {index} ({role}) records slot {slot!r}, which a {role} "
                    f"layer of {table.name} does not have ({want})"
                )
            out.append(_Slot(f"layers.{index}.{slot}", index, table.block(block)))
    if table.globals:
        out.append(_Slot("globals", GLOBALS, table.block(table.globals)))
    return out


def _packed(s: _Slot, quant: LayerQuant | None, have: Mapping[str, Entry]) -> frozenset[str]:
    """The linear rules whose fields the file holds in the scheme's packed dtype."""
    if quant is None:
        return frozenset()
    linear = {r.name for r in s.block.tensors if r.linear}
    packed = quant.scheme.weight.dtype
    out: set[str] = set()
    for f, rule in s.block.fields.items():
        e = have.get(f)
        if rule.kind in ("transform", "tie") or e is None:
            continue
        if e.dtype == packed != rule.dtype and all(x in linear for x in s.block.sources[f]):
            out.update(s.block.sources[f])
    if quant.scheme.weight.template:  # a transform's linear, its packed weight bound beside it
        suffix = quant.scheme.weight.suffix
        for f, rule in s.block.fields.items():
            srcs = s.block.sources[f]
            if rule.kind == "transform" and len(srcs) == 1 and f"{f}_{suffix}" in have:
                out.update(x for x in srcs if x in linear)
    return frozenset(out)


def _check_slot(
    where: str,
    s: _Slot,
    g: Any,
    ranks: Ranks,
    quant: LayerQuant | None,
    have: Mapping[str, Entry],
    cache: dict[tuple[str, frozenset[str], frozenset[str]], dict[str, Shaped]],
    half: str = "BF16",
) -> bool:
    """Refuse the slot's fields unless they are what its block binds (its BF16 fields in
    ``half``); True when some field is stored packed (the record's scheme is reflected)."""
    packed = _packed(s, quant, have)
    lq = None if quant is None or not packed else _with(quant, packed, s)
    full = _expected(where, s, g, ranks, lq, frozenset(), cache)
    absent: set[str] = set()
    for group in s.block.optional_groups:
        without = _expected(where, s, g, ranks, lq, frozenset({group}), cache)
        carried = sorted(set(full) - set(without))
        held = [f for f in carried if f in have]
        if not held:
            absent.add(group)
        elif len(held) != len(carried):
            lost = next(f for f in carried if f not in have)
            raise ReloadError(
                f"{where}: {s.where}.{lost} is missing, but its optional group {group!r} is "
                f"there ({s.where}.{held[0]}); a group is bound whole or not at all"
            )
    want = _expected(where, s, g, ranks, lq, frozenset(absent), cache)
    extra = sorted(set(have) - set(want))
    if extra:
        raise ReloadError(
            f"{where}: tensor {s.where}.{extra[0]} is no field of block {s.block.name} as the "
            "file holds it (packed fields bring their companions, unpacked ones none)"
        )
    missing = sorted(set(want) - set(have))
    if missing:
        raise ReloadError(
            f"{where}: {s.where}.{missing[0]} is missing: block {s.block.name} binds it at "
            "the recorded geometry; the file was cut or edited — bind it again"
        )
    for f in sorted(want):
        e, x = have[f], want[f]
        dtype = half if x.dtype == "BF16" else x.dtype  # as checks.fields_in reads the rules
        if e.dtype != dtype or e.shape != x.shape:
            raise ReloadError(
                f"{where}: {s.where}.{f} is {e.dtype} {list(e.shape)}; block {s.block.name} "
                f"binds {dtype} {list(x.shape)} at the recorded geometry ({_ranks(ranks)}): "
                "the tensor or the metadata geometry is wrong"
            )
    return bool(packed)


def _with(quant: LayerQuant, packed: frozenset[str], s: _Slot) -> LayerQuant:
    axes = tuple((r.name, r.linear_axes) for r in s.block.tensors if r.linear_axes)
    return LayerQuant(quant.scheme, quant.weight_only, packed, quant.outputs, axes=axes)


def _expected(
    where: str,
    s: _Slot,
    g: Any,
    ranks: Ranks,
    lq: LayerQuant | None,
    absent: frozenset[str],
    cache: dict[tuple[str, frozenset[str], frozenset[str]], dict[str, Shaped]],
) -> dict[str, Shaped]:
    key = (s.block.name, frozenset() if lq is None else lq.quantized, absent)
    if key not in cache:
        try:
            s.block.check(g, ranks)
            cache[key] = s.block.bound_shapes(g, ranks, s.index, lq, absent)
        except SpecbindError as e:
            raise ReloadError(
                f"{where}: {s.where}: the recorded geometry and ranks are refused: {e}"
            ) from None
    return cache[key]


def _ranks(r: Ranks) -> str:
    return f"tp rank {r.tp_rank} of {r.tp_size}, ep rank {r.ep_rank} of {r.ep_size}"
