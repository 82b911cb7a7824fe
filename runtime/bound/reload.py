"""Load a rank's ``--out`` file back: ``read_bound(path, ...)``, behind the API's
``specbind.open_bound`` and ``bind --from PATH`` (both pass the generated tables).

The caller passes the binders to check against: the model tables by name and the hash of the
specs they were generated from (the API and CLI pass ``specbind.generated``'s ``MODELS`` and
``SPECS_SHA256``; runtime never imports generated code). The metadata is decoded by
``bound_format.decode`` (each field there and well-formed), then the file is refused, naming
what differs, when it comes from:
- another spec: its ``specs_sha256`` is not the hash the caller names;
- another model, or another layout: ``model``, or a ``tp_size``/``tp_rank``/``ep_size``/
  ``ep_rank`` the caller names that the file was not written for;
- a geometry these binders refuse (``checked_values``), or a layer whose slot block the model
  does not have there, or a quantization scheme it does not know;
- a tensor count other than recorded;
- a ``padding`` record (a vocabulary tp does not divide, padded as vLLM pads it) other than
  what these binders pad at its geometry and ranks (``ModelTable.padding``): the padded
  shapes are then the binder's, and the record names the real vocabulary beside them;
- anything ``bound_check.check_fields`` refuses: a tensor no recorded (layer, slot) explains,
  a field the spec requires there missing (whatever the counts say), a shape or dtype other
  than the block's binder makes at the recorded geometry and ranks, the spec's BF16 fields in
  the half dtype the file holds (an F16 checkpoint binds them F16: ``config.choose``; a file
  holding both halves, or a half its model's ``dtypes:`` lacks, is refused);
- no content digests (written before they were recorded: bind it again), a record digest
  that is not its metadata's (an edited rank, geometry, layer list or count), or a tensor
  whose bytes are not what its bind wrote (``runtime.bound.bound_format``).
Then it maps the file (``SafetensorsFile``: header validated, entries tiling the data) and
hands out read-only views of the map, or with ``copy=True`` copies: the whole data buffer
read into one fresh buffer with ``readinto`` (one kernel copy out of the page cache, no page
fault per 4 KiB as a copy from the map takes; measured: ``benchmarks/reload.py``), each tensor a
view of that buffer. Either way every tensor handed out has had its digest checked before
``read_bound`` returns: the copies are hashed in memory, the views are hashed through the
map, which reads every page of the file once (the cost: BENCHMARKS.md, "Issue #22: reload
digests").
The digests catch corruption and accidental edits, not a forger: XXH3 has no key.
Trap: views keep the map open; copies do not.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from specbind.core.dtypes import DTYPES
from specbind.core.errors import CheckpointError, ReloadError, SpecbindError
from specbind.core.planning import Ranks
from specbind.core.record import record
from specbind.runtime.binder.checks import Array
from specbind.runtime.binder.quant import LayerQuant
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.bound.bound_check import Entry, check_fields
from specbind.runtime.bound.bound_format import (
    RECORD_KEY,
    BoundMeta,
    Layers,
    QuantMeta,
    decode,
    record_digest,
    tensor_digest,
)
from specbind.runtime.io.safetensors_file import SafetensorsFile
from specbind.runtime.layout.config import HALF, checked_values


@record(frozen=False)
class BoundFile:
    path: Path
    model: str
    ranks: Ranks
    geometry: dict[str, int]
    layers: Layers  # index -> (role, slot -> block)
    tensors: dict[str, Array]  # by their --out names: layers.{i}.{slot}.{field}, globals.{field}
    copied: bool
    meta: BoundMeta  # the file's metadata, as recorded

    @property
    def bytes(self) -> int:
        return sum(a.nbytes for a in self.tensors.values())

    def slot(self, index: int, slot: str) -> dict[str, Array]:
        """One bound slot's fields by field name."""
        pre = f"layers.{index}.{slot}."
        return {k[len(pre) :]: v for k, v in self.tensors.items() if k.startswith(pre)}


def read_bound(
    path: str | os.PathLike[str],
    *,
    models: Mapping[str, ModelTable[Any]],
    specs_sha256: str,
    model: str | None = None,
    tp_size: int | None = None,
    tp_rank: int | None = None,
    ep_size: int | None = None,
    ep_rank: int | None = None,
    copy: bool = False,
) -> BoundFile:
    """The bound weights in ``path``, checked as the module docstring says against ``models``
    (the generated tables by name) and ``specs_sha256`` (the hash they were generated from)."""
    p = Path(path)
    f = SafetensorsFile(p, str(p))  # refuses a file that is not safetensors, naming it
    meta = decode(f.metadata, str(p))
    name = meta.model
    if model is not None and name != model:
        raise ReloadError(f"{p}: written for model {name}, asked for {model}")
    if name not in models:
        raise ReloadError(f"{p}: written for model {name}, which these binders do not know")
    table = models[name]
    if meta.specs_sha256 != specs_sha256:
        raise ReloadError(
            f"{p}: written by binders generated from other specs (sha256 "
            f"{meta.specs_sha256[:12]}, these are {specs_sha256[:12]}); bind it again"
        )
    ranks = meta.ranks
    asked = {"tp_size": tp_size, "tp_rank": tp_rank, "ep_size": ep_size, "ep_rank": ep_rank}
    for key, want in asked.items():
        have = getattr(ranks, key)
        if want is not None and want != have:
            raise ReloadError(
                f"{p}: written for {key.replace('_', ' ')} {have}, asked for {want} (the file "
                f"holds tp rank {ranks.tp_rank} of {ranks.tp_size}, ep rank {ranks.ep_rank} of "
                f"{ranks.ep_size})"
            )
    if meta.digests is None:
        raise ReloadError(
            f"{p}: written before bound files recorded content digests, so its bytes cannot "
            "be verified; bind it again"
        )
    geometry = _geometry(p, table, meta.geometry)
    _check_blocks(p, table, meta.layers)
    padding = table.padding(geometry, ranks)
    if dict(meta.padding) != padding:
        raise ReloadError(
            f"{p}: records padding {json.dumps(dict(meta.padding), sort_keys=True)}, these "
            f"binders pad {json.dumps(padding, sort_keys=True)} at its geometry and ranks"
        )
    lq = _quant(p, table, meta.quant)
    if meta.tensors is not None and meta.tensors != len(f.entries):
        raise ReloadError(
            f"{p}: holds {len(f.entries)} tensor(s), its bind wrote {meta.tensors}: "
            "a field is missing or was added"
        )
    entries = {n: Entry(e.dtype, tuple(e.shape)) for n, e in f.entries.items()}
    half = _half(p, table, entries)
    check_fields(str(p), table, geometry, ranks, meta.layers, lq, entries, half)
    if f.metadata[RECORD_KEY] != record_digest(f.metadata):
        raise ReloadError(
            f"{p}: its metadata is not what its bind recorded (the record digest differs: a "
            "rank, geometry, layer or count was edited); bind it again"
        )
    unsigned = sorted(set(f.entries) ^ set(meta.digests))
    if unsigned:
        raise ReloadError(
            f"{p}: tensor {unsigned[0]} has no recorded digest, or no tensor a digest"
        )
    tensors = _copies(f) if copy else _views(f)
    _verify(p, f, tensors, meta.digests)
    return BoundFile(p, name, ranks, geometry, meta.layers, tensors, copy, meta)


def _verify(
    p: Path, f: SafetensorsFile, tensors: Mapping[str, Array], digests: Mapping[str, str]
) -> None:
    """Each tensor handed out hashes to its recorded digest (its bytes as the file holds them)."""
    for name in sorted(tensors):
        e = f.entries[name]
        raw = tensors[name].reshape(-1).view(np.uint8).data  # [..] -> its bytes, no copy
        if tensor_digest(name, e.dtype, tuple(e.shape), raw) != digests[name]:
            raise ReloadError(
                f"{p}: {name}: its bytes are not what its bind wrote (content digest differs): "
                "the file is corrupt or was edited; bind it again"
            )


def _geometry(p: Path, table: ModelTable[Any], g: Mapping[str, int]) -> dict[str, int]:
    unknown = sorted(set(g) - set(table.default_values()))
    if unknown:
        raise ReloadError(f"{p}: geometry names {', '.join(unknown)}, unknown to {table.name}")
    try:
        return dict(checked_values(table, table.default_values(), g))
    except SpecbindError as e:
        raise ReloadError(f"{p}: its geometry is refused: {e}") from None


def _check_blocks(p: Path, table: ModelTable[Any], layers: Layers) -> None:
    slots = {s.name: set(s.blocks) for s in table.slots}
    for index, (_, blocks) in layers.items():
        for slot, block in blocks.items():
            if block not in slots.get(slot, ()):
                raise ReloadError(
                    f"{p}: layer {index} holds block {block!r} in slot {slot!r}, which model "
                    f"{table.name} does not have there"
                )


def _quant(p: Path, table: ModelTable[Any], q: QuantMeta | None) -> LayerQuant | None:
    """The quantization a file records, as the LayerQuant its fields were bound with."""
    if q is None:
        return None
    schemes = {s.name: s for s in table.schemes}
    if q.scheme not in schemes:
        raise ReloadError(f"{p}: metadata quant names no scheme of {table.name} ({q.scheme!r})")
    scheme = schemes[q.scheme]
    names = sorted(n for n, _ in scheme.params)
    if sorted(n for n, _ in q.params) != names:
        raise ReloadError(
            f"{p}: metadata quant params {dict(q.params)} do not name {q.scheme}'s {names}: "
            "the record and the scheme disagree"
        )
    if q.params or q.symmetric:
        scheme = scheme.resolved(dict(q.params), q.symmetric)
    if "swizzled" in q.outputs and scheme.swizzle is None:
        raise ReloadError(
            f"{p}: metadata quant records the swizzled output, which {q.scheme} does not make "
            "(it has no swizzled block scale): the record and the tensors disagree"
        )
    if q.weight_only and not scheme.weight_only:
        raise ReloadError(
            f"{p}: metadata quant records weight_only, which {q.scheme} has no form of (it "
            "stores no activation scale): the record and the tensors disagree"
        )
    return LayerQuant(scheme, q.weight_only, frozenset(), frozenset(q.outputs))


def _half(p: Path, table: ModelTable[Any], entries: Mapping[str, Entry]) -> str:
    """The half dtype the bind wrote the spec's BF16 fields in (``config.choose``): F16 when
    the file holds F16 tensors, else BF16. A bind writes one half dtype, so a file holding
    both is refused, and so is a half the model's spec does not let its checkpoints have."""
    halves = sorted({e.dtype for e in entries.values()} & HALF)
    if len(halves) > 1:
        raise ReloadError(f"{p}: holds both BF16 and F16 tensors; a bind writes one half dtype")
    half = halves[0] if halves else "BF16"
    if half not in table.dtypes:
        raise ReloadError(
            f"{p}: its tensors are {half}, but model {table.name} binds "
            f"{', '.join(table.dtypes)} only (model `dtypes:`)"
        )
    return half


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
