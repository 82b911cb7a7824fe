"""The checkpoint under the specs' names, its layout, and each slot's quantization: the
names-only preamble that ``bind``, ``plan`` and the ranks under torchrun share.

Names (``NamedView``): the model spec's ``names`` rules (like transformers' conversion
mapping) say how other writers name the same tensors: a layer-relative prefix renamed
(``self_attn.forget_gate.`` -> ``self_attn.``, ``attn_hc.`` -> ``hc_attn_``), one whole
name with a member index renamed member by member (``block_sparse_moe.experts.{e}.w1.weight`` ->
``mlp.experts.{e}.gate_proj.weight``), or one stored tensor read as N equal row
segments (``self_attn.conv1d.weight`` [3Q, 1, K] -> q, k, v ``_conv1d.weight`` [Q, 1, K]).
A quantization scheme whose packed weight is not stored as ``weight`` (compressed-tensors'
``weight_packed``) is seen under the linear's own name.

Invariants:
- a segment is a contiguous row range of the stored bytes (zero-copy); a tp row shard of a
  segment is then a slice of that segment, so rank r of a fused ``[q; k; v]`` gets
  ``[q_r; k_r; v_r]`` and never a contiguous third of the fused tensor — by construction;
- a rename that would give two tensors one name is refused, naming both;
- the first rule that matches a name wins, so a placeholder rule listed before a prefix rule
  over the same prefix takes its members first;
- a layer or member index follows the digit rule of ``core.patterns`` (``experts.07.w1`` is
  not renamed: it passes through, and the block refuses it as unknown);
- everything not renamed passes through untouched; ``on_disk`` gives a name's stored name
  (what a tool's config lists, e.g. ModelOpt's ``exclude_modules``).
Trap: a stored row count that does not split into whole segments is refused, never rounded.

Opening (``open_layout``, ``slot_quant``): everything here reads names, headers and configs,
never tensor bytes; a layout problem is refused (``refuse_problems``) before any slot's
quantization is decided, and a quantization the config and the tensors disagree on is
refused here, before any byte is read.
Trap: ``audit`` does not use ``open_layout``: it reports these problems instead of refusing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbind.core.errors import BindError, CheckpointError
from specbind.core.ir import NameRule
from specbind.core.patterns import LayerPattern, fill, index_of, layer_pattern, parts
from specbind.runtime.checkpoint import CheckpointDir
from specbind.runtime.layout import Layout, layout
from specbind.runtime.model import ModelTable
from specbind.runtime.quant import LayerQuant, layer_quant
from specbind.runtime.quant_config import QuantConfig, detect, packed_names
from specbind.runtime.source import MapSpan, RawTensor


class NamedView:
    """The checkpoint's tensors under the names the specs use."""

    def __init__(
        self,
        ckpt: CheckpointDir,
        pattern: str,
        rules: tuple[NameRule, ...],
        suffixes: Mapping[str, str] | None = None,
    ) -> None:
        self._ckpt = ckpt
        self.root: Path = ckpt.root
        rx = layer_pattern(pattern)  # under any prefix: the view is made before the split
        self._rx, self._rules = rx, rules
        self._map: dict[str, tuple[str, int, int]] = {}  # name -> (stored, segment, of n)
        stored = ckpt.names()
        for n in stored:
            for new, seg, of in _mapped(n, rx, rules, suffixes or {}):
                if new in self._map:
                    raise CheckpointError(
                        f"{n} and {self._map[new][0]} would both be read as {new}; refusing "
                        "to guess"
                    )
                self._map[new] = (n, seg, of)

    @property
    def config(self) -> dict[str, Any]:
        return self._ckpt.config

    def side_file(self, fn: str) -> Any | None:
        return self._ckpt.side_file(fn)

    def unindexed_files(self) -> list[str]:
        return self._ckpt.unindexed_files()

    def names(self) -> list[str]:
        return list(self._map)

    def on_disk(self, name: str) -> str:
        return self._map[name][0] if name in self._map else name

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
            if len(r.to) == 1 and rel.startswith(r.to[0])
        ]

    def get(self, name: str) -> RawTensor | None:
        hit = self._map.get(name)
        if hit is None:
            return None
        stored, seg, of = hit
        t = self._ckpt.get(stored)
        if t is None or of == 1:
            return t
        rows = t.shape[0] if t.shape else 0
        if rows % of or len(t.data) % of:
            raise CheckpointError(
                f"{stored} has {rows} rows, which do not split into {of} whole segments"
            )
        step = len(t.data) // of  # bytes of one segment: rows/of whole rows
        shape = (rows // of, *t.shape[1:])  # [N*R, ...] -> segment [R, ...]
        span = None if t.span is None else MapSpan(t.span.map, t.span.offset + seg * step)
        return RawTensor(t.dtype, shape, t.data[seg * step : (seg + 1) * step], span)


def _mapped(
    name: str, rx: LayerPattern, rules: tuple[NameRule, ...], suffixes: Mapping[str, str]
) -> list[tuple[str, int, int]]:
    for old, new in suffixes.items():
        if name.endswith("." + old):
            name = name[: -len(old)] + new
            break
    layer = rx.split(name)
    if layer is None:
        return [(name, 0, 1)]
    head, _, rel = layer
    for r in rules:
        if parts(r.source)[1] is not None:  # one whole name with a member index
            i = index_of(r.source, rel)  # ``experts.{e}.w1.weight``: by the digit rule
            if i is not None:
                return [(head + fill(r.to[0], i), 0, 1)]
            continue
        if len(r.to) > 1 and rel == r.source:
            return [(head + t, i, len(r.to)) for i, t in enumerate(r.to)]
        if len(r.to) == 1 and rel.startswith(r.source):
            return [(head + r.to[0] + rel[len(r.source) :], 0, 1)]
    return [(name, 0, 1)]


@dataclass(frozen=True)
class OpenLayout:
    qconf: QuantConfig | None  # the checkpoint's quantization, as its own config declares it
    view: NamedView  # its tensors under the specs' names (the name map, packed names)
    lay: Layout


def open_layout(ckpt: CheckpointDir, table: ModelTable[Any], mtp: bool = True) -> OpenLayout:
    """The checkpoint's quantization, named view and layout (``mtp=False``: the decoder alone);
    a checkpoint with no layer the model names, or a layout problem, is refused."""
    qconf = detect(ckpt, table.schemes)
    view = NamedView(ckpt, table.layer_pattern, table.names, packed_names(qconf))
    lay = layout(table, view.names(), ckpt.config, mtp)
    if not lay.layers:
        raise BindError(
            f"{ckpt.root}: no tensors named like {table.layer_pattern!r} under any of the "
            f"prefixes {list(table.layer_prefixes)}; " + first_components(ckpt.names())
        )
    refuse_problems(lay)
    return OpenLayout(qconf, view, lay)


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
    """The most common leading name components, to show what the checkpoint does hold."""
    counts: dict[str, int] = {}
    for n in names:
        head = ".".join(n.split(".")[:2])
        counts[head] = counts.get(head, 0) + 1
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:most]
    shown = ", ".join(f"{k}.* ({v})" for k, v in top)
    return f"its names start with {shown}" if top else "it holds no tensors"
