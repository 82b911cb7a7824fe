"""Mutations of a checkpoint stored under its writers' names (``stored_names``), one stored
tensor at a time, and the judge of the one-line refusal each gets: it must name the stored
tensor by the name the checkpoint's own index uses (or, for a missing tensor, would use),
never by a spec-internal name alone, and its explanation must not speak of another family.

Kinds: the stored tensors with their layer and member indices read as placeholders
(``model.layers.#.block_sparse_moe.experts.#.w1.weight``), one representative each (the last
layer's, the last member's). Mutations of each:
- ``dtype``: stored as F64, a dtype no spec accepts;
- ``inexact``: a BF16 tensor stored as F32 holding a value BF16 cannot hold (refused for its
  dtype, or for the value where the spec converts F32 exactly);
- ``shape``: one more element on its last axis;
- ``missing``: dropped;
- ``extra``: a tensor beside it (``<its module>.bogus``);
- ``beyond``: a member one past its family's size (member-indexed names only);
- ``truncated``: its header's shape claims one row more than its bytes hold.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

MUTATIONS = ("dtype", "inexact", "shape", "missing", "extra", "beyond", "truncated")
INDEX = re.compile(r"(?<=\.)(0|[1-9][0-9]*)(?=\.)")
_ST_DTYPES = {
    np.dtype(np.float64): "F64",
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.int32): "I32",
    np.dtype(np.int64): "I64",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
}


def kinds(names: list[str]) -> dict[str, str]:
    """One stored name per kind (indices as ``#``): the one with the largest indices."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for n in names:
        key = INDEX.sub("#", n)
        idx = tuple(int(i) for i in INDEX.findall(n))
        if key not in out or idx > out[key][0]:
            out[key] = (idx, n)
    return {k: n for k, (_, n) in sorted(out.items())}


def _dtype_name(a: np.ndarray) -> str:
    if a.dtype.name == "bfloat16":
        return "BF16"
    if "float8" in a.dtype.name:
        return "F8_E4M3" if "e4m3" in a.dtype.name else "F8_E5M2"
    return _ST_DTYPES[a.dtype]


def write(tensors: dict[str, np.ndarray], out: Path, config: dict[str, Any],
          short: str | None = None) -> None:  # fmt: skip
    """One ``model.safetensors`` written by hand (so a header can lie: ``short``'s shape
    claims one row more than its bytes), and config.json."""
    out.mkdir()
    header: dict[str, Any] = {}
    blobs: list[bytes] = []
    pos = 0
    for n in sorted(tensors):
        a = np.ascontiguousarray(tensors[n])
        raw = a.tobytes()
        shape = list(a.shape)
        if n == short:
            shape[0] += 1
        header[n] = {"dtype": _dtype_name(a), "shape": shape, "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    (out / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    (out / "config.json").write_text(json.dumps(config))


def _module(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else name


def mutate(
    tensors: dict[str, np.ndarray], name: str, how: str, members: Callable[[str], int | None]
) -> tuple[dict[str, np.ndarray], str, str | None] | None:
    """(the mutated tensors, the stored name the refusal must name, a name whose header lies)
    for one mutation of ``name``; None where it does not apply. ``members(name)``: the size of
    the family a member-indexed name belongs to, or None."""
    import ml_dtypes

    a = tensors[name]
    out = dict(tensors)
    if how == "dtype":
        out[name] = a.astype(np.float64)
        return out, name, None
    if how == "inexact":
        if a.dtype != ml_dtypes.bfloat16 or a.size == 0:
            return None
        f = a.astype(np.float32)
        f.reshape(-1)[-1] = 0.1  # not a BF16 value
        out[name] = f
        return out, name, None
    if how == "shape":
        pad = np.zeros((*a.shape[:-1], 1), a.dtype) if a.ndim else np.zeros(1, a.dtype)
        out[name] = np.concatenate([a.reshape(a.shape or (1,)), pad], axis=-1)
        return out, name, None
    if how == "missing":
        del out[name]
        return out, name, None
    if how == "extra":
        extra = _module(name) + ".bogus"
        if extra in out:
            return None
        out[extra] = np.zeros(4, np.float32)
        return out, extra, None
    if how == "beyond":
        found = list(INDEX.finditer(name))
        size = members(name)
        if size is None or not found:
            return None
        last = found[-1]
        extra = name[: last.start()] + str(size) + name[last.end() :]
        out[extra] = a
        return out, extra, None
    if how == "truncated":
        if a.ndim == 0:
            return None
        return out, name, name
    raise ValueError(how)


def cases(names: list[str]) -> Iterator[tuple[str, str]]:
    """(stored name, mutation) over every kind's representative."""
    for n in kinds(names).values():
        for how in MUTATIONS:
            yield n, how


# --- the judge ----------------------------------------------------------------------------
def family_words(models: list[str]) -> set[str]:
    """Each family's word (the leading letters of its model name): ``qwen``, ``hunyuan``."""
    return {m.group(0) for k in models if (m := re.match(r"[a-z]+", k)) is not None}


def judge(
    msg: str, want: str, internal: set[str], model: str, words: set[str], blocks: set[str]
) -> str | None:
    """Why ``msg`` fails (None: it passes): one line, naming the stored ``want`` in full, no
    spec-internal name (``internal``: regexes of layer-relative names the checkpoint does not
    store) except beside the stored one (``read as ...``), no other family's word (a block
    name of the family, ``blocks``, is no family's word)."""
    if "\n" in msg:
        return "not one line"
    for n in internal:
        for m in re.finditer(r"(?<![\w.])" + n + r"(?![\w])", msg):
            if not msg[: m.start()].endswith("read as "):
                return f"names the internal {m.group(0)}"
    if want not in msg:
        return f"does not name {want}"
    key = model.replace("-", "")
    for token in re.findall(r"[\w.'-]+", msg):
        if re.search(r"\.\w", token) or "_" in token or token in blocks:
            continue  # a tensor, symbol or block name (``mamba.in_proj.weight``), not prose
        lead = re.match(r"[a-z]+", token.lower())
        if lead is not None and lead.group(0) in words and not key.startswith(lead.group(0)):
            return f"speaks of {token}"
    return None
