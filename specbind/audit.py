"""``specbind audit``: a census of every tensor of a checkpoint, without binding anything.

Per layer and slot: the block (from names only) or the nearest one and what it lacks, a
signature of the slot's tensors (name, dtype, shape), what the block does not know, absent
optional groups and quantization artifacts (``*_scale``, ``*_scale_2``, ``input_scale``, U8/F8/F4
dtypes). Across the checkpoint: distinct signatures per block, the model-level tensors, the
declared-unbound ones with the reason, and whatever nothing accounts for. ``coverage`` sums to
the tensor count: bound + declared unbound + unaccounted.

Invariant: the audit reports, it never refuses a layer — a malformed *file* is still an error.
Invariant: it is a gate. ``ok`` is true exactly when ``problems`` is empty, and ``verdict`` says
so in one line (``OK: 21 of 21 tensors bound …`` / ``REFUSED: 2 problem(s): …``); the CLI exits
1 on a problem. The census reads names, dtypes and config; what only a bind sees (a shape, a
geometry constraint, a value a conversion would change) is found by then binding rank 0 of tp 1
report-only (``verify``): each rank binds a share of that, and every check that a share fails
is decided on the whole tensor or the whole layout, so a checkpoint bind refuses at some legal
rank fails here too. That step reads every tensor once (as ``bind`` does) and runs only when
the census found nothing: bind would refuse on the census's first problem anyway.
Trap: identical bytes are found by hashing only tensors whose byte count collides with
another, and never family members (288 experts a layer would mean reading the whole
checkpoint); with ``verify=False`` (``audit --names-only``) a checkpoint of unique sizes is
never read beyond its headers, and the verdict says that shapes and values went unchecked.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

from specbind.core.dtypes import QUANT_DTYPES
from specbind.core.errors import CheckpointError, SpecbindError, UsageError
from specbind.core.ir import TensorRule
from specbind.core.units import GIB, size
from specbind.runtime.bind.preamble import NamedView, geometry_of
from specbind.runtime.binder.checks import census, family_matcher
from specbind.runtime.binder.quant import quantized_rules
from specbind.runtime.binder.tables import BlockEntry, ModelTable
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.io.progress import bar as progress_bar
from specbind.runtime.io.source import RawTensor, TensorSource
from specbind.runtime.layout.config import values_from_config
from specbind.runtime.layout.slots import SlotFill, global_full, layout
from specbind.runtime.quant.layers import layer_quant
from specbind.runtime.quant.scheme import QuantConfig, detect, packed_names
from specbind.summary import fold, spans
from specbind.version import __version__

# Companions a quantization tool writes beside a linear weight (ModelOpt, compressed-tensors,
# FP8 block scales); flagged only when the block does not declare them.
QUANT_NAME = re.compile(
    r"(weight_scale|weight_scale_2|weight_scale_inv|input_scale|weight_global_scale|"
    r"input_global_scale|weight_packed|weight_zero_point|_amax)$"
)
UNKNOWN = "unknown"


def _signature(rows: list[tuple[str, str, tuple[int, ...]]]) -> str:
    h = hashlib.sha256()
    for name, dtype, shape in sorted(rows):
        h.update(f"{name}|{dtype}|{list(shape)}\n".encode())
    return h.hexdigest()[:12]


def _declared(
    block: BlockEntry[Any], names: set[str], counts: dict[str, int] | None,
    rules: tuple[TensorRule, ...],
) -> tuple[set[str], list[str]]:  # fmt: skip
    """(names the block declares among ``names``, its declared tensors absent from them), by
    the binder's own census. With ``counts`` (each family's size from config.json), a member
    past the end is not declared and every absent member is missing by name, as ``bind``
    would refuse them; without, a family is missing only when none of it is there."""
    sizes = counts or {r.family: 1 << 30 for r in rules if r.family is not None}
    c = census(rules, sorted(names), "", sizes)
    known = names - set(c.unknown) - {n for n, _, _, _ in c.beyond}
    groups = {t.group for t in rules if t.group is not None}
    present = {g for g in groups if any(c.has(t) for t in rules if t.group == g)}
    missing = []
    for t in rules:
        if t.group is not None and t.group not in present:
            continue
        if counts is None and t.family is not None:
            missing += [] if c.has(t) else [t.name]
        else:
            missing += c.absent(t, counts or {})
    return known, sorted(missing)


def _dtype_ok(rules: tuple[TensorRule, ...], name: str, dtype: str) -> bool:
    hit = family_matcher(rules).match(name)
    for r in rules:
        if r.name == name or (hit is not None and hit[0] == r.name):
            return dtype == r.dtype or dtype in r.stored
    return True  # not declared: reported as unknown instead


def _slot_row(
    ckpt: TensorSource, full: str, fill: SlotFill, names: list[str], table: ModelTable[Any],
    geometry: Any, rules: tuple[TensorRule, ...] | None = None,
) -> dict[str, Any]:  # fmt: skip
    block = fill.block or table.block(fill.nearest)
    rules = block.tensors if rules is None else rules  # quantized linears: their companions
    mine = fill.names if fill.block is not None else [n for n in names if n in
            {t.name for t in block.tensors}]  # fmt: skip
    counts = block.counts(geometry) if geometry is not None else None
    known, missing = _declared(block, set(mine), counts, rules)
    rows: list[tuple[str, str, tuple[int, ...]]] = []
    quant: list[str] = []
    wrong: list[str] = []
    nbytes = 0
    for n in mine:
        t = ckpt.get(full + n)
        if t is None:  # unreadable (sections that do not add up): listed among the problems
            continue
        rows.append((n, t.dtype, t.shape))
        nbytes += t.data.nbytes
        if (QUANT_NAME.search(n) and n not in known) or t.dtype in QUANT_DTYPES:
            quant.append(f"{n} ({t.dtype})")
        if n in known and not _dtype_ok(rules, n, t.dtype):
            wrong.append(f"{n} ({t.dtype})")
    groups = {t.group for t in block.tensors if t.group is not None}
    absent = sorted(
        g for g in groups if not any(t.name in mine for t in block.tensors if t.group == g)
    )
    return {
        "block": fill.block.name if fill.block is not None else UNKNOWN,
        "nearest": block.name,
        "signature": _signature(rows),
        "tensors": len(mine),
        "bytes": nbytes,
        "missing": missing if fill.block is not None else fill.missing,
        "absent_optional_groups": absent,
        "unknown": sorted(n for n in mine if n not in known),
        "wrong_dtype": sorted(wrong),
        "quantization_artifacts": sorted(quant),
    }


def _row_problems(
    index: int, slot: str, row: dict[str, Any], stored: Callable[[str], str] = str
) -> list[str]:
    """What ``bind`` would refuse in a slot a block does fill (an unfilled slot is already a
    layout problem); ``stored``: a layer-relative name's full stored name, as problems name
    every tensor (the row itself keeps the specs' names)."""
    if row["block"] == UNKNOWN:
        return []
    out = []
    for key, what in (("missing", "missing"), ("unknown", "undeclared"),
                      ("wrong_dtype", "of a dtype the block refuses")):  # fmt: skip
        if row[key]:
            named = [_stored_entry(n, stored) for n in row[key]]
            shown = named if len(named) <= 8 else [*named[:8], "..."]
            out.append(f"layer {index}: {slot} ({row['block']}): {len(row[key])} {what}: {shown}")
    return out


def _in_layer(view: NamedView, full: str, name: str) -> str:
    """A layer-relative name's full stored name (``full``: the layer's prefix)."""
    return view.stored_name(full + name)


def _stored_entry(entry: str, stored: Callable[[str], str]) -> str:
    """A row entry (``name`` or ``name (DTYPE)``) with its name as stored."""
    name, sep, rest = entry.partition(" (")
    return stored(name) + sep + rest


def _globals_problems(
    ckpt: CheckpointDir, table: ModelTable[Any], present: dict[str, str], view: NamedView,
    prefix: str,
) -> list[str]:  # fmt: skip
    """What ``bind`` would refuse among the model-level tensors: a missing one, a refused
    dtype, a stored copy of a tied tensor, a tie flag that is not a boolean."""
    from specbind.runtime.layout.config import (
        config_flags,  # bind builds on the layout as audit does
    )

    if table.globals is None or not present:
        return []  # none at all is a layout problem already
    block = table.block(table.globals)
    try:
        flags = config_flags(table, ckpt.config)
    except SpecbindError as e:
        return [f"model: {e}"]
    out = []
    groups = {r.group for r in block.tensors if r.group is not None and r.name in present}
    for r in block.tensors:
        tied = r.tie is not None and flags.get(r.tie.config, False)
        if r.name not in present:
            if not tied and (r.group is None or r.group in groups):
                name = view.stored_name(global_full(block, prefix, r.name))
                out.append(f"model: missing {name} (a {block.name} block requires it)")
            continue
        name = view.stored_name(present[r.name])
        if tied and r.tie is not None:
            out.append(f"model: {name} is stored, but config.json {r.tie.config} is true")
        t = view.get(present[r.name])
        if t is not None and t.dtype != r.dtype and t.dtype not in r.stored:
            out.append(f"model: {name} is {t.dtype} but a {block.name} block requires {r.dtype}")
    return out


def audit(
    ckpt: CheckpointDir,
    table: ModelTable[Any],
    progress: bool | None = None,
    overrides: dict[str, int] | None = None,
    mtp: bool = True,
    verify: bool = True,
    allow_unshared_scales: bool = False,
    identical: bool = True,
) -> dict[str, Any]:
    """The census of every tensor bind's layout sees, and every problem bind would refuse with
    the same geometry (``overrides``: ``--set``, as bind takes it; ``mtp=False`` as
    ``bind --no-mtp``: the MTP layers config.json counts are counted as not bound, not
    required); with ``verify``, a census without problems is confirmed by a report-only bind
    of tp rank 0 of 1, and its refusal is the problem (see the module docstring);
    ``allow_unshared_scales`` as bind takes it; ``identical=False``: no tensor is hashed to
    find identical bytes (``identical_bytes`` is empty): with ``verify=False`` then, nothing
    but headers and config is read (an engine loader's check before it builds its model)."""
    problems: list[str] = []
    try:
        qconf = detect(ckpt, table.schemes)
    except SpecbindError as e:  # audited as unquantized, and said so
        qconf = None
        problems.append(f"model: {e}")
    view = NamedView(
        ckpt, table.layer_pattern, table.names, packed_names(qconf), geometry_of(ckpt, table),
        table.layer_prefixes,
    )  # fmt: skip
    probe = _Probe(view)
    scalars = tuple("." + c.suffix for c in (qconf.scheme.companions if qconf else ()) if c.scalar)
    lay = layout(table, view.names(), ckpt.config, mtp, view.stored_name)
    split = lay.split
    problems += lay.problems
    try:
        geometry = table.make_geometry(values_from_config(table, ckpt.config, overrides))
    except UsageError:  # --set naming no symbol is the command line's fault, as bind says
        raise
    except SpecbindError as e:  # the census still runs; family sizes are then unknown
        geometry = None
        problems.append(f"model: {e}")
    problems += _globals_problems(ckpt, table, lay.globals, view, split.prefix)
    layers: list[dict[str, Any]] = []
    hashable: list[str] = []
    for index, lay_layer in lay.layers.items():
        full = split.full_name(table, index, "")
        names = split.layers[index]
        slots = {}
        for slot, fill in lay_layer.slots.items():
            rules = None
            if fill.block is not None and geometry is not None:
                try:
                    lq = layer_quant(
                        qconf, fill.block.tensors, fill.names, full,
                        fill.block.counts(geometry), index, view.on_disk, aliases=view.aliases,
                    )  # fmt: skip
                    rules = quantized_rules(fill.block.tensors, lq)
                except SpecbindError as e:
                    problems.append(str(e))
            slots[slot] = _slot_row(probe, full, fill, names, table, geometry, rules)
        for slot, row in slots.items():
            problems += _row_problems(index, slot, row, partial(_in_layer, view, full))
        for fill in lay_layer.slots.values():
            fam = family_matcher(fill.block.tensors if fill.block is not None else ())
            hashable += [
                full + n
                for n in fill.names
                if fam.match(n) is None
                and not n.endswith(scalars)  # shared scales are equal by design
            ]
        layers.append(
            {
                "index": index,
                "role": lay_layer.role,
                "slots": slots,
                "unclaimed": lay_layer.unclaimed,
            }
        )
    problems += sorted(set(probe.errors.values()))  # each unreadable stored tensor, once
    sigs: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for row in layers:
        for slot in row["slots"].values():
            sigs[slot["block"]][slot["signature"]].append(row["index"])
    kinds = {
        kind: {
            "layers": sum(len(v) for v in by_sig.values()),
            "distinct_signatures": len(by_sig),
            "signatures": {s: idx for s, idx in sorted(by_sig.items())},
        }
        for kind, by_sig in sorted(sigs.items())
    }
    claimed = sum(len(f.names) for x in lay.layers.values() for f in x.slots.values())
    undeclared = sum(len(s["unknown"]) for r in layers for s in r["slots"].values())
    unbound = sum(len(v) for v in lay.unbound.values())
    layer_unclaimed = sum(len(x.unclaimed) for x in lay.layers.values())
    unaccounted = layer_unclaimed + len(lay.unclaimed) + undeclared
    why = {u.prefix: u.why for u in table.unbound}
    if verify and not problems:
        problems += _bind_problems(ckpt, table, overrides, mtp, progress, allow_unshared_scales)
    bound = claimed - undeclared + len(lay.globals)
    rep = {
        "specbind_version": __version__,
        "checkpoint": str(ckpt.root),
        "model": table.name,
        "layer_prefix": split.prefix + table.layer_pattern,
        "tensors": len(view.names()),  # as the specs name them: a fused conv read as three
        "stored_tensors": len(ckpt.names()),
        "bytes": sum(s["bytes"] for r in layers for s in r["slots"].values())
        + sum(t.data.nbytes for n in lay.globals.values() if (t := probe.get(n)) is not None),
        "coverage": {
            "bound": bound,
            "declared_unbound": unbound,
            "unaccounted": unaccounted,
            **(
                {"mtp_not_bound": sum(map(len, lay.mtp_skipped.values()))}
                if lay.mtp_skipped
                else {}
            ),
        },
        **({"mtp_not_bound": sorted(lay.mtp_skipped)} if lay.mtp_skipped else {}),
        "globals": sorted(lay.globals),
        "declared_unbound": {
            p: {"why": why[p], "tensors": len(ns)} for p, ns in lay.unbound.items() if ns
        },
        "unaccounted_outside_layers": lay.unclaimed,
        "unindexed_files": ckpt.unindexed_files(),
        "layers": layers,
        "kinds": kinds,
        "problems": problems,
        "quantization": None if qconf is None else _quantization(qconf),
        "identical_bytes": _identical(probe, hashable + list(lay.globals.values()), progress)
        if identical
        else [],
        "quantization_artifacts": sum(
            len(s["quantization_artifacts"]) for r in layers for s in r["slots"].values()
        ),
        "checked": "bind" if verify else "names",
    }
    rep["ok"] = not problems
    rep["verdict"] = verdict(rep)
    return rep


def _bind_problems(
    ckpt: CheckpointDir, table: ModelTable[Any], overrides: dict[str, int] | None, mtp: bool,
    progress: bool | None, allow_unshared_scales: bool,
) -> list[str]:  # fmt: skip
    """What a report-only bind of tp rank 0 of 1 refuses (nothing kept, each slot dropped once
    bound), as the one problem it stops at; none when it binds."""
    from specbind.runtime.bind.bind import ReportOnly, bind_checkpoint

    try:
        bind_checkpoint(
            ckpt, table, overrides, progress=progress, mtp=mtp, sink=ReportOnly(),
            allow_unshared_scales=allow_unshared_scales,
        )  # fmt: skip
    except SpecbindError as e:
        return [f"bind: {e}"]
    return []


def verdict(rep: dict[str, Any]) -> str:
    """The audit's one-line verdict: ``OK: …`` when nothing would be refused, else
    ``REFUSED: N problem(s): …`` with the first ones (all of them are under ``problems``)."""
    problems: list[str] = rep["problems"]
    if problems:
        shown = "; ".join(problems[:3])
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        return f"REFUSED: {len(problems)} problem(s): {shown}{more}"
    cov = rep["coverage"]
    parts = [f"OK: {cov['bound']} of {rep['tensors']} tensors bound"]
    if cov["declared_unbound"]:
        parts.append(f"{cov['declared_unbound']} declared unbound (not read)")
    if cov.get("mtp_not_bound"):
        parts.append(f"{cov['mtp_not_bound']} of MTP layer(s) not bound (--no-mtp)")
    layers = len(rep["layers"])
    how = (
        "names, dtypes and config checked, shapes and values not (--names-only)"
        if rep["checked"] == "names"
        else "bind accepts it at tp rank 0 of 1"
    )
    return f"{', '.join(parts)} in {layers} layer(s); {how}"


class _Probe:
    """The view, a name it cannot read (a tensor whose sections do not add up to its rows)
    recorded as a problem instead of raised: audit lists what bind would refuse."""

    def __init__(self, view: TensorSource) -> None:
        self._view = view
        self.errors: dict[str, str] = {}

    def names(self) -> list[str]:
        return self._view.names()

    def get(self, name: str) -> RawTensor | None:
        try:
            return self._view.get(name)
        except CheckpointError as e:
            self.errors.setdefault(name, str(e))
            return None


def _identical(ckpt: TensorSource, names: list[str], progress: bool | None) -> list[list[str]]:
    by_size: dict[int, list[str]] = defaultdict(list)
    for n in names:
        t = ckpt.get(n)
        if t is None:  # unreadable: already a problem
            continue
        by_size[len(t.data)].append(n)
    candidates = [n for group in by_size.values() if len(group) > 1 for n in group]
    by_hash: dict[tuple[int, str], list[str]] = defaultdict(list)
    for n in progress_bar(candidates, progress, "hash", "tensor"):
        t = ckpt.get(n)
        assert t is not None
        by_hash[(len(t.data), hashlib.blake2b(t.data, digest_size=16).hexdigest())].append(n)
    return sorted(sorted(g) for g in by_hash.values() if len(g) > 1)


def render_text(rep: dict[str, Any], verbose: bool = False) -> str:
    """The census as text: a row per kind of slot (``verbose``: per layer and slot), folded
    only where every cell but the layer is equal (``summary.fold``), so a slot with a problem
    or another signature is a row of its own; then the kinds, the model-level and unbound
    tensors, the problems and the verdict, last."""
    cov = rep["coverage"]
    lines = [
        f"checkpoint {rep['checkpoint']} ({rep['model']}): {rep['tensors']} tensors, "
        f"{size(rep['bytes'])}, {len(rep['layers'])} layers under {rep['layer_prefix']!r}",
        f"coverage: {cov['bound']} bound, {cov['declared_unbound']} declared unbound, "
        f"{cov['unaccounted']} unaccounted",
        f"{'layer' if verbose else 'layers':>6}  {'role':<7} {'slot':<10} {'block':<12} "
        f"{'signature':<12} {'n':>5} {'GiB':>8}  "
        + ("notes" if verbose else "which; notes (n, GiB: per layer)"),
    ]
    rows: list[tuple[int, tuple[Any, ...], list[int]]] = []
    for r in rep["layers"]:
        for slot, s in r["slots"].items():
            key = (r["role"], slot, s["block"], s["signature"], s["tensors"], s["bytes"], _notes(s))
            rows.append((r["index"], key, []))
        if r["unclaimed"] and verbose:
            rows.append((r["index"], ("unclaimed", tuple(r["unclaimed"])), []))
    for layers, key, _ in [([i], k, c) for i, k, c in rows] if verbose else fold(rows):
        if key[0] == "unclaimed":
            lines.append(f"{spans(layers):>6}  unclaimed by any slot: {list(key[1])}")
            continue
        role, slot, block, sig, n, nbytes, notes = key
        which = notes if verbose else "; ".join(x for x in (spans(layers), notes) if x)
        lines.append(
            f"{spans(layers) if verbose else len(layers):>6}  {role:<7} {slot:<10} {block:<12} "
            f"{sig:<12} {n:>5} {nbytes / GIB:>8.2f}  {which}"
        )
    if not verbose:
        lines += [
            f"{r['index']:>6}  unclaimed by any slot: {r['unclaimed']}"
            for r in rep["layers"]
            if r["unclaimed"]
        ]
    for kind, k in rep["kinds"].items():
        lines.append(
            f"{kind}: {k['layers']} layer(s), {k['distinct_signatures']} distinct signature(s)"
        )
    lines.append(f"model-level tensors: {rep['globals']}")
    for prefix, u in rep["declared_unbound"].items():
        lines.append(f"declared unbound: {prefix}* ({u['tensors']} tensors): {u['why']}")
    if rep.get("mtp_not_bound"):
        lines.append(
            f"MTP layer(s) {rep['mtp_not_bound']} not bound ({rep['coverage']['mtp_not_bound']} "
            "tensors): --no-mtp binds the decoder alone"
        )
    if rep["unaccounted_outside_layers"]:
        lines.append(f"unaccounted outside the layers: {rep['unaccounted_outside_layers']}")
    for p in rep["problems"]:
        lines.append(f"problem: {p}")
    dup = rep["identical_bytes"]
    lines.append(f"tensors with identical bytes: {len(dup)} group(s)")
    lines += [f"  {' = '.join(g)}" for g in dup[:20]]
    if len(dup) > 20:
        lines.append(f"  … {len(dup) - 20} more (see --json)")
    q = rep.get("quantization")
    if q is not None:
        only = " (weights only)" if q["weight_only"] else ""
        said = f" ({q['variant']})" if q.get("variant") else ""
        lines.append(f"quantization: {q['scheme']}{only}{said}, read from {q['source']}")
    lines.append(f"quantization artifacts: {rep['quantization_artifacts']}")
    if rep["unindexed_files"]:
        lines.append(f"not read (no index entry names them): {rep['unindexed_files']}")
    if not verbose:
        lines.append("(-v: every layer and slot)")
    lines.append(rep["verdict"])
    return "\n".join(lines)


def _notes(s: dict[str, Any]) -> str:
    """What a slot's row says beyond its counts: the nearest block of an unknown slot, what it
    misses or has too many of, refused dtypes, absent optional groups, quantization artifacts."""
    notes = []
    if s["block"] == UNKNOWN:
        notes.append(f"nearest {s['nearest']}")
    if s["missing"]:
        notes.append(f"missing {s['missing']}")
    if s["unknown"]:
        notes.append(f"unknown {s['unknown']}")
    if s["wrong_dtype"]:
        notes.append(f"refused dtype {s['wrong_dtype']}")
    if s["absent_optional_groups"]:
        notes.append(f"no {'/'.join(s['absent_optional_groups'])} (optional)")
    if s["quantization_artifacts"]:
        notes.append(f"quantized {s['quantization_artifacts']}")
    return "; ".join(notes)


def _quantization(q: QuantConfig) -> dict[str, Any]:
    """The scheme, the variant in words as the config says it (bits, group size, symmetry,
    act-order, inputs), the file it was read from, and a config-set scheme's params."""
    out: dict[str, Any] = {"scheme": q.scheme.name, "weight_only": q.weight_only}
    out |= {"variant": q.variant, "source": q.declared}
    out |= {"params": dict(q.scheme.values), "symmetric": q.scheme.sym} if q.scheme.values else {}
    return out
