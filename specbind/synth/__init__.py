"""Write a synthetic checkpoint of any generated model in the Hugging Face layout.

What is written: ``config.json``, shards ``model-0000i-of-0000n.safetensors`` and
``model.safetensors.index.json``, through the safetensors library. Everything comes from the
model table: tensor names, dtypes and shapes from the generated block tables, the layer
schedule from the per-layer config lists of the model spec's ``synth`` section (each slot's
block is the one its list value names) or the slot's schedule read over the synthetic
config.json (``first_k_dense_replace`` ...; the generator proves the two agree), the MTP
layers' blocks from ``synth.mtp``, and the extra config.json fields from ``synth.config``.
Nothing here names a model or a tensor.

Invariants: values are seeded and deterministic; every optional group a layer-group rule
marks present is written whole; the output directory appears whole or not at all (written
beside it, then renamed); ``shards`` is honoured exactly or refused; ``sparse`` writes the same
names, dtypes, shapes and index with every data buffer a hole (zeros).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import save_file

from specbind.core.dtypes import DTYPES
from specbind.core.errors import SpecbindError, UsageError
from specbind.core.geometry import computed
from specbind.core.patterns import fill
from specbind.core.planning import Ranks, expand
from specbind.core.quant import SchemeRule
from specbind.core.schedule import ConfigSchedule
from specbind.runtime.binder.checks import Array
from specbind.runtime.binder.tables import BlockEntry, ModelTable
from specbind.runtime.io.atomic import write_failed
from specbind.runtime.io.progress import bar
from specbind.runtime.layout.config import config_lookup, flag_group
from specbind.synth.quant import (
    Companion,
    as_written,
    companion_values,
    quant_config_files,
    quantized_entries,
)


@dataclass(frozen=True)
class LayerPlan:
    index: int
    role: str  # "decoder" | "mtp"
    blocks: dict[str, str]  # slot -> block
    groups: frozenset[str]  # the optional groups this layer carries


def tiny_values(table: ModelTable[Any]) -> dict[str, int]:
    """The model spec's tiny geometry (``synth.tiny``) over its real one."""
    if table.synth is None:
        raise SpecbindError(f"model {table.name} has no synth section in its spec")
    return computed(table.geometry_fields, table.default_values() | dict(table.synth.tiny))


def schedule(table: ModelTable[Any], layers: int, mtp: bool = True) -> list[LayerPlan]:
    """Each layer's blocks and optional groups, from the spec's synthetic config lists."""
    if table.synth is None:
        raise SpecbindError(f"model {table.name} has no synth section in its spec")
    lists = {sl.config: sl for sl in table.synth.lists}
    cfg: dict[str, Any] = json.loads(table.synth.config_json)
    for sl in table.synth.lists:
        cfg[sl.config] = [sl.value(i) for i in range(layers)]
    planned = ConfigSchedule(table.slots, lambda name: config_lookup(cfg, name))
    optional = {g.group for g in table.layer_groups}
    out: list[LayerPlan] = []
    for i in range(layers):
        blocks: dict[str, str] = {}
        for slot in table.slot_blocks("decoder"):
            block = slot.blocks[0]
            by_schedule = planned.scheduled(slot.schedule, i) if slot.schedule else None
            if by_schedule is not None:
                block = by_schedule[0]  # the generator proved the lists agree with it
            if slot.config is not None and slot.config in lists:
                named = slot.block_for(lists[slot.config].value(i))
                if named is None:
                    raise SpecbindError(
                        f"synth: {slot.config}[{i}] = {lists[slot.config].value(i)!r} names "
                        f"no block of slot {slot.name}"
                    )
                block = named
            blocks[slot.name] = block
        groups = set(optional)
        for rule in table.layer_groups:
            if rule.flag:
                verdict = flag_group(rule, cfg)
                if verdict is None or not verdict[0]:
                    groups.discard(rule.group)  # a flag the config does not set: not written
                continue
            if rule.config in lists and lists[rule.config].value(i) not in rule.present:
                groups.discard(rule.group)
        out.append(LayerPlan(i, "decoder", blocks, frozenset(groups)))
    n_mtp = 1 if mtp and table.mtp_count is not None else 0
    chosen = dict(table.synth.mtp)
    for j in range(n_mtp):
        blocks = {s.name: chosen.get(s.name, s.blocks[0]) for s in table.slot_blocks("mtp")}
        out.append(LayerPlan(layers + j, "mtp", blocks, frozenset(optional)))
    return out


def config_for(
    table: ModelTable[Any], values: dict[str, int], plans: list[LayerPlan]
) -> dict[str, Any]:
    assert table.synth is not None
    decoder = [p for p in plans if p.role == "decoder"]
    cfg: dict[str, Any] = json.loads(table.synth.config_json)
    if table.layer_count is not None:
        cfg[table.layer_count] = len(decoder)
    if table.mtp_count is not None:
        cfg[table.mtp_count] = len(plans) - len(decoder)
    for sl in table.synth.lists:
        cfg[sl.config] = [sl.value(p.index) for p in decoder]
    for field, symbol in table.synth.config_from:
        cfg[field] = values[symbol]
    for f in table.geometry_fields:
        if f.config is not None:
            cfg[f.config] = values[f.name]
    return dict(sorted(cfg.items()))


def _values(rng: np.random.Generator, dtype: str, shape: tuple[int, ...], name: str = "") -> Array:
    if dtype == "U8":  # packed codes: any byte is two valid E2M1 codes
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    if dtype == "I32":  # int32 words of packed codes: any word is valid codes
        return rng.integers(-(2**31), 2**31, size=shape, dtype=np.int32)
    if dtype == "I8":  # int8 codes: the symmetric range, as int8 quantizers write it
        return rng.integers(-127, 128, size=shape, dtype=np.int8)
    if name and (shape == () or shape == (1,)) and dtype in ("F32", "BF16"):
        # a global or input scale: one value per checkpoint (2^-10, exact in BF16), so
        # declared shared scales agree
        return np.full(shape, 0.0009765625, dtype=DTYPES[dtype].numpy)
    scale = name and dtype in ("F32", "BF16") and "scale" in name.rsplit(".", 1)[-1]
    if dtype.startswith("F8") or scale:
        arr = np.abs(rng.standard_normal(size=shape, dtype=np.float32)) + 0.25  # scales > 0
        np_dtype = DTYPES[dtype].numpy
        assert np_dtype is not None
        return arr.astype(np_dtype)
    arr = (rng.standard_normal(size=shape, dtype=np.float32) * 0.02).astype(np.float32)
    np_dtype = DTYPES[dtype].numpy
    assert np_dtype is not None
    return arr.astype(np_dtype)


def _written(
    rng: np.random.Generator, dtype: str, shape: tuple[int, ...], scheme: SchemeRule | None,
    c: Companion | None, name: str,
) -> Array:  # fmt: skip
    """A tensor's values: a companion's as its scheme's format asks, else ``_values``."""
    if scheme is not None and c is not None:
        got = companion_values(rng, c, scheme, shape)
        if got is not None:
            return got
    return _values(rng, dtype, shape, name if scheme is not None else "")


def block_tensors(
    block: BlockEntry[Any], geometry: Any, groups: frozenset[str], cast_bf16: bool
) -> Iterator[tuple[str, str, tuple[int, ...]]]:
    """(concrete name, dtype, shape) of every tensor one block writes."""
    shapes = block.shapes(geometry)
    whole = {f: range(n) for f, n in block.counts(geometry).items()}
    rules = [r for r in block.tensors if r.group is None or r.group in groups]
    concrete, pattern = expand(rules, whole)
    for r in concrete:
        dtype = "BF16" if cast_bf16 and r.dtype == "F32" else r.dtype
        yield r.name, dtype, shapes[pattern[r.name]]


def synth(
    table: ModelTable[Any],
    out: Path,
    values: dict[str, int],
    layers: int = 8,
    seed: int = 0,
    mtp: bool = True,
    shards: int | None = None,
    gates_bf16: bool = False,
    nested_config: bool = False,
    quant: SchemeRule | None = None,
    sparse: bool = False,
    progress: bool | None = False,
) -> dict[str, Any]:
    """Write the checkpoint; return a summary (files, tensors, bytes). With ``quant``, every
    linear weight the scheme can store is written as its companions (``synth_quant``).
    ``sparse``: headers only, the data left as holes (``synth.sparse``), in shards of
    about 5 GB unless ``shards`` is given. ``progress``: a bar per shard
    (``runtime.io.progress``)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out}: exists and is not an empty directory; refusing to overwrite")
    if layers < 0 or layers > 4096:
        raise UsageError(f"--layers {layers} is out of range (0..4096)")
    full = table.default_values() | values
    geometry = table.make_geometry(full)
    plans = schedule(table, layers, mtp)
    if quant is not None:
        quant = as_written(quant)
    entries: list[tuple[str, str, tuple[int, ...]]] = []
    excluded: list[str] = []  # full module names the scheme cannot store (I % 16 != 0)
    roles: dict[str, Companion] = {}  # full companion name -> its rule and its linear's O, I
    for p in plans:
        pre = fill(table.layer_pattern, p.index)
        for bname in p.blocks.values():
            block = table.block(bname)
            block.check(geometry, Ranks())
            written = list(block_tensors(block, geometry, p.groups, gates_bf16))
            if quant is not None:
                written = quantized_entries(block, written, quant, pre, excluded, roles)
            entries += [(pre + n, d, s) for n, d, s in written]
    if table.globals is not None:
        block = table.block(table.globals)
        groups = frozenset(t.group for t in block.tensors if t.group is not None)
        # a head tied by the synth config is the embedding: bind refuses a stored copy of it
        flags = json.loads(table.synth.config_json) if table.synth is not None else {}
        tied = {t.name for t in block.tensors if t.tie is not None and flags.get(t.tie.config)}
        entries += [
            e for e in block_tensors(block, geometry, groups, gates_bf16) if e[0] not in tied
        ]
    total = sum(DTYPES[d].nbytes(s) for _, d, s in entries)
    if shards is not None and shards > len(entries):
        raise UsageError(
            f"--shards {shards}: there are only {len(entries)} tensors to spread over them"
        )
    if sparse:
        from specbind.synth import sparse as synth_sparse

        chunks = (
            [entries[slice(*_span(i, shards, len(entries)))] for i in range(shards)]
            if shards
            else synth_sparse.split(entries, synth_sparse.SHARD_BYTES)
        )
        n_shards = len(chunks)
    else:
        n_shards = shards or max(2, math.ceil(total / (2 << 30)))
        n_shards = max(1, min(n_shards, len(entries)))
    rng = np.random.default_rng(seed)

    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        weight_map: dict[str, str] = {}
        for i in range(n_shards):
            fn = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
            if sparse:
                synth_sparse.write_shard(tmp / fn, chunks[i])
                weight_map.update(dict.fromkeys((n for n, _, _ in chunks[i]), fn))
                continue
            lo, hi = _span(i, n_shards, len(entries))
            chunk = entries[lo:hi]
            shown = bar(chunk, progress, f"synth shard {i + 1}/{n_shards}", "tensor")
            tensors = {n: _written(rng, d, s, quant, roles.get(n), n) for n, d, s in shown}
            try:
                save_file(tensors, str(tmp / fn), metadata={"format": "pt"})
            except SafetensorError as e:  # a full disk or a size limit, as safetensors words it
                raise write_failed(out / fn, e) from None
            weight_map.update(dict.fromkeys(tensors, fn))
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        cfg = config_for(table, full, plans)
        if nested_config:
            assert table.synth is not None
            # as multimodal wrappers nest the text model's fields
            cfg = json.loads(table.synth.nested_json) | {"text_config": cfg}
        if quant is not None:
            side = quant_config_files(quant, excluded)
            cfg |= side.pop("config.json", {})
            for fn, doc in side.items():
                (tmp / fn).write_text(json.dumps(doc, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; a checkpoint is an ordinary directory
        for f in tmp.iterdir():
            os.chmod(f, 0o666 & ~umask)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except OSError as e:  # a full disk, a size limit, an I/O error: named by the file
        shutil.rmtree(tmp, ignore_errors=True)
        where = Path(e.filename) if isinstance(e.filename, str) else None
        failed = out / where.name if where is not None and where.parent == tmp else out
        raise write_failed(failed, e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "path": str(out),
        "files": n_shards,
        "tensors": len(entries),
        "bytes": total,
        "layers": [
            {"index": p.index, "role": p.role, "blocks": p.blocks, "groups": sorted(p.groups)}
            for p in plans
        ],
    }


def _span(i: int, n: int, count: int) -> tuple[int, int]:
    """Shard i's tensors when ``count`` tensors are spread over ``n`` shards as evenly as can
    be (every shard gets at least one)."""
    base, rem = divmod(count, n)
    lo = i * base + min(i, rem)
    return lo, lo + base + (1 if i < rem else 0)
