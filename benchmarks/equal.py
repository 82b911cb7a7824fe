"""Whether two loaders bound the same thing: the same fields, shapes and dtypes, the same
bytes, except the fields the spec computes (the absorbs), which may differ by rounding.

Invariant: imports no other bench module but ``common`` (``main`` and ``limits`` both use it).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np

from specbind.core.dtypes import bf16_ulp
from specbind.core.errors import SpecbindError
from specbind.runtime.binder.checks import Array
from specbind.runtime.binder.tables import ModelTable


def computed_fields(table: ModelTable[Any], kinds: Collection[str]) -> frozenset[str]:
    """The field names among ``kinds``' blocks that the spec computes (``transform``): these may
    differ from a hand-written product by rounding; every other field must match byte for byte."""
    return frozenset(
        name for b in kinds for name, f in table.block(b).fields.items() if f.kind == "transform"
    )


# Of a computed field's largest magnitude: two F32 sums of the same products in different
# orders differ by about this much, and where an output nearly cancels (|x| ~ 1e-8 in a field
# whose largest is ~0.04) that is several BF16 ulps of the tiny result (seen: up to 8).
NOISE = 2.0**-16


def check_equal(
    ours: dict[str, Array], theirs: dict[str, Array], loose: Collection[str] = ()
) -> dict[str, int]:
    """Same fields, shapes and dtypes; the same bytes, except a field named in ``loose``
    (``layer.slot.field`` keys, matched on the field) may differ by 1 BF16 ulp, or by
    ``NOISE`` of its largest magnitude. Returns, per loose field that needed the latter, how
    many elements did."""
    wide: dict[str, int] = {}
    if set(ours) != set(theirs):
        raise SpecbindError(
            f"baseline and specbind bind different fields: {sorted(set(ours) ^ set(theirs))}"
        )
    for k, a in ours.items():
        b = theirs[k]
        if a.shape != b.shape or a.dtype != b.dtype:
            raise SpecbindError(
                f"baseline {k}: {b.dtype} {b.shape} vs specbind {a.dtype} {a.shape}"
            )
        if _same_bytes(a, b):
            continue
        if k.rsplit(".", 1)[-1] not in loose:
            raise SpecbindError(f"baseline {k} differs from specbind (it must match byte for byte)")
        beyond = _beyond_one_ulp(a, b, k)
        if beyond:
            wide[k] = beyond
    return wide


def _beyond_one_ulp(a: Array, b: Array, k: str, chunk: int = 1 << 22) -> int:
    """How many elements of ``a`` are more than 1 BF16 ulp from ``b``'s; raises if one is also
    more than ``NOISE`` of ``b``'s largest magnitude. In F64, ``chunk`` elements at a time: a
    whole 134M-element ``o_absorb`` at tp 1 would take 1 GB per F64 temporary, and it needs six."""
    g_all = np.ascontiguousarray(a).reshape(-1)  # any shape -> flat, row-major
    w_all = np.ascontiguousarray(b).reshape(-1)
    spans = range(0, w_all.size, chunk)
    top = max(float(np.abs(w_all[i : i + chunk].astype(np.float64)).max()) for i in spans)
    beyond = 0
    for i in spans:
        g, w = g_all[i : i + chunk].astype(np.float64), w_all[i : i + chunk].astype(np.float64)
        off, ulp = np.abs(g - w), bf16_ulp(w)
        n = int(np.count_nonzero(off > ulp))
        if n and not np.all(off <= np.maximum(ulp, NOISE * top)):
            raise SpecbindError(
                f"baseline {k} differs from specbind by more than 1 BF16 ulp and more than "
                f"2**-16 of its largest magnitude"
            )
        beyond += n
    return beyond


def _same_bytes(a: Array, b: Array, chunk: int = 64 << 20) -> bool:
    """Whether two arrays of one shape and dtype hold the same bytes, compared a chunk at a
    time (``tobytes`` would copy a 1 GB ``w13`` twice)."""
    x = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    y = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    return all(np.array_equal(x[i : i + chunk], y[i : i + chunk]) for i in range(0, x.size, chunk))
