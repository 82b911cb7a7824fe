"""Bind a checkpoint into an engine's own parameters, by a generated engine layout.

``bind_for_engine`` binds this rank's share with the layout's variant binders (the same checks
as every bind) and names each field by the engine's parameter name; ``fill`` copies them into
the engine's parameters.

Invariants of ``fill`` (each refusal is one ``BindError`` line naming the parameter):
- every engine parameter is filled exactly once, from a field of equal shape and dtype;
- a field whose parameter the engine does not hold is refused (nothing bound is left over),
  and so is a parameter no field fills (nothing the engine holds is left as initialised);
- all of it is checked before the first byte is copied, so a refused load changes nothing.
A padded split (``EngineTable.padding``, the layout's ``pad:``) is the engine's rule, not a
shard of specbind's: the variant binds the field whole (a view of the mapped file), and each
rank copies the stored rows of its share of the padded axis, then zeros (``padded_share``).
Trap: a tied LM head is one parameter in engines that tie it (vLLM lists it once, as the
embedding): a field bound through a ``tie`` (config.json says so) whose engine parameter the
engine does not hold is skipped when the field it is tied to fills one; an engine that keeps
both gets both.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from specbind.core.errors import BindError, SpecbindError
from specbind.core.record import record

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


def layout_for(engine: str, model: str) -> Any:
    """The generated ``EngineTable`` of ``engine`` for ``model``, or one line naming those that
    exist."""
    from specbind.generated.engines import ENGINES

    found = ENGINES.get((engine, model))
    if found is None:
        have = ", ".join(f"{e}/{m}" for e, m in sorted(ENGINES)) or "none"
        raise SpecbindError(
            f"no {engine} layout for model {model!r} (specs/engines/{engine}/{model}.yaml; "
            f"generated: {have})"
        )
    return found


def bind_for_engine(
    path: str | Path,
    engine: str,
    *,
    tp_size: int = 1,
    tp_rank: int = 0,
    model: str | None = None,
) -> dict[str, EngineField]:
    """This rank's share of the checkpoint at ``path``, by the engine's parameter names."""
    from specbind.api import model_table
    from specbind.runtime import backends
    from specbind.runtime.bind import bind_checkpoint
    from specbind.runtime.checkpoint import CheckpointDir

    raw = CheckpointDir(Path(path))
    base = model_table(model, "model=", raw.config)
    layout = layout_for(engine, base.name)
    result = bind_checkpoint(
        raw,
        layout.table,
        {},
        tp_size,
        tp_rank,
        backend=backends.get("numpy", None),
        mtp=layout.skip_mtp is None,  # an engine model without MTP layers: the decoder alone
    )
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
            names = layout.parameters[slot.block]
            pads = layout.padding.get(slot.block, {})
            for field, arr in slot.weights.arrays().items():
                name = prefix + names[field]
                if field in pads:
                    axis, multiple = pads[field]
                    arr = padded_share(arr, axis, multiple, tp_size, tp_rank, name)
                out[name] = EngineField(
                    name, f"layers.{layer.index}.{sname}.{field}", slot.fields[field].dtype, arr
                )
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
        pads = layout.padding.get(g.block, {})
        for field, arr in g.weights.arrays().items():
            (src, *rest) = entry.sources[field]
            tied = names[made_from[ties[src]]] if src in ties and not rest else None
            if field in pads:
                axis, multiple = pads[field]
                arr = padded_share(arr, axis, multiple, tp_size, tp_rank, names[field])
            out[names[field]] = EngineField(
                names[field], f"globals.{field}", g.fields[field].dtype, arr, tied
            )
    return out


def padded_share(a: Any, axis: int, multiple: int, tp_size: int, tp_rank: int, name: str) -> Any:
    """Rank ``tp_rank``'s share of ``a`` (the whole field) split as an engine that pads
    ``axis`` up to a multiple of ``multiple`` and splits the padded size into ``tp_size`` equal
    shares: the stored rows of that range, then zeros (vLLM's VocabParallelEmbedding: vocab 156
    at tp 2 is padded to 192, rank 0 holds rows [0, 96), rank 1 [96, 156) and 36 zero rows)."""
    full = int(a.shape[axis])
    padded = -(-full // multiple) * multiple
    if padded % tp_size:
        raise BindError(
            f"parameter {name!r}: {full} padded to a multiple of {multiple} is {padded}, which "
            f"tp {tp_size} does not split"
        )
    per = padded // tp_size
    start, end = min(tp_rank * per, full), min((tp_rank + 1) * per, full)
    shape = list(a.shape)
    shape[axis] = per
    out = np.zeros(shape, dtype=a.dtype)
    take = [slice(None)] * a.ndim
    take[axis] = slice(start, end)
    put = list(take)
    put[axis] = slice(0, end - start)
    out[tuple(put)] = np.asarray(a)[tuple(take)]
    return out


def fill(engine: str, params: Mapping[str, Any], fields: Mapping[str, EngineField]) -> int:
    """Copy each field into the engine parameter of its name (torch tensors); return bytes."""
    import torch

    tied: dict[str, str] = {}
    for name, f in fields.items():  # an engine that ties them holds the target alone
        if f.tied_to is not None and name not in params and f.tied_to in params:
            tied[name] = f.tied_to
    missing = sorted(n for n in params if n not in fields)
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
        want = TORCH_DTYPES.get(f.dtype)
        shape = tuple(int(x) for x in f.array.shape)
        if tuple(p.shape) != shape or p.dtype != getattr(torch, want or "", None):
            raise BindError(
                f"{engine}: parameter {name!r} is {list(p.shape)} "
                f"{str(p.dtype).removeprefix('torch.')}, but bound field {f.where} is "
                f"{list(shape)} {f.dtype}"
            )
    total = 0
    for name, f in fields.items():
        if name in tied:
            continue
        total += _copy(params[name], f.array)
    return total


def _copy(p: Any, a: Any) -> int:
    """``p[...] = a`` bit for bit; a host parameter is written through NumPy (one copy from the
    checkpoint's map), a device one through a host tensor."""
    import torch

    from specbind.runtime.to_torch import to_torch

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
