"""The checkpoint under the specs' names, its layout, and each slot's quantization: the
names-only preamble that ``bind``, ``plan`` and the ranks under torchrun share.

Names (``NamedView``): the model spec's ``names`` rules (like transformers' conversion
mapping) say how other writers name the same tensors: a model-level name (``scope: model``,
under one of the text model's prefixes: ``backbone.norm_f.weight`` -> ``backbone.norm.weight``)
renamed whole or as a prefix, a layer-relative prefix renamed
(``self_attn.forget_gate.`` -> ``self_attn.``, ``attn_hc.`` -> ``hc_attn_``), one whole
name with a member index renamed member by member (``block_sparse_moe.experts.{e}.w1.weight`` ->
``mlp.experts.{e}.gate_proj.weight``), or one stored tensor read as row sections: N equal
segments (``self_attn.conv1d.weight`` [3Q, 1, K] -> q, k, v ``_conv1d.weight`` [Q, 1, K]), or
unequal ones whose row counts are geometry expressions (a Mamba2 ``in_proj`` [z; x; B; C; dt]),
evaluated at the geometry the bind uses (``--set`` included).
A quantization scheme whose packed weight is not stored as ``weight`` (compressed-tensors'
``weight_packed``) is seen under the linear's own name.

Invariants:
- a segment or section is a contiguous row range of the stored bytes (zero-copy); a tp row
  shard of a section is then a slice of that section, so rank r of a fused ``[q; k; v]`` gets
  ``[q_r; k_r; v_r]`` and never a contiguous third of the fused tensor — by construction, and
  each section may shard by its own unit (its block's rule);
- sections whose sizes do not add up to the stored rows are refused, naming each size;
- a rule's ``axis`` reads sections of another axis (Llama 4's stacked ``gate_up_proj
  [E, X, 2I]`` as ``[gate | up]`` of its last axis): each section is the tensor whose block
  shards it by its own rule, so rank r's shares concatenate to ``[gate_r | up_r]``, never a
  contiguous half of the whole;
- a rename that would give two tensors one name is refused, naming both;
- the first rule that matches a name wins, so a placeholder rule listed before a prefix rule
  over the same prefix takes its members first;
- an unstacked tensor (``unstack: true``, GraniteMoE's ``input_linear`` [E, 2I, X]) is read
  member by member, each member's contiguous bytes (zero-copy), then in equal row segments:
  member i's ``[gate_i; up_i]`` as ``experts.{i}.gate_proj`` / ``up_proj``, so an ep rank
  reads only its experts' bytes and a tp row shard of a segment is that segment's rows;
- a layer or member index follows the digit rule of ``core.patterns`` (``experts.07.w1`` is
  not renamed: it passes through, and the block refuses it as unknown);
- everything not renamed passes through untouched; ``on_disk`` gives a name's stored name
  (what a tool's config lists, e.g. ModelOpt's ``exclude_modules``);
- every refusal names a tensor through ``stored``: the full stored name, where in a fused or
  stacked tensor it lies, and for a tensor the checkpoint lacks the name it would be stored
  under (the renames read backwards, ``expected``); never a name of the specs alone.
Trap: a stored row count that does not split into whole segments is refused, never rounded.
Trap: a section of a non-row axis is strided in the file, so it is copied into one buffer when
read (every member of a stacked tensor, whatever the ep rank holds); a row section is not.
Trap: section sizes need the geometry; a view opened without one (``audit``) reads it from
config.json, and a config that cannot give it refuses the sectioned names only.

Opening (``open_layout``, ``slot_quant``): everything here reads names, headers and configs,
never tensor bytes; a layout problem is refused (``refuse_problems``) before any slot's
quantization is decided, and a quantization the config and the tensors disagree on is
refused here, before any byte is read.
Trap: ``audit`` does not use ``open_layout``: it reports these problems instead of refusing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from specbind.core import algebra
from specbind.core.errors import BindError, CheckpointError, SpecbindError
from specbind.core.ir import NameRule
from specbind.core.patterns import LayerPattern, fill, index_of, layer_pattern, parts
from specbind.core.record import record
from specbind.runtime.binder.checks import Stored
from specbind.runtime.binder.quant import LayerQuant
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.io.source import MapSpan, RawTensor
from specbind.runtime.layout.config import values_from_config
from specbind.runtime.layout.slots import Layout, layout
from specbind.runtime.quant.layers import layer_quant
from specbind.runtime.quant.scheme import QuantConfig, detect, packed_names


class NamedView:
    """The checkpoint's tensors under the names the specs use."""

    def __init__(
        self,
        ckpt: CheckpointDir,
        pattern: str,
        rules: tuple[NameRule, ...],
        suffixes: Mapping[str, str] | None = None,
        values: Callable[[], Mapping[str, int]] | None = None,
        prefixes: tuple[str, ...] = ("",),
    ) -> None:
        self._ckpt = ckpt
        self.root: Path = ckpt.root
        rx = layer_pattern(pattern)  # under any prefix: the view is made before the split
        self._rx = rx
        self._rules = tuple(r for r in rules if r.scope == "layer")
        # model-level renames, tried under each text-model prefix, the longest first
        heads = sorted(set(prefixes) | {""}, key=len, reverse=True)
        model = tuple((p, r) for r in rules if r.scope == "model" for p in heads)
        self._values = values  # the geometry sections are sized at, asked for when first needed
        self._sizes: dict[str, tuple[int, ...]] = {}  # a rule's section sizes, evaluated once
        # name -> (stored, segment, of n, the rule's section sizes as written; () equal,
        # (member, members) of an unstacked [members, ...] tensor or None, the sectioned axis)
        self._map: dict[str, Mapped] = {}
        self._model = model
        self._plain_rules: set[int] | None = None  # see ``_plain``
        stored = ckpt.names()
        for n in stored:
            for new, seg, of, sizes, member, axis in _mapped(
                n, rx, self._rules, suffixes or {}, model, self._members
            ):
                if new in self._map:
                    raise CheckpointError(
                        f"{n} and {self._map[new][0]} would both be read as {new}; refusing "
                        "to guess"
                    )
                self._map[new] = (n, seg, of, sizes, member, axis)

    @property
    def config(self) -> dict[str, Any]:
        return self._ckpt.config

    def _members(self, stored: str) -> int:
        """How many members the stored [members, ...] tensor holds on axis 0 (its header)."""
        t = self._ckpt.get(stored)
        if t is None or len(t.shape) < 2 or t.shape[0] < 1:
            shape = None if t is None else list(t.shape)
            raise CheckpointError(f"{stored} is read member by member, but its shape is {shape}")
        return int(t.shape[0])

    def side_file(self, fn: str) -> Any | None:
        return self._ckpt.side_file(fn)

    def unindexed_files(self) -> list[str]:
        return self._ckpt.unindexed_files()

    def names(self) -> list[str]:
        return list(self._map)

    def on_disk(self, name: str) -> str:
        return self._map[name][0] if name in self._map else name

    def stored(self, name: str) -> Stored:
        """Where ``name`` (a full name the specs use) lies in the checkpoint: its stored name,
        and for a segment, section or member of a fused or stacked tensor the first stored row
        and member; for a name the checkpoint lacks, the name it would be stored under
        (``expected``). What a refusal names (``runtime.binder.checks.Stored``)."""
        hit = self._map.get(name)
        if hit is None:
            want = self.expected(name)
            return Stored(want, None if want == name else name)
        stored, seg, of, sizes, member, axis = hit
        if of == 1 and member is None:
            return Stored(stored, None if stored == name else name)
        t = self._ckpt.get(stored)
        shape = None if t is None else tuple(t.shape)
        if axis:  # a section of another axis starts at no row: named without coordinates
            return Stored(stored, name, None, None, shape)
        if member is not None:  # rows of member i, counted in the member's own rows
            rows = shape[1] if shape is not None and len(shape) > 1 else 0
            row = seg * (rows // of) if of > 1 else None
            return Stored(stored, name, member[0], row, shape)
        rows = shape[0] if shape else 0
        if not sizes:
            return Stored(stored, name, None, seg * (rows // of), shape)
        try:
            got: tuple[int, ...] | None = self._evaluated(stored, sizes)
        except SpecbindError:
            got = None  # the sizes cannot be told: the section is named without its row
        return Stored(stored, name, None, None if got is None else sum(got[:seg]), shape)

    def stored_name(self, name: str) -> str:
        """``stored(name).name``: the full stored name alone."""
        return self.stored(name).name

    def expected(self, name: str) -> str:
        """The stored name a full name the specs use would have in this checkpoint, which
        lacks it: read backwards through the first rename (in the spec's order, prefix renames
        last) that gives it and that no name stored under the specs' own names contradicts
        (``mlp.experts.4.gate_proj.weight`` -> ``block_sparse_moe.experts.4.w1.weight``, unless
        the other experts are stored as ``mlp.experts.N.gate_proj.weight``); else the name
        itself. A fused tensor is named whole (``mixer.conv1d.weight`` for its x section)."""
        plain = self._plain()
        hit = self._rx.split(name)
        if hit is None:
            for head, r in self._model:
                if id(r) in plain or not name.startswith(head):
                    continue
                back = _backwards(r, name[len(head) :])
                if back is not None and _model_level(head + back, self._model) == name:
                    return head + back
            return name
        head, _, rel = hit
        # a rule naming one tensor, its members or its sections before a prefix rename: a
        # fused conv is named whole even where a wider prefix rule would also give a name
        for r in sorted(self._rules, key=lambda r: r.source.endswith((".", "_"))):
            back = None if id(r) in plain else _backwards(r, rel)
            if back is None:
                continue
            if r.unstack or len(r.to) > 1:
                return head + back
            forward = _mapped(head + back, self._rx, self._rules, {})
            if forward and forward[0][0] == name:
                return head + back
        return name

    def _plain(self) -> set[int]:
        """Ids of the rules some name stored under the specs' own names could have come
        through: this checkpoint does not use them for such names (computed once, on the first
        refusal that asks)."""
        if self._plain_rules is None:
            found: set[int] = set()
            for new, (stored, _, of, _, member, _) in self._map.items():
                if stored != new or of != 1 or member is not None:
                    continue
                hit = self._rx.split(new)
                if hit is None:
                    found |= {
                        id(r)
                        for head, r in self._model
                        if new.startswith(head) and _backwards(r, new[len(head) :]) is not None
                    }
                    continue
                found |= {id(r) for r in self._rules if _backwards(r, hit[2]) is not None}
            self._plain_rules = found
        return self._plain_rules

    def aliases(self, module: str) -> list[str]:
        """Other names of a module (full name) by the renames, read backwards: a tool's config
        may list transformers' own module names while its tensors carry the hub names."""
        hit = self._rx.split(module)
        if hit is None:
            return []
        head, _, rel = hit
        return [
            head + r.source + rel[len(r.to[0]) :]
            for r in self._rules
            if len(r.to) == 1 and not r.unstack and rel.startswith(r.to[0])
        ]

    def get(self, name: str) -> RawTensor | None:
        hit = self._map.get(name)
        if hit is None:
            return None
        stored, seg, of, sizes, member, axis = hit
        t = self._ckpt.get(stored)
        if t is not None and member is not None:
            t = _member(stored, t, *member)
        if t is None or of == 1:
            return t
        if axis:
            return self._across(stored, t, seg, of, sizes, axis)
        rows = t.shape[0] if t.shape else 0
        if sizes:
            return self._section(stored, t, seg, sizes, rows)
        if rows % of or len(t.data) % of:
            raise CheckpointError(
                f"{stored} has {rows} rows, which do not split into {of} whole segments"
            )
        step = len(t.data) // of  # bytes of one segment: rows/of whole rows
        shape = (rows // of, *t.shape[1:])  # [N*R, ...] -> segment [R, ...]
        span = None if t.span is None else MapSpan(t.span.map, t.span.offset + seg * step)
        return RawTensor(t.dtype, shape, t.data[seg * step : (seg + 1) * step], span)

    def _evaluated(self, stored: str, sizes: tuple[str, ...]) -> tuple[int, ...]:
        """A rule's section sizes at the view's geometry, evaluated once."""
        key = "\0".join(sizes)
        if key not in self._sizes:
            if self._values is None:
                raise CheckpointError(f"{stored}: its sections need the model's geometry")
            env = self._values()
            self._sizes[key] = tuple(int(algebra.evaluate(algebra.parse(z), env)) for z in sizes)
        return self._sizes[key]

    def _across(
        self, stored: str, t: RawTensor, seg: int, of: int, sizes: tuple[str, ...], axis: int
    ) -> RawTensor:
        """Section ``seg`` of ``axis`` (not rows): indices ``[sum(sizes[:seg]), + sizes[seg])``
        of that axis, every outer index's own run (equal ``of`` parts without sizes)."""
        if not -len(t.shape) <= axis < len(t.shape):
            raise CheckpointError(
                f"{stored} has shape {list(t.shape)}, which has no axis {axis} to read sections of"
            )
        k = axis % len(t.shape)
        n = t.shape[k]
        if sizes:
            got = self._evaluated(stored, sizes)
            if sum(got) != n:
                shown = " + ".join(f"{z} ({v})" for z, v in zip(sizes, got, strict=True))
                raise CheckpointError(
                    f"{stored} has {n} on axis {axis}, but its sections are {shown} = {sum(got)}"
                )
        elif n % of:
            raise CheckpointError(
                f"{stored} has {n} on axis {axis}, which does not split into {of} whole segments"
            )
        else:
            got = (n // of,) * of
        return cut(stored, t, k, sum(got[:seg]), got[seg])

    def _section(
        self, stored: str, t: RawTensor, seg: int, sizes: tuple[str, ...], rows: int
    ) -> RawTensor:
        """Rows ``[sum(sizes[:seg]), + sizes[seg])`` of ``t``, zero-copy."""
        got = self._evaluated(stored, sizes)
        if sum(got) != rows or len(t.data) % max(rows, 1):
            shown = " + ".join(f"{z} ({v})" for z, v in zip(sizes, got, strict=True))
            raise CheckpointError(
                f"{stored} has {rows} rows, but its sections are {shown} = {sum(got)} rows"
            )
        row = len(t.data) // rows  # bytes of one row
        lo, n = sum(got[:seg]) * row, got[seg] * row
        shape = (got[seg], *t.shape[1:])  # [sum(sizes), ...] -> section [sizes[seg], ...]
        span = None if t.span is None else MapSpan(t.span.map, t.span.offset + lo)
        return RawTensor(t.dtype, shape, t.data[lo : lo + n], span)


def cut(stored: str, t: RawTensor, axis: int, lo: int, n: int) -> RawTensor:
    """Indices ``[lo, lo + n)`` of ``axis`` (resolved) of ``t``. Zero-copy where they are one
    run of the bytes (every axis before ``axis`` of size 1); otherwise each outer index holds
    its own run, and the runs are copied into one contiguous buffer (a section of a non-row
    axis is strided in the file: Llama 4's ``[E, X, 2I]`` gate is half of every row)."""
    outer = math.prod(t.shape[:axis])
    whole = outer * t.shape[axis]
    if whole == 0 or len(t.data) % whole:
        raise CheckpointError(
            f"{stored} has shape {list(t.shape)} and {len(t.data)} bytes: axis {axis} is not "
            "whole elements"
        )
    step = len(t.data) // whole  # bytes of one index of ``axis`` (every axis after it)
    shape = (*t.shape[:axis], n, *t.shape[axis + 1 :])
    if outer == 1:
        span = None if t.span is None else MapSpan(t.span.map, t.span.offset + lo * step)
        return RawTensor(t.dtype, shape, t.data[lo * step : (lo + n) * step], span)
    rows = np.frombuffer(t.data, np.uint8).reshape(outer, t.shape[axis] * step)
    runs = np.ascontiguousarray(rows[:, lo * step : (lo + n) * step])
    return RawTensor(t.dtype, shape, runs.reshape(-1).data)


Mapped = tuple[str, int, int, tuple[str, ...], tuple[int, int] | None, int]


def _member(stored: str, t: RawTensor, i: int, n: int) -> RawTensor:
    """Member ``i`` of ``n`` of a stacked [n, ...] tensor: its contiguous bytes, zero-copy."""
    if not t.shape or t.shape[0] != n or len(t.data) % n:
        raise CheckpointError(f"{stored} has shape {list(t.shape)}, not {n} members on axis 0")
    step = len(t.data) // n
    span = None if t.span is None else MapSpan(t.span.map, t.span.offset + i * step)
    return RawTensor(
        t.dtype, t.shape[1:], t.data[i * step : (i + 1) * step], span
    )  # [n, ...] -> [...]


def _mapped(
    name: str,
    rx: LayerPattern,
    rules: tuple[NameRule, ...],
    suffixes: Mapping[str, str],
    model: tuple[tuple[str, NameRule], ...] = (),
    members: Callable[[str], int] | None = None,
) -> list[Mapped]:
    for old, new in suffixes.items():
        if name.endswith("." + old):
            name = name[: -len(old)] + new
            break
    layer = rx.split(name)
    if layer is None:
        return [(_model_level(name, model), 0, 1, (), None, 0)]
    head, _, rel = layer
    for r in rules:
        if r.unstack:
            if rel != r.source or members is None:
                continue
            n = members(name)
            return [
                (head + fill(t, i), k, len(r.to), (), (i, n), 0)
                for i in range(n)
                for k, t in enumerate(r.to)
            ]
        if parts(r.source)[1] is not None:  # one whole name with a member index
            i = index_of(r.source, rel)  # ``experts.{e}.w1.weight``: by the digit rule
            if i is not None:
                return [(head + fill(r.to[0], i), 0, 1, (), None, 0)]
            continue
        if len(r.to) > 1 and rel == r.source:
            return [(head + t, i, len(r.to), r.sizes, None, r.axis) for i, t in enumerate(r.to)]
        if len(r.to) == 1 and rel.startswith(r.source):
            return [(head + r.to[0] + rel[len(r.source) :], 0, 1, (), None, 0)]
    return [(name, 0, 1, (), None, 0)]


def _backwards(r: NameRule, rel: str) -> str | None:
    """The name ``rel`` (a name the specs use) is stored under by rule ``r``, or None when the
    rule does not give it: a stacked or sectioned tensor's own name, a member's name, a prefix
    or whole name renamed back."""
    if r.unstack or len(r.to) > 1:
        hit = any(
            (index_of(t, rel) is not None) if parts(t)[1] is not None else t == rel for t in r.to
        )
        return r.source if hit else None
    to = r.to[0]
    if parts(r.source)[1] is not None:
        i = index_of(to, rel) if parts(to)[1] is not None else None
        return None if i is None else fill(r.source, i)
    whole = r.scope == "model" and not r.source.endswith((".", "_"))
    if whole:
        return r.source if rel == to else None
    return r.source + rel[len(to) :] if rel.startswith(to) else None


def _model_level(name: str, model: tuple[tuple[str, NameRule], ...]) -> str:
    """A name outside the layers under the first model-level rule that matches it: a whole
    name (``backbone.norm_f.weight`` -> ``backbone.norm.weight``) or a prefix, under one of
    the text model's prefixes; anything else unchanged."""
    for head, r in model:
        if not name.startswith(head):
            continue
        rel = name[len(head) :]
        whole = not r.source.endswith((".", "_"))
        if rel == r.source if whole else rel.startswith(r.source):
            return head + r.to[0] + rel[len(r.source) :]
    return name


@record
class OpenLayout:
    qconf: QuantConfig | None  # the checkpoint's quantization, as its own config declares it
    view: NamedView  # its tensors under the specs' names (the name map, packed names)
    lay: Layout


def open_layout(
    ckpt: CheckpointDir,
    table: ModelTable[Any],
    values: Mapping[str, int] | None = None,
    mtp: bool = True,
) -> OpenLayout:
    """The checkpoint's quantization, named view and layout; a checkpoint with no layer the
    model names, or a layout problem, is refused. ``values``: the geometry the bind uses
    (sections are sized at it); without it, config.json's. ``mtp=False``: the decoder alone."""
    qconf = detect(ckpt, table.schemes)
    view = NamedView(
        ckpt,
        table.layer_pattern,
        table.names,
        packed_names(qconf),
        geometry_of(ckpt, table, values),
        table.layer_prefixes,
    )
    lay = layout(table, view.names(), ckpt.config, mtp, view.stored_name)
    if not lay.layers:
        raise BindError(
            f"{ckpt.root}: no tensors named like {table.layer_pattern!r} under any of the "
            f"prefixes {list(table.layer_prefixes)}; " + first_components(ckpt.names())
        )
    refuse_problems(lay)
    return OpenLayout(qconf, view, lay)


def geometry_of(
    ckpt: CheckpointDir, table: ModelTable[Any], values: Mapping[str, int] | None = None
) -> Callable[[], Mapping[str, int]]:
    """The geometry a view sizes its sections at: ``values``, else config.json's (asked for
    only when a sectioned name is read, so a model without sections never needs it)."""
    if values is not None:
        given = dict(values)
        return lambda: given
    return lambda: values_from_config(table, ckpt.config)


def slot_quant(
    table: ModelTable[Any],
    opened: OpenLayout,
    geometry: Any,
    outputs: Collection[str] = (),
    allow_unshared: bool = False,
) -> dict[tuple[int, str], LayerQuant | None]:
    """Each (layer index, slot)'s quantization, decided from names and configs alone."""
    lay, view = opened.lay, opened.view
    out: dict[tuple[int, str], LayerQuant | None] = {}
    for index, x in lay.layers.items():
        full = lay.split.full_name(table, index, "")
        for slot, sf in x.slots.items():
            assert sf.block is not None  # refuse_problems ran first
            out[(index, slot)] = layer_quant(
                opened.qconf, sf.block.tensors, sf.names, full, sf.block.counts(geometry),
                index, view.on_disk, frozenset(outputs), allow_unshared, view.aliases,
            )  # fmt: skip
    return out


def refuse_problems(lay: Layout) -> None:
    """Refuse a layout with problems, naming the first and how many more there are."""
    if lay.problems:
        more = len(lay.problems) - 1
        tail = f" (and {more} more problem(s); `specbind audit` lists them all)" if more else ""
        raise BindError(lay.problems[0] + tail)


def first_components(names: list[str], most: int = 5) -> str:
    """The most common leading name components, to show what the checkpoint does hold (a
    hostile long one cut, as ``core.shown`` cuts a value)."""
    from specbind.core.shown import NAME_LIMIT, shown

    counts: dict[str, int] = {}
    for n in names:
        head = ".".join(n.split(".")[:2])
        counts[head] = counts.get(head, 0) + 1
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:most]
    said = ", ".join(f"{k if len(k) <= NAME_LIMIT else shown(k)}.* ({v})" for k, v in top)
    return f"its names start with {said}" if top else "it holds no tensors"
