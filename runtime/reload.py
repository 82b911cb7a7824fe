"""Load a rank's ``--out`` file back: ``open_bound(path, ...)`` and ``bind --from PATH``.

The file is checked against these binders before any tensor is handed out, and refused,
naming what differs, when it comes from:
- another spec: its ``specs_sha256`` is not the hash of the specs that generated this code;
- another model, or another layout: ``model``, or a ``tp_size``/``tp_rank``/``ep_size``/
  ``ep_rank`` the caller names that the file was not written for;
- a geometry these binders refuse (``checked_values``), or a layer whose role or slot block
  the model does not have;
- a tensor no announced (layer, slot, block, field) explains, or one whose dtype is not the
  field's; and a field of an announced slot that is missing.
Then it maps the file (``SafetensorsFile``: header validated, entries tiling the data) and
hands out read-only views of the map, or with ``copy=True`` copies: the whole data buffer
read into one fresh buffer with ``readinto`` (one kernel copy out of the page cache, no page
fault per 4 KiB as a copy from the map takes; measured in ``bench --reload``), each tensor a
view of that buffer.
Trap: views keep the map open; copies do not.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specbind.core.dtypes import DTYPES
from specbind.core.errors import CheckpointError, ReloadError, SpecbindError
from specbind.core.planning import Ranks
from specbind.runtime.binding import Array
from specbind.runtime.safetensors_file import SafetensorsFile

NEEDED = ("model", "specs_sha256", "tp_size", "tp_rank", "ep_size", "ep_rank", "geometry",
          "layers")  # fmt: skip


@dataclass
class BoundFile:
    path: Path
    model: str
    ranks: Ranks
    geometry: dict[str, int]
    layers: dict[int, tuple[str, dict[str, str]]]  # index -> (role, slot -> block)
    tensors: dict[str, Array]  # by their --out names: layers.{i}.{slot}.{field}, globals.{field}
    copied: bool

    @property
    def bytes(self) -> int:
        return sum(a.nbytes for a in self.tensors.values())

    def slot(self, index: int, slot: str) -> dict[str, Array]:
        """One bound slot's fields by field name."""
        pre = f"layers.{index}.{slot}."
        return {k[len(pre) :]: v for k, v in self.tensors.items() if k.startswith(pre)}


def open_bound(
    path: str | os.PathLike[str],
    *,
    model: str | None = None,
    tp_size: int | None = None,
    tp_rank: int | None = None,
    ep_size: int | None = None,
    ep_rank: int | None = None,
    copy: bool = False,
) -> BoundFile:
    """The bound weights in ``path``, checked as the module docstring says."""
    from specbind.generated import MODELS, SPECS_SHA256

    p = Path(path)
    f = SafetensorsFile(p, str(p))  # refuses a file that is not safetensors, naming it
    meta = f.metadata
    missing = [k for k in NEEDED if k not in meta]
    if missing:
        raise ReloadError(
            f"{p}: not a specbind --out file (its metadata lacks {', '.join(missing)})"
        )
    name = meta["model"]
    if model is not None and name != model:
        raise ReloadError(f"{p}: written for model {name}, asked for {model}")
    if name not in MODELS:
        raise ReloadError(f"{p}: written for model {name}, which these binders do not know")
    table = MODELS[name]
    if meta["specs_sha256"] != SPECS_SHA256:
        raise ReloadError(
            f"{p}: written by binders generated from other specs (sha256 "
            f"{meta['specs_sha256'][:12]}, these are {SPECS_SHA256[:12]}); bind it again"
        )
    ranks = _ranks(p, meta)
    asked = {"tp_size": tp_size, "tp_rank": tp_rank, "ep_size": ep_size, "ep_rank": ep_rank}
    for key, want in asked.items():
        have = getattr(ranks, key)
        if want is not None and want != have:
            raise ReloadError(
                f"{p}: written for {key.replace('_', ' ')} {have}, asked for {want} (the file "
                f"holds tp rank {ranks.tp_rank} of {ranks.tp_size}, ep rank {ranks.ep_rank} of "
                f"{ranks.ep_size})"
            )
    geometry = _geometry(p, table, meta["geometry"])
    layers = _layers(p, table, meta["layers"])
    _check_names(p, table, f, layers, _quant(p, table, meta))
    if "tensors" in meta:  # written since the count was recorded: a removed field shows
        if not _count(meta["tensors"]):
            raise ReloadError(f"{p}: metadata tensors={meta['tensors']!r} is not a count")
        if int(meta["tensors"]) != len(f.entries):
            raise ReloadError(
                f"{p}: holds {len(f.entries)} tensor(s), its bind wrote {meta['tensors']}: "
                "a field is missing or was added"
            )
    tensors = _copies(f) if copy else _views(f)
    return BoundFile(p, name, ranks, geometry, layers, tensors, copy)


ROLES = ("decoder", "mtp")


def _count(text: str) -> bool:
    """A non-negative integer in ASCII digits (``str.isdigit`` also takes '²')."""
    return text.isascii() and text.isdecimal()


def _loads(raw: str) -> Any:
    """A JSON object, or None for anything else (a bad document included)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _json(p: Path, meta: dict[str, str], key: str) -> Any:
    try:
        return json.loads(meta[key])
    except ValueError:
        raise ReloadError(f"{p}: metadata {key} is not JSON") from None


def _ranks(p: Path, meta: dict[str, str]) -> Ranks:
    vals = {}
    for k in ("tp_size", "tp_rank", "ep_size", "ep_rank"):
        if not _count(meta[k]):
            raise ReloadError(f"{p}: metadata {k}={meta[k]!r} is not a count")
        vals[k] = int(meta[k])
    r = Ranks(**vals)
    if r.tp_rank >= r.tp_size or r.ep_rank >= r.ep_size:
        raise ReloadError(f"{p}: metadata names tp rank {r.tp_rank} of {r.tp_size}, ep rank "
                          f"{r.ep_rank} of {r.ep_size}")  # fmt: skip
    return r


def _geometry(p: Path, table: Any, raw: str) -> dict[str, int]:
    from specbind.runtime.model import checked_values

    g = _loads(raw)
    if not isinstance(g, dict) or not all(type(v) is int for v in g.values()):
        raise ReloadError(f"{p}: metadata geometry is not an object of integers")
    unknown = sorted(set(g) - set(table.default_values()))
    if unknown:
        raise ReloadError(f"{p}: geometry names {', '.join(unknown)}, unknown to {table.name}")
    try:
        return dict(checked_values(table, table.default_values(), g))
    except SpecbindError as e:
        raise ReloadError(f"{p}: its geometry is refused: {e}") from None


def _layers(p: Path, table: Any, raw: str) -> dict[int, tuple[str, dict[str, str]]]:
    doc = _loads(raw)
    if not isinstance(doc, dict):
        raise ReloadError(f"{p}: metadata layers is not an object")
    slots = {s.name: set(s.blocks) for s in table.slots}
    out: dict[int, tuple[str, dict[str, str]]] = {}
    for key, x in doc.items():
        if not _count(key) or not isinstance(x, dict) or not isinstance(x.get("slots"), dict):
            raise ReloadError(f"{p}: metadata layers[{key!r}] is not a layer")
        for slot, block in x["slots"].items():
            if block not in slots.get(slot, ()):
                raise ReloadError(
                    f"{p}: layer {key} holds block {block!r} in slot {slot!r}, which model "
                    f"{table.name} does not have there"
                )
        if x.get("role") not in ROLES:
            raise ReloadError(f"{p}: metadata layers[{key!r}] has role {x.get('role')!r}, not one "
                              f"of {list(ROLES)}")  # fmt: skip
        out[int(key)] = (str(x.get("role")), dict(x["slots"]))
    return out


def _quant(p: Path, table: Any, meta: dict[str, str]) -> Any:
    """The quantization a file's metadata records (``quant``), as a LayerQuant, or None."""
    from specbind.runtime.quant import LayerQuant

    if "quant" not in meta:
        return None
    from specbind.runtime.quant import OUTPUTS

    doc = _json(p, meta, "quant")
    schemes = {s.name: s for s in table.schemes}
    scheme = doc.get("scheme") if isinstance(doc, dict) else None
    if not isinstance(scheme, str) or scheme not in schemes:
        raise ReloadError(f"{p}: metadata quant names no scheme of {table.name}")
    outputs = doc.get("outputs", [])
    if not isinstance(outputs, list) or not all(o in OUTPUTS for o in outputs):
        raise ReloadError(f"{p}: metadata quant outputs {outputs!r}: not a list of {list(OUTPUTS)}")
    return LayerQuant(schemes[doc["scheme"]], bool(doc.get("weight_only")), frozenset(),
                      frozenset(outputs))  # fmt: skip


def _check_names(p: Path, table: Any, f: SafetensorsFile, layers: dict[int, Any], lq: Any) -> None:
    from specbind.runtime.quant import quantized_fields

    want: dict[str, set[str]] = {}  # name -> the dtypes the field may have
    packed: str | None = lq.scheme.weight.dtype if lq is not None else None

    def add(pre: str, block: str) -> None:
        for field, rule in table.block(block).fields.items():
            want[pre + field] = {rule.dtype}
            if packed is not None and rule.kind not in ("transform", "tie"):
                want[pre + field].add(packed)
                for name, dtype in quantized_fields(field, lq).items():
                    want[pre + name] = {dtype}

    for index, (_, slots) in layers.items():
        for slot, block in slots.items():
            add(f"layers.{index}.{slot}.", block)
    if table.globals:
        add("globals.", table.globals)
    for name, e in f.entries.items():
        if name not in want:
            raise ReloadError(f"{p}: tensor {name} is no field of the layers its metadata names")
        if e.dtype not in want[name]:
            shown = " or ".join(sorted(str(d) for d in want[name]))
            raise ReloadError(f"{p}: {name} is {e.dtype}; the field is {shown}")
    have = set(f.entries)
    for index, (_, slots) in layers.items():
        for slot in slots:
            pre = f"layers.{index}.{slot}."
            if not any(n.startswith(pre) for n in have):
                raise ReloadError(f"{p}: layer {index} slot {slot} is announced but holds nothing")


def _np_dtype(dtype: str) -> np.dtype[Any]:
    d = DTYPES[dtype].numpy
    return np.dtype(np.uint8) if d is None else d  # packed sub-byte types stay raw bytes


def _arrays(f: SafetensorsFile, buf: memoryview, base: int) -> dict[str, Array]:
    out: dict[str, Array] = {}
    for name, e in f.entries.items():
        dt = _np_dtype(e.dtype)
        raw = np.frombuffer(buf, dtype=np.uint8, count=e.end - e.begin, offset=base + e.begin)
        shape = e.shape if DTYPES[e.dtype].numpy is not None else (e.end - e.begin,)
        out[name] = raw.view(dt).reshape(shape)  # [bytes] -> the field's shape, row-major
    return out


def _views(f: SafetensorsFile) -> dict[str, Array]:
    return _arrays(f, f.view, f.data_start)


def _copies(f: SafetensorsFile) -> dict[str, Array]:
    size = f.size - f.data_start
    buf = np.empty(size, dtype=np.uint8)
    try:
        with open(f.path, "rb", buffering=0) as h:
            h.seek(f.data_start)
            mv = buf.data
            done = 0
            while done < size:
                n = h.readinto(mv[done : done + (256 << 20)])
                if not n:
                    raise CheckpointError(f"{f.where}: ends {size - done} B early")
                done += n
    except OSError as e:
        raise CheckpointError(f"{f.where}: cannot read: {e.strerror}") from None
    return _arrays(f, buf.data, 0)
