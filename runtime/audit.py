"""``specbind audit``: a census of a checkpoint's attention blocks, without binding anything.

Per layer: the kind (from names only), a signature of its attention tensors (name, dtype,
shape), what its block would still need, what its block does not know, and quantisation
artefacts (``*_scale``, ``*_scale_2``, ``input_scale``, U8/F8/F4 dtypes). Across layers: the
distinct signatures per kind and attention tensors whose bytes equal another's.

Invariant: the audit reports, it never refuses a layer — a malformed *file* is still an error.
Trap: identical bytes are found by hashing only tensors whose byte count collides with another,
so a checkpoint of unique sizes is never read beyond its headers.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from typing import Any

from tqdm import tqdm

from runtime.bind import UNKNOWN, classify, nearest
from runtime.checkpoint import Checkpoint
from runtime.dtypes import QUANT_DTYPES
from runtime.layers import split_layers
from runtime.model import ModelTable

QUANT_NAME = re.compile(r"(_scale|_scale_2|input_scale|weight_scale|_zero_point|_amax)$")


def _signature(rows: list[tuple[str, str, tuple[int, ...]]]) -> str:
    h = hashlib.sha256()
    for name, dtype, shape in sorted(rows):
        h.update(f"{name}|{dtype}|{list(shape)}\n".encode())
    return h.hexdigest()[:12]


def audit(ckpt: Checkpoint, table: ModelTable[Any], progress: bool | None = None) -> dict[str, Any]:
    split = split_layers(table, ckpt.names())
    prefixes = {b.prefix for b in table.blocks}
    layers: list[dict[str, Any]] = []
    attn_full_names: list[str] = []
    for index, names in split.layers.items():
        attn = [n for n in names if any(n.startswith(p) for p in prefixes)]
        block = classify(table, names)
        ref = block if block is not None else nearest(table, names)[0]
        known = {t.name for t in ref.tensors}
        # An optional group is absent only when none of it is there; a partial group is missing.
        groups = {t.group for t in ref.tensors if t.group is not None}
        present = {g for g in groups if any(t.name in names for t in ref.tensors if t.group == g)}
        missing = sorted(
            t.name
            for t in ref.tensors
            if t.name not in names and (t.group is None or t.group in present)
        )
        absent_groups = sorted(groups - present)
        rows = []
        quant = []
        for n in attn:
            full = split.full_name(table, index, n)
            t = ckpt.get(full)
            assert t is not None
            rows.append((n, t.dtype, t.shape))
            attn_full_names.append(full)
            if QUANT_NAME.search(n) or t.dtype in QUANT_DTYPES:
                quant.append(f"{n} ({t.dtype})")
        layers.append(
            {
                "index": index,
                "kind": block.name if block is not None else UNKNOWN,
                "nearest": ref.name,
                "signature": _signature(rows),
                "self_attn_tensors": len(attn),
                "other_tensors": len(names) - len(attn),
                "missing": missing,
                "absent_optional_groups": absent_groups,
                "unknown": sorted(n for n in attn if n not in known),
                "quantisation_artefacts": sorted(quant),
            }
        )
    sigs: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for row in layers:
        sigs[row["kind"]][row["signature"]].append(row["index"])
    kinds = {
        kind: {
            "layers": sum(len(v) for v in by_sig.values()),
            "distinct_signatures": len(by_sig),
            "signatures": {s: idx for s, idx in sorted(by_sig.items())},
        }
        for kind, by_sig in sorted(sigs.items())
    }
    return {
        "checkpoint": str(ckpt.root),
        "model": table.name,
        "layer_prefix": split.prefix + table.layer_pattern,
        "tensors": len(ckpt.names()),
        "outside_layers": len(split.outside),
        "unindexed_files": ckpt.unindexed_files(),
        "layers": layers,
        "kinds": kinds,
        "identical_bytes": _identical(ckpt, attn_full_names, progress),
        "quantisation_artefacts": sum(len(r["quantisation_artefacts"]) for r in layers),
    }


def _identical(ckpt: Checkpoint, names: list[str], progress: bool | None) -> list[list[str]]:
    by_size: dict[int, list[str]] = defaultdict(list)
    for n in names:
        t = ckpt.get(n)
        assert t is not None
        by_size[len(t.data)].append(n)
    candidates = [n for group in by_size.values() if len(group) > 1 for n in group]
    by_hash: dict[tuple[int, str], list[str]] = defaultdict(list)
    disable = None if progress is None else not progress
    for n in tqdm(candidates, desc="hash", unit="tensor", disable=disable):
        t = ckpt.get(n)
        assert t is not None
        by_hash[(len(t.data), hashlib.blake2b(t.data, digest_size=16).hexdigest())].append(n)
    return sorted(sorted(g) for g in by_hash.values() if len(g) > 1)


def render_text(rep: dict[str, Any]) -> str:
    lines = [
        f"checkpoint {rep['checkpoint']} ({rep['model']}): {rep['tensors']} tensors, "
        f"{len(rep['layers'])} layers under {rep['layer_prefix']!r}, "
        f"{rep['outside_layers']} outside layers",
        f"{'layer':>5}  {'kind':<8} {'signature':<12} {'attn':>4} {'other':>5}  notes",
    ]
    for r in rep["layers"]:
        notes = []
        if r["missing"]:
            notes.append(f"missing {r['missing']}")
        if r["unknown"]:
            notes.append(f"unknown {r['unknown']}")
        if r["absent_optional_groups"]:
            notes.append(f"no {'/'.join(r['absent_optional_groups'])} (optional)")
        if r["quantisation_artefacts"]:
            notes.append(f"quantised {r['quantisation_artefacts']}")
        if r["kind"] == UNKNOWN:
            notes.insert(0, f"nearest {r['nearest']}")
        lines.append(
            f"{r['index']:>5}  {r['kind']:<8} {r['signature']:<12} {r['self_attn_tensors']:>4} "
            f"{r['other_tensors']:>5}  {'; '.join(notes)}"
        )
    for kind, k in rep["kinds"].items():
        lines.append(
            f"{kind}: {k['layers']} layer(s), {k['distinct_signatures']} distinct signature(s)"
        )
    dup = rep["identical_bytes"]
    lines.append(f"attention tensors with identical bytes: {len(dup)} group(s)")
    lines += [f"  {' = '.join(g)}" for g in dup[:20]]
    if len(dup) > 20:
        lines.append(f"  … {len(dup) - 20} more (see --json)")
    lines.append(f"quantisation artefacts in attention blocks: {rep['quantisation_artefacts']}")
    if rep["unindexed_files"]:
        lines.append(f"not read (no index entry names them): {rep['unindexed_files']}")
    return "\n".join(lines)
