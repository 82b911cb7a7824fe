"""``make gpu-check`` steps 2 and 3: every model family's ``backend="cupy"`` bind of its tiny
checkpoint against the NumPy bind, and the torch hand-off through DLPack.

Step 2 (``families``): for each generated model, unquantized and under each scheme it
declares, a synthetic tiny checkpoint is bound at tp 1 and at rank 1 of tp 2 on both
backends (with every optional quantized output, so the dequant and swizzle kernels run too);
each field must have the same dtype, shape and bytes, except an absorb (a cuBLAS contraction,
which may sum in another order: within one BF16 ulp). Step 3 (``torch``): one bind with
``backend="torch", device="cuda"``; each tensor must start at the address of the device array
the bind made (DLPack shares it: no host copy), live on that array's device, carry the field's
dtype and hold the NumPy bind's bytes; torch's own allocator must not grow.

Invariant: nothing here picks a family by name; the families are ``MODELS``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from specbind.core.dtypes import within_one_bf16_ulp
from specbind.core.errors import SpecbindError
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.binder import backends
from specbind.runtime.io.checkpoint import CheckpointDir

RANKS = ((1, 0), (2, 1))  # (tp_size, tp_rank): tp 1, and one rank of tp 2
LAYERS = 4


def _fields_equal(host: Any, dev: Any, device: Any) -> list[str]:
    """What differs between two binds' fields (empty when every field agrees)."""
    problems = []
    if dev.keys() != host.keys():
        problems.append(f"fields differ: {sorted(set(dev) ^ set(host))[:5]}")
    for key, (rule, want) in host.items():
        if key not in dev:
            continue
        got = device.to_host(dev[key][1], rule.dtype)
        if got.dtype != want.dtype or got.shape != want.shape:
            problems.append(
                f"{key}: {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}"
            )
        elif key.endswith("absorb"):
            if not within_one_bf16_ulp(got, want):
                problems.append(f"{key}: beyond one BF16 ulp")
        elif got.tobytes() != want.tobytes():
            n = int(np.count_nonzero(got.view(np.uint8) != want.view(np.uint8)))
            problems.append(f"{key}: {n} bytes differ")
    return problems


def checkpoints(
    root: Path, models: Collection[str] | None = None
) -> list[tuple[str, str | None, Path]]:
    """(model, scheme or None, checkpoint) for every family (or those in ``models``) and
    scheme, written under root once."""
    from specbind.generated import MODELS
    from specbind.synth import synth, tiny_values

    out = []
    for name, table in MODELS.items():
        if models is not None and name not in models:
            continue
        for scheme in (None, *table.schemes):
            where = root / f"{name}-{scheme.name if scheme else 'bf16'}"
            if not (where / "config.json").exists():
                synth(table, where, tiny_values(table), layers=LAYERS, seed=7, quant=scheme)
            out.append((name, scheme.name if scheme else None, where))
    return out


def families(root: Path, models: Collection[str] | None = None) -> dict[str, Any]:
    from specbind.generated import MODELS
    from specbind.runtime.binder.quant import OUTPUTS as QUANT_OUTPUTS

    device = backends.get("cupy", importlib.import_module("specbind.generated.kernels"))
    rows: list[dict[str, Any]] = []
    for name, scheme, ck_path in checkpoints(root, models):
        ck = CheckpointDir(ck_path)
        qout = tuple(QUANT_OUTPUTS) if scheme else ()
        for tp, rank in RANKS:
            t0 = time.perf_counter()
            kw: dict[str, Any] = {"tp_size": tp, "tp_rank": rank, "progress": False,
                                  "quant_outputs": qout}  # fmt: skip
            try:
                host = bind_checkpoint(ck, MODELS[name], **kw).fields()
            except SpecbindError as e:  # a geometry this rank cannot hold: refused alike?
                refused = str(e)
                try:
                    bind_checkpoint(ck, MODELS[name], backend=device, **kw)
                    problems = [f"the NumPy bind refused ({refused}), the CuPy bind did not"]
                except SpecbindError as d:
                    problems = [] if str(d) == refused else [f"refused otherwise: {d}"]
                rows.append({"model": name, "scheme": scheme, "tp_size": tp, "tp_rank": rank,
                             "fields": 0, "refused": refused, "equal": not problems,
                             "problems": problems})  # fmt: skip
                continue
            try:
                dev = bind_checkpoint(ck, MODELS[name], backend=device, **kw).fields()
                problems = _fields_equal(host, dev, device)
            except SpecbindError as e:
                problems = [f"the CuPy bind refused what the NumPy bind bound: {e}"]
            rows.append({"model": name, "scheme": scheme, "tp_size": tp, "tp_rank": rank,
                         "fields": len(host), "equal": not problems, "problems": problems[:10],
                         "seconds": round(time.perf_counter() - t0, 3)})  # fmt: skip
    return {
        "ok": all(r["equal"] for r in rows),
        "binds": sum(1 for r in rows if "refused" not in r),
        "refused_alike": sum(1 for r in rows if "refused" in r),
        "fields": sum(r["fields"] for r in rows),
        "rows": rows,
    }


def device_pointer(a: Any) -> int:
    """Where a device array's bytes start (``__cuda_array_interface__``)."""
    return int(a.__cuda_array_interface__["data"][0])


def torch_handoff(root: Path) -> dict[str, Any]:
    import torch

    from specbind import api
    from specbind.generated import MODELS
    from specbind.runtime.bind.to_torch import _CARRIERS

    name, _, ck_path = checkpoints(root)[0]
    ck = api.open(ck_path, model=name)
    cuda = torch.cuda.is_available()
    before = torch.cuda.memory_allocated() if cuda else 0
    bound = ck.bind(backend="torch", device="cuda", tp_size=2, tp_rank=1)
    grew = (torch.cuda.memory_allocated() - before) if cuda else 0
    arrays = bound.result.fields()
    host = bind_checkpoint(CheckpointDir(ck_path), MODELS[name], tp_size=2, tp_rank=1,
                           progress=False).fields()  # fmt: skip
    problems = []
    tensors = bound.tensors()
    for key, t in tensors.items():
        rule, a = arrays[key]
        kind, _ = a.__dlpack_device__()
        where = "cuda" if int(kind) == 2 else "cpu"  # DLPack kDLCUDA = 2, kDLCPU = 1
        want_dtype = getattr(torch, _CARRIERS[rule.dtype][1])
        if t.data_ptr() != device_pointer(a):
            problems.append(f"{key}: torch holds a copy (not the bind's device buffer)")
        if t.device.type != where:
            problems.append(f"{key}: torch says {t.device}, the bound array lies on {where}")
        if t.dtype != want_dtype:
            problems.append(f"{key}: torch dtype {t.dtype}, the field is {rule.dtype}")
        got = t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
        want = host[key][1]
        if not key.endswith("absorb") and got != want.tobytes():
            problems.append(f"{key}: bytes differ from the NumPy bind")
    if grew:
        problems.append(f"torch allocated {grew} bytes on the device: something was copied")
    return {
        "ok": not problems and bool(tensors),
        "model": name,
        "tensors": len(tensors),
        "torch_sees_cuda": cuda,
        "torch_allocated_bytes": grew,
        "problems": problems[:20],
    }
