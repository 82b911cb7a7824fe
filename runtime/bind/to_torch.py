"""Hand bound arrays to torch with the field's dtype: BF16 as ``torch.bfloat16``, F8_E4M3 as
``torch.float8_e4m3fn``, without a copy where the memory allows one.

Invariants:
- the bytes are the bound bytes: a dtype change is a bit view (``uint16`` -> ``bfloat16``),
  never a numeric conversion;
- host arrays become tensors over the same memory (``torch.from_numpy``) when NumPy says the
  memory is writable. Verbatim fields are views of the checkpoint's read-only map, which torch
  cannot share safely (a write would fault), so those are copied once, into tensor-owned memory;
- device arrays (CuPy) cross through DLPack, so torch shares the device buffer; CuPy holds BF16
  as ``uint16`` bits, which ``view`` re-tags.
Trap: torch is imported on first use only, so nothing else in specbind needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from specbind.core.errors import SpecbindError

if TYPE_CHECKING:
    import torch

# The bit-carrier dtype a field of each dtype travels as, and its torch dtype's name.
_CARRIERS: dict[str, tuple[np.dtype[Any], str]] = {
    "BF16": (np.dtype(np.uint16), "bfloat16"),
    "F8_E4M3": (np.dtype(np.uint8), "float8_e4m3fn"),
    "F16": (np.dtype(np.float16), "float16"),
    "F32": (np.dtype(np.float32), "float32"),
    "F64": (np.dtype(np.float64), "float64"),
    "U8": (np.dtype(np.uint8), "uint8"),
    "I8": (np.dtype(np.int8), "int8"),
    "I16": (np.dtype(np.int16), "int16"),
    "I32": (np.dtype(np.int32), "int32"),
    "I64": (np.dtype(np.int64), "int64"),
    "BOOL": (np.dtype(np.bool_), "bool"),
}


def torch_module() -> Any:
    try:
        import torch
    except ImportError as e:
        raise SpecbindError(f"backend 'torch' needs torch installed: {e}") from None
    return torch


def to_torch(a: Any, dtype: str, device: str | None = None) -> torch.Tensor:
    """One bound array (NumPy, or CuPy on a device) as a torch tensor of ``dtype``."""
    tm = torch_module()
    if dtype not in _CARRIERS:
        raise SpecbindError(f"no torch dtype for a field of dtype {dtype}")
    carrier, name = _CARRIERS[dtype]
    if isinstance(a, np.ndarray) and type(a) is np.ndarray:
        bits = a.view(carrier) if a.dtype != carrier else a
        if not bits.flags.writeable:
            bits = bits.copy()  # a view of a read-only map: torch must own writable memory
        t = tm.from_numpy(bits)
        if device is not None and device != "cpu":
            t = t.to(device)  # bound on the host (no CuPy): one copy to the device
    else:  # a device array: torch shares its buffer, on its device, through DLPack
        t = tm.from_dlpack(a)
    if t.dtype != getattr(tm, name):
        t = t.view(getattr(tm, name))
    out: torch.Tensor = t
    return out
