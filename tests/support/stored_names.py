"""A synthesized checkpoint written under the names another writer stores: every rule of the
model spec's ``names`` read backwards, so a test sees the stored tensors a real checkpoint
holds (Mixtral's ``block_sparse_moe.experts.{e}.w1.weight``, Falcon's fused
``self_attention.query_key_value.weight``, GraniteMoE's stacked ``input_linear``), under the
model's second layer prefix where it has one (``model.layers.N.``, ``transformer.h.N.``).

How each kind of rule is undone (``synth`` writes the specs' own names):
- a prefix or whole-name rename: the name under ``source``;
- a member-indexed rename (``experts.{e}.w1``): member i's name filled into ``source``;
- sections or equal segments: the ``to`` tensors concatenated on the rule's axis (rows
  unless it says another), in order, as one stored tensor;
- an unstacked tensor: member i's ``to`` tensors concatenated on rows, the members stacked;
- a model-level rename: the name under ``source``, under the same prefix.
The first rule (in the spec's order, prefix renames last) that can hold a name is used, and
the result is checked
by reading it forwards through the project's own name map: a test never runs on a checkpoint
whose names do not come back to the ones synth wrote.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from helpers import read_file
from safetensors.numpy import save_file

from specbind.core.ir import NameRule
from specbind.core.patterns import fill, index_of, layer_pattern, parts
from specbind.runtime.bind.preamble import NamedView, geometry_of
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth, tiny_values


def _prefix_form(r: NameRule) -> bool:
    """A rule renaming a prefix (``mlp.dense_4h_to_h.``), not one whole name."""
    return r.source.endswith((".", "_"))


def _one(r: NameRule, rel: str) -> str | None:
    """``rel``'s stored name under a one-``to`` rule (not unstacked), or None."""
    target = r.to[0]
    if parts(r.source)[1] is not None:
        i = index_of(target, rel) if parts(target)[1] is not None else None
        return None if i is None else fill(r.source, i)
    if _prefix_form(r) and rel.startswith(target):
        return r.source + rel[len(target) :]
    return r.source if rel == target else None


def stored_checkpoint(
    table: ModelTable[Any], out: Path, layers: int = 2, seed: int = 1, mtp: bool = True
) -> dict[str, np.ndarray]:
    """Synthesize ``table`` into ``out`` (one ``model.safetensors`` and its config.json) under
    its writers' names; return the tensors by stored name."""
    raw = out.with_name(out.name + ".synth")
    synth(table, raw, tiny_values(table), layers=layers, seed=seed, mtp=mtp)
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(raw.glob("*.safetensors")):
        tensors |= read_file(f)
    config = json.loads((raw / "config.json").read_text())
    shutil.rmtree(raw)
    prefix = table.layer_prefixes[1] if len(table.layer_prefixes) > 1 else ""
    # a rule naming one tensor (or its members, or sections) before a prefix rule, so a
    # prefix rule over a wider prefix (``self_attn.forget_gate.`` -> ``self_attn.``) leaves
    # the fused conv to its own rule
    layer_rules = sorted(
        (r for r in table.names if r.scope == "layer"), key=lambda r: _prefix_form(r)
    )
    model_rules = [r for r in table.names if r.scope == "model"]
    glob = table.block(table.globals) if table.globals else None
    roots = {t.name for t in glob.tensors if t.root} if glob is not None else set()
    lp = layer_pattern(table.layer_pattern, "")
    stored: dict[str, np.ndarray] = {}
    fused: dict[str, dict[int, np.ndarray]] = {}  # stored name -> section -> array
    axes: dict[str, int] = {}  # stored name -> the axis its sections lie on
    stacked: dict[str, dict[int, dict[int, np.ndarray]]] = {}  # name -> member -> k -> array
    for name, a in tensors.items():
        hit = lp.split(name)
        if hit is None:  # a model-level tensor
            under = "" if name in roots else prefix
            rel = name
            for r in model_rules:
                s = _one(r, rel)
                if s is not None:
                    rel = s
                    break
            stored[under + rel] = a
            continue
        head, _, rel = hit
        head = prefix + head
        for r in layer_rules:
            if r.unstack:
                for k, t in enumerate(r.to):
                    i = index_of(t, rel)
                    if i is not None:
                        stacked.setdefault(head + r.source, {}).setdefault(i, {})[k] = a
                        break
                else:
                    continue
                break
            if len(r.to) > 1:
                if rel in r.to:
                    fused.setdefault(head + r.source, {})[r.to.index(rel)] = a
                    axes[head + r.source] = getattr(r, "axis", 0)
                    break
                continue
            s = _one(r, rel)
            if s is not None:
                stored[head + s] = a
                break
        else:
            stored[head + rel] = a
    for name, secs in fused.items():
        stored[name] = np.concatenate([secs[k] for k in sorted(secs)], axis=axes[name])
    for name, members in stacked.items():
        stored[name] = np.stack(
            [np.concatenate([m[k] for k in sorted(m)]) for _, m in sorted(members.items())]
        )
    out.mkdir()
    save_file(stored, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    _check_round_trip(table, out, tensors, prefix)
    return stored


def _check_round_trip(
    table: ModelTable[Any], out: Path, synthesized: dict[str, np.ndarray], prefix: str
) -> None:
    """The stored names read forwards through the name map give back synth's names."""
    ckpt = CheckpointDir(out)
    view = NamedView(
        ckpt, table.layer_pattern, table.names, None, geometry_of(ckpt, table),
        table.layer_prefixes,
    )  # fmt: skip
    glob = table.block(table.globals) if table.globals else None
    roots = {t.name for t in glob.tensors if t.root} if glob is not None else set()
    want = {n if n in roots else prefix + n for n in synthesized}
    got = set(view.names())
    assert got == want, (sorted(got - want)[:5], sorted(want - got)[:5])
    for n in synthesized:
        t = view.get(n if n in roots else prefix + n)
        assert t is not None and tuple(t.shape) == synthesized[n].shape, n
