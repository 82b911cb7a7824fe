"""Bind a checkpoint into an engine's own parameters, by a generated engine layout.

``bind_for_engine`` binds this rank's share with the layout's variant binders (the same checks
as every bind) and names each field by the engine's parameter name; ``fill`` copies them into
the engine's parameters.

Invariants of ``fill`` (each refusal is one ``BindError`` line naming the parameter):
- every engine parameter is filled exactly once, from a field of equal shape and dtype;
- a parameter on torch's ``meta`` device (no storage: ``copy_`` into it does nothing and says
  nothing) is refused;
- a field whose parameter the engine does not hold is refused (nothing bound is left over),
  and so is a parameter no field fills (nothing the engine holds is left as initialised);
- all of it is checked before the first byte is copied, so a refused load changes nothing;
- with ``adopt`` (the separate ``Arena`` the fields were bound into) a parameter takes its
  field's memory as its storage only where no other field or parameter can name that memory
  (the whole of one of the arena's maps, a private map of the file's bytes it made with
  ``file_views``, or NumPy memory the array owns; a contiguous host parameter whose storage no
  other parameter shares), no two parameters adopting memory that shares a byte; every other
  parameter is copied into, never into storage that holds a field (a donated parameter's,
  ``Arena.donate``): such a parameter gets fresh storage first;
- a parameter whose storage any other live tensor holds (a buffer registered as a view of it,
  as vLLM's ``MambaMixer2`` makes ``conv_weights`` of ``conv1d.weight``; ``held_elsewhere``)
  keeps that storage and is copied into, as vLLM's own loader writes it: the other tensor
  then reads the bound bytes, not the ones the engine allocated.
Trap: an adopted parameter and its field are one memory: a caller who keeps the fields and
writes into one writes into the engine's parameter.
A padded split (``EngineTable.padding``, the layout's ``pad:``) is the engine's rule, not a
shard of specbind's: the variant binds the field whole (a view of the mapped file), and each
rank copies the stored rows of its share of the padded axis, then zeros (``padded_share``);
bound ``into`` an arena, the bind leaves that field a view of the map (``Arena.views``) and the
rank's stored rows alone are read from the file into the arena, so no rank reads the whole
vocabulary.
Trap: a tied LM head is one parameter in engines that tie it (vLLM lists it once, as the
embedding): a field bound through a ``tie`` (config.json says so) whose engine parameter the
engine does not hold is skipped when the field it is tied to fills one; an engine that keeps
both gets both.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from specbind.core.errors import BindError
from specbind.core.record import record
from specbind.engine_ops import (
    apply_values,
    check_constraints,
    check_proven_tp,
    padded_share,
    zeros_like,
)
from specbind.engine_quant import companion_params, engine_companion, engine_scheme
from specbind.engine_select import constraint_values, select_layout

# A field's safetensors dtype -> torch's dtype name (the bytes are copied, never converted).
TORCH_DTYPES = {
    "BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
    "F8_E4M3": "float8_e4m3fn", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32",
    "I64": "int64", "BOOL": "bool",
}  # fmt: skip


@record
class EngineField:
    name: str  # the engine's parameter name
    where: str  # the bound field, as ``bind --out`` names it (layers.3.mlp.w13)
    dtype: str  # safetensors dtype
    array: Any  # this rank's host array (NumPy; BF16 as ml_dtypes.bfloat16)
    tied_to: str | None = None  # bound from another field's tensor (a tie): that field's name


def bind_for_engine(
    path: str | Path,
    engine: str,
    *,
    tp_size: int = 1,
    tp_rank: int | None = None,
    model: str | None = None,
    advice: str | None = None,
    layout: Any = None,
    into: Any = None,
) -> dict[str, EngineField]:
    """This rank's share of the checkpoint at ``path``, by the engine's parameter names, with
    what the engine's loader does to each field (``specbind.engine_ops``); ``layout``: an
    ``EngineTable`` instead of the generated one of the checkpoint's model; ``advice``: what a
    checkpoint no model claims is told to do, for a caller that cannot pass ``model=``;
    ``into``: an ``Arena`` every field is bound into (``bind_checkpoint(into=)``), for ``fill``
    to hand to the parameters (``adopt=``)."""
    from specbind.api import model_table
    from specbind.core.rank_args import check_ranks
    from specbind.runtime.bind.bind import bind_checkpoint
    from specbind.runtime.binder import backends
    from specbind.runtime.io.checkpoint import CheckpointDir

    tp_size, tp_rank = check_ranks("bind_for_engine", tp_size, tp_rank)
    raw = CheckpointDir(Path(path))
    base = model_table(model, "model=", raw.config, advice)
    if layout is None:  # as the engine picks its class: by architectures, else the model
        layout = select_layout(engine, base.name, raw.config)
    if layout.proof is None:
        import logging

        logging.getLogger("specbind.engine").warning(
            "specbind: the %s layout of %s is unproven: no test proves it parameter-identical "
            "to %s's own loader (specs/engines/%s/%s.yaml has no proof:)",
            engine, base.name, engine, engine, base.name,
        )  # fmt: skip
    check_proven_tp(engine, base.name, layout.file, layout.proof_tp, tp_size)
    check_constraints(
        engine, base.name, layout.constraints, constraint_values(layout, raw.config), tp_size
    )
    quant = engine_scheme(engine, layout, raw, tp_size)  # refused before any read
    if into is not None and layout.padding:  # each rank reads its rows of these itself
        into.views = frozenset((b, f) for b, fs in layout.padding.items() for f in fs)
    result = bind_checkpoint(
        raw,
        layout.table,
        {},
        tp_size,
        tp_rank,
        backend=backends.get("numpy", None),
        mtp=layout.skip_mtp is None,  # an engine model without MTP layers: the decoder alone
        into=into,
    )
    beyond = sorted(
        {s.block for layer in result.layers for s in layer.slots.values()}
        & set(layout.proof_except)
    )
    if beyond:
        import logging

        logging.getLogger("specbind.engine").warning(
            "specbind: this checkpoint's layers hold %s, which the proof of the %s layout of %s "
            "does not reach (%s): those parameters are unproven against %s's own loader",
            ", ".join(beyond), engine, base.name, layout.proof_except_why, engine,
        )  # fmt: skip
    out: dict[str, EngineField] = {}
    for layer in result.layers:
        if layer.role == "mtp":
            if layout.skip_mtp is None:
                raise BindError(
                    f"{engine}: layer {layer.index} is an MTP layer, and the {engine} layout of "
                    f"{base.name} binds none"
                )
            continue
        prefix = layout.layers.format(index=layer.index)
        for sname, slot in layer.slots.items():
            arrays = slot.weights.arrays()
            params = companion_params(
                engine, quant, layout, slot.block, layout.parameters[slot.block], arrays,
                slot.fields,
            )  # fmt: skip
            for field, arr in arrays.items():
                pname, suffix = params[field]
                name = prefix + pname
                dtype = slot.fields[field].dtype
                if suffix and quant is not None:
                    dtype, arr = engine_companion(quant, suffix, dtype, arr, name)
                else:
                    dtype, arr = _engine_value(
                        layout, slot.block, field, dtype, arr, name, tp_size, tp_rank, into
                    )
                where = f"layers.{layer.index}.{sname}.{field}"
                _once(engine, out, name, where)
                out[name] = EngineField(name, where, dtype, arr)
    if result.globals is not None:
        g = result.globals
        names = layout.parameters[g.block]
        entry = layout.table.block(g.block)
        made_from = {src: f for f, srcs in entry.sources.items() for src in srcs}
        ties = {
            r.name: r.tie.to
            for r in entry.tensors
            if r.tie is not None and result.flags.get(r.tie.config)
        }
        garrays = g.weights.arrays()
        params = companion_params(engine, quant, layout, g.block, names, garrays, g.fields)
        for field, arr in garrays.items():
            pname, suffix = params[field]
            dtype = g.fields[field].dtype
            if suffix and quant is not None:
                dtype, arr = engine_companion(quant, suffix, dtype, arr, pname)
                _once(engine, out, pname, f"globals.{field}")
                out[pname] = EngineField(pname, f"globals.{field}", dtype, arr)
                continue
            (src, *rest) = entry.sources[field]
            tied = names[made_from[ties[src]]] if src in ties and not rest else None
            dtype, arr = _engine_value(
                layout, g.block, field, dtype, arr, pname, tp_size, tp_rank, into
            )
            _once(engine, out, pname, f"globals.{field}")
            out[pname] = EngineField(pname, f"globals.{field}", dtype, arr, tied)
    return out


def _once(engine: str, out: Mapping[str, EngineField], name: str, where: str) -> None:
    """Refuse a second field for one engine parameter: nothing is filled twice."""
    if name in out:
        raise BindError(
            f"{engine}: parameter {name!r} would be filled by both {out[name].where} and {where}"
        )


def _engine_value(
    layout: Any, block: str, field: str, dtype: str, arr: Any, name: str, tp: int, rank: int,
    into: Any = None,
) -> tuple[str, Any]:  # fmt: skip
    """The field as the engine holds it: padded split, functions, rank 0 alone (``into``: the
    arena a padded field's share is read into, the field bound as a view of the map)."""
    pad = layout.padding.get(block, {}).get(field)
    if pad is not None:
        arr = padded_share(arr, pad[0], pad[1], tp, rank, name, into)
    values = layout.values.get(block, {}).get(field)
    if values is not None:
        functions, engine_dtype = values
        dtype = engine_dtype or dtype
        arr = apply_values(arr, functions, dtype, name)
    if rank != 0 and field in layout.first_rank.get(block, ()):
        arr = zeros_like(arr)
    return dtype, arr


def fill(
    engine: str,
    params: Mapping[str, Any],
    fields: Mapping[str, EngineField],
    adopt: Any = None,
    left: Collection[str] = (),
) -> int:
    """Copy each field into the engine parameter of its name (torch tensors); return bytes.

    ``adopt`` (the separate ``Arena`` the fields were bound into): a host parameter takes its
    field's memory as its storage instead of a copy where that memory is the field's alone
    (``adopt.sole``, or NumPy memory the array owns) and the parameter is contiguous and shares
    its storage with no other parameter or live tensor (``held_elsewhere``: such a storage is
    copied into, where the other tensor sees it); any other is copied into, into fresh storage
    where its own was donated to the bind and handed out to a field (``Arena.donate``,
    ``Arena.lent``).
    Each byte of the rank is then written once, by the bind, into what becomes the parameter.
    ``left``: parameters the engine fills itself from no checkpoint tensor
    (``engine_quant.made_by_engine``: a quantized model's KV-cache scale sentinels), which no
    field need fill; a field that does fill one still may."""
    import torch

    tied: dict[str, str] = {}
    for name, f in fields.items():  # an engine that ties them holds the target alone
        if f.tied_to is not None and name not in params and f.tied_to in params:
            tied[name] = f.tied_to
    missing = sorted(n for n in params if n not in fields and n not in left)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise BindError(
            f"{engine}: parameter {missing[0]!r} is filled by no bound field{more}: the "
            f"checkpoint or the layout lacks it"
        )
    for name, f in fields.items():
        if name in tied:
            continue
        if name not in params:
            raise BindError(
                f"{engine}: bound field {f.where} has no engine parameter {name!r} to fill "
                "(the engine's model holds no such parameter)"
            )
        p = params[name]
        if p.device.type == "meta":  # no storage: copy_ into it is a no-op that raises nothing
            raise BindError(
                f"{engine}: parameter {name!r} is on device 'meta' (no storage: nothing can be "
                "copied into it); allocate the model's parameters first (Module.to_empty)"
            )
        want = TORCH_DTYPES.get(f.dtype)
        shape = tuple(int(x) for x in f.array.shape)
        if tuple(p.shape) != shape or p.dtype != getattr(torch, want or "", None):
            raise BindError(
                f"{engine}: parameter {name!r} is {list(p.shape)} "
                f"{str(p.dtype).removeprefix('torch.')}, but bound field {f.where} is "
                f"{list(shape)} {f.dtype}"
            )
    shared = shared_storage(params) if adopt is not None else set()
    if adopt is not None:  # a storage another live tensor views keeps its bytes' home
        shared |= held_elsewhere(
            {n: p for n, p in params.items() if not _donated(adopt, p)}
        )  # fmt: skip
    taken: list[tuple[int, int]] = []  # the memory parameters have adopted: sorted byte ranges
    total = 0
    for name, f in fields.items():
        if name in tied:
            continue
        p = params[name]
        if adopt is not None and name not in shared and _adopt(p, f, adopt, taken):
            total += int(f.array.nbytes)
            continue
        if adopt is not None and p.device.type == "cpu" and adopt.lent(p.data_ptr()):
            p.data = torch.empty_like(p)  # its storage was donated and holds a field
        total += _copy(p, f.array)
    return total


def shared_storage(params: Mapping[str, Any]) -> set[str]:
    """The names of parameters whose storage another listed parameter shares (distinct
    parameter objects over one storage): those keep their storage and are copied into."""
    by_storage: dict[int, list[str]] = {}
    seen: set[int] = set()
    for name, p in params.items():
        if id(p) in seen:  # one parameter listed under two names: no aliasing of storage
            continue
        seen.add(id(p))
        by_storage.setdefault(p.untyped_storage().data_ptr(), []).append(name)
    return {n for names in by_storage.values() if len(names) > 1 for n in names}


def held_elsewhere(params: Mapping[str, Any]) -> set[str]:
    """The names of parameters whose storage some live tensor other than the listed parameters
    also holds: a buffer made as a view of it (vLLM's ``MambaMixer2.__init__`` registers
    ``conv_weights`` as a view of ``conv1d.weight``, and its forward reads the buffer), a
    module attribute, a closure, anything. Such a parameter must be copied into, never given
    other storage (``p.data = ...``) nor have its storage donated: the other tensor would keep
    the old bytes.

    Counted by the storage's own reference count (``torch._C._storage_Use_Count``: every
    tensor over a storage holds one), against what the listed parameters and this function's
    own handle account for, so every holder is seen, not only the ones a walk of the modules
    would find. A torch without that count: every parameter is reported (all copied into)."""
    import torch

    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return set(params)
    one = torch.empty(1)
    base = int(count(one.untyped_storage()._cdata)) - 1  # one tensor and a handle, less it
    groups: dict[int, tuple[Any, set[int], list[str]]] = {}
    for name, p in params.items():
        st = p.untyped_storage()  # the handle, kept alive in the group while counting
        _, tensors, names = groups.setdefault(int(st._cdata), (st, set(), []))
        tensors.add(id(p))
        names.append(name)
    return {
        n
        for st, tensors, names in groups.values()
        if int(count(st._cdata)) > base + len(tensors)
        for n in names
    }


def _donated(arena: Any, p: Any) -> bool:
    """Whether ``p``'s storage was donated to ``arena`` (the arena holds a view of it; the
    caller donated only storage no other tensor holds: ``specbind.vllm_loader.donors``)."""
    return bool(p.device.type == "cpu" and arena.donated(p.untyped_storage().data_ptr()))


def _claim(taken: list[tuple[int, int]], a: Any) -> bool:
    """Add ``a``'s bytes to ``taken`` (sorted, disjoint ranges) unless they overlap one there:
    no two parameters may adopt memory that shares a byte."""
    import bisect

    lo = int(a.ctypes.data)
    hi = lo + int(a.nbytes)
    at = bisect.bisect_left(taken, (lo, hi))
    if (at > 0 and taken[at - 1][1] > lo) or (at < len(taken) and taken[at][0] < hi):
        return False
    taken.insert(at, (lo, hi))
    return True


def _adopt(p: Any, f: EngineField, arena: Any, taken: list[tuple[int, int]]) -> bool:
    """Make the field's memory ``p``'s storage (``p.data``, the parameter object kept) where
    it may be, and say whether it was."""
    from specbind.runtime.bind.to_torch import to_torch

    a = f.array
    if p.device.type != "cpu" or not p.is_contiguous() or not isinstance(a, np.ndarray):
        return False
    if (
        not (a.flags.c_contiguous and a.flags.writeable)
        or not (arena.sole(a) or (a.flags.owndata and a.base is None))
        or not _claim(taken, a)
    ):
        return False
    p.data = to_torch(a, f.dtype)  # a view of the same memory: no copy
    return True


def _copy(p: Any, a: Any) -> int:
    """``p[...] = a`` bit for bit; a host parameter is written through NumPy (one copy from the
    checkpoint's map), a device one through a host tensor."""
    import torch

    from specbind.runtime.bind.to_torch import to_torch

    src = np.asarray(a)
    if p.device.type == "cpu" and src.dtype.itemsize == p.element_size():
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[src.dtype.itemsize]
        dst = p.detach().view(bits).numpy()
        dst[...] = src.view(dst.dtype)  # one copy: a strided view is read in place
    else:
        with torch.no_grad():
            p.copy_(to_torch(np.ascontiguousarray(src), _dtype_of(p)))
    return int(src.nbytes)


def _dtype_of(p: Any) -> str:
    name = str(p.dtype).removeprefix("torch.")
    return next(k for k, v in TORCH_DTYPES.items() if v == name)
