"""What every rank must agree on before any of them binds, and the refusal when they do not.

Each rank describes itself as a flat ``{what: value}`` map: the hash of the specs its binders
were generated from, the model, the parallel layout and the ``--set`` overrides, each
checkpoint file's size, a hash of ``config.json``, and a hash of the names, dtypes and shapes
of the tensors under each top-level group of names (``model.layers.7``, ``lm_head``, …). The
maps are all-gathered and compared key by key; any key with two values is refused naming the
key and which ranks hold which value.

Invariants: only metadata travels (a few hundred bytes per layer, never a tensor byte); the
map has the same keys on every rank that read the same kind of checkpoint, and a key one rank
lacks is reported as ``absent`` there.
Trap: the groups are by name, not by file, so a checkpoint re-sharded differently on one node
(same tensors, other files) is refused by its file sizes, not its tensors.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from specbind.core.patterns import is_index
from specbind.runtime.io.checkpoint import CheckpointDir

SHOWN = 3  # disagreements named in the refusal; the rest are counted


def _sha(obj: Any) -> str:
    raw = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def _group(name: str) -> str:
    """``model.layers.7.mlp.…`` -> ``model.layers.7``; ``lm_head.weight`` -> ``lm_head``."""
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if is_index(p):  # the digit rule of core.patterns (``isdigit`` also takes '²')
            return ".".join(parts[: i + 1])
    return parts[0] if len(parts) > 1 else name


def fingerprint(ckpt: CheckpointDir) -> dict[str, str]:
    """The checkpoint as the ranks compare it: file sizes, config.json, tensor groups."""
    out: dict[str, str] = {}
    for p in ckpt.files():
        out[f"size of {p.relative_to(ckpt.root)}"] = f"{os.stat(p).st_size} B"
    out["config.json"] = _sha(ckpt.config)
    groups: dict[str, list[tuple[str, str, list[int]]]] = defaultdict(list)
    for name in sorted(ckpt.names()):
        t = ckpt.get(name)
        assert t is not None
        groups[_group(name)].append((name, t.dtype, list(t.shape)))
    for g, entries in groups.items():
        out[f"names, dtypes and shapes under {g}"] = _sha(entries)
    return out


def describe(
    specs_sha256: str,
    model: str,
    layout: str,
    overrides: Mapping[str, int],
    ckpt: CheckpointDir,
) -> dict[str, str]:
    """This rank's whole description: what it was generated from, how it splits, what it read."""
    return {
        "spec hash": specs_sha256[:16],
        "model": model,
        "parallel layout": layout,
        "--set overrides": json.dumps(dict(overrides), sort_keys=True),
        **fingerprint(ckpt),
    }


def _ranks(rs: Sequence[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(map(str, rs))


def disagreements(by_rank: Sequence[Mapping[str, str]]) -> list[str]:
    """One line per key on which the ranks hold more than one value."""
    keys = sorted({k for d in by_rank for k in d})
    out: list[str] = []
    for k in keys:
        values: dict[str, list[int]] = defaultdict(list)
        for r, d in enumerate(by_rank):
            values[d.get(k, "absent")].append(r)
        if len(values) > 1:
            out.append(f"{k}: " + "; ".join(f"{v} on {_ranks(rs)}" for v, rs in values.items()))
    return out


def refusal(problems: Sequence[str]) -> str:
    """The one-line refusal naming the first few disagreements."""
    more = len(problems) - SHOWN
    tail = f" (and {more} more)" if more > 0 else ""
    return "the ranks disagree, so none binds: " + " | ".join(problems[:SHOWN]) + tail
