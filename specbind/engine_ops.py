"""What an engine's own loader does to a bound field, as its layout declares it
(``specs/engines/``): a padded split, element-wise functions, rank 0 alone, its checks of the
geometry and tp. Pure NumPy on the host arrays ``bind_for_engine`` produced.

Invariants (each refusal is one ``BindError`` line naming the parameter or the constraint):
- a padded split gives rank r the stored elements of ``[r·P/tp, (r+1)·P/tp)`` of the axis
  padded up to ``P``, then zeros: what vLLM's VocabParallelEmbedding weight_loader leaves;
- ``apply`` computes in F32 from the stored values, with torch's CPU kernels over this rank's
  share (what vLLM's loader runs: ``-torch.exp(param.float())`` on the loaded share), and
  stores the engine's dtype; a value that is finite when stored and is not after the functions
  (``exp`` of 89) is refused, naming the first such index and its stored value; a stored
  non-finite value stays what it is. Without torch ``apply`` is refused: NumPy's F32 ``exp``
  differs from torch's in the last 1-2 bits for ~40% of inputs (measured, torch 2.13), so it
  would not be the engine's bytes;
- ``dtype`` BF16 rounds an F32 field to nearest even (ml_dtypes), as torch's ``copy_`` does;
- a field the engine holds on rank 0 only is zeros, of its shape and dtype, on every other rank;
- an engine constraint that fails at the checkpoint's geometry and tp is refused before any
  tensor is read; so is a tp the layout's proof does not cover (``check_proven_tp``): a
  layout proven at tp 1 alone binds tp 1 alone; one proven at tp 1 and 2 also binds every
  larger tp its shard rules and constraints allow (the rules are tp-generic, the generator
  checks the shapes at 4 and 8, and the census in tests/vllm keeps the constraints equal to
  the engine's own constructors at every tp 1..8).
Trap: the functions run on the bound values, so they come after specbind's own checks and
transforms and never see packed quantized codes (the generator refuses them on a linear).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from specbind.core import algebra, vocab_pad
from specbind.core.errors import BindError, SpecbindError

_NUMPY = {"F32": np.float32, "F16": np.float16}
_FUNCTIONS = ("exp", "neg")  # torch's functions of the same names


def padded_share(
    a: Any, axis: int, multiple: int, tp_size: int, tp_rank: int, name: str, into: Any = None
) -> Any:
    """Rank ``tp_rank``'s share of ``a`` (the whole field) split as an engine that pads
    ``axis`` up to a multiple of ``multiple`` and splits the padded size into ``tp_size`` equal
    shares: the stored rows of that range, then zeros (vLLM's VocabParallelEmbedding: vocab 156
    at tp 2 is padded to 192, rank 0 holds rows [0, 96), rank 1 [96, 156) and 36 zero rows).

    ``into`` (an ``Arena``; ``a`` then a view of the mapped checkpoint, left so by the bind):
    the share is made in the arena, its stored rows read from the file once (``copy_in``:
    ``preadv`` of the contiguous rows of axis 0), so only the rank's rows are read; a whole
    field with no padding row is the arena's copy of ``a``."""
    full = int(a.shape[axis])
    share = vocab_pad.split(full, multiple, tp_size, tp_rank)  # the one arithmetic of padding
    if share is None:
        raise BindError(
            f"parameter {name!r}: {full} padded to a multiple of {multiple} is "
            f"{vocab_pad.padded_size(full, multiple)}, which tp {tp_size} does not split"
        )
    per, start, end = share.per, share.start, share.end
    if (start, end, per) == (0, full, full):
        # the whole field, no row of padding: the field itself, not a copy (or, bound as a view
        # for this split, read into the arena once)
        return a if into is None else into.place(a)
    if into is not None and axis == 0 and end - start == per:  # no padding row in this share
        return into.place(np.asarray(a)[start:end])  # its rows: read once (or mapped)
    shape = list(a.shape)
    shape[axis] = per
    take = [slice(None)] * a.ndim
    take[axis] = slice(start, end)
    put = list(take)
    put[axis] = slice(0, end - start)
    pad = list(take)
    pad[axis] = slice(end - start, per)
    if into is None:
        out = np.zeros(shape, dtype=a.dtype)
        out[tuple(put)] = np.asarray(a)[tuple(take)]
        return out
    from specbind.runtime.binder.ops import copy_in

    out = into.empty(tuple(shape), a.dtype)
    copy_in(out[tuple(put)], np.asarray(a)[tuple(take)])  # the stored rows: one read
    out[tuple(pad)] = 0  # the padding rows
    return out


def numpy_dtype(dtype: str) -> Any:
    if dtype == "BF16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return _NUMPY[dtype]


def apply_values(a: Any, functions: tuple[str, ...], dtype: str, name: str) -> Any:
    """``functions`` applied in order to ``a`` in F32, stored as ``dtype``; a finite stored
    value made non-finite is refused (index and value named)."""
    x = np.asarray(a).astype(np.float32)
    y = _torch_functions(x, functions, name) if functions else x
    with np.errstate(over="ignore", invalid="ignore"):
        out = y.astype(numpy_dtype(dtype))
    bad = np.isfinite(x) & ~np.isfinite(out.astype(np.float32))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        made = float(out.astype(np.float32)[where])
        raise BindError(
            f"parameter {name!r}: {' then '.join(functions)} of the stored value "
            f"{float(x[where])!r} at index {list(where)} is {made!r} in {dtype} "
            f"(and {int(bad.sum()) - 1} more): the engine would hold a non-finite value"
        )
    return out


def _torch_functions(x: Any, functions: tuple[str, ...], name: str) -> Any:
    """``functions`` over the F32 array ``x`` with torch's own kernels, the engine's: the bytes
    its loader computes (NumPy's vectorised exp rounds otherwise in the last bits)."""
    try:
        import torch
    except ImportError:
        raise BindError(
            f"parameter {name!r}: {' then '.join(functions)} must run on torch's kernels, as "
            "the engine's loader does, and torch is not importable (pip install "
            "'specbind[interop]')"
        ) from None
    t = torch.from_numpy(np.ascontiguousarray(x))  # [share] F32, this rank's as the engine's
    for f in functions:
        if f not in _FUNCTIONS:
            raise BindError(f"parameter {name!r}: unknown function {f!r}")
        t = getattr(torch, f)(t)
    return t.numpy()


def zeros_like(a: Any) -> Any:
    return np.zeros(a.shape, dtype=a.dtype)


def check_proven_tp(
    engine: str, model: str, file: str | None, proof_tp: tuple[int, ...], tp_size: int
) -> None:
    """Refuse a tp the layout's proof does not cover: one not in ``proof_tp``, unless the
    proof covers tp 1 and 2 and ``tp_size`` is larger (a split proven on two ranks is the same
    rule on eight; the engine's own refusals at larger tps are the layout's constraints)."""
    if not proof_tp or tp_size in proof_tp:
        return
    if {1, 2} <= set(proof_tp) and tp_size > 2:
        return
    at = ", ".join(str(t) for t in proof_tp)
    raise BindError(
        f"the {engine} layout of {model} is proven at tp {at} only ({file or 'its'} proof.tp): "
        f"tp {tp_size} is refused, as no test proves what {engine} holds there"
    )


def check_constraints(
    engine: str, model: str, constraints: tuple[tuple[str, str, str], ...],
    values: Mapping[str, int], tp_size: int,
) -> None:  # fmt: skip
    """Each of the engine's checks holds at the checkpoint's geometry and ``tp_size``."""
    for name, check, why in constraints:
        expr = algebra.parse(check, check=True)
        env = dict(values) | {"tp": tp_size}
        try:
            ok = algebra.evaluate(expr, env)
        except SpecbindError as e:
            raise BindError(f"{engine} constraint {name} ({check}) of {model}: {e}") from None
        if not ok:
            shown = ", ".join(f"{s}={env[s]}" for s in sorted(expr.names))
            raise BindError(
                f"{engine} refuses {model} at tp {tp_size}: constraint {name} ({check}) fails "
                f"at {shown}: {why}"
            )
