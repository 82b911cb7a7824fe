"""What the vLLM proofs and scenarios record of each vLLM rank's model (runs inside vLLM's
workers): every parameter and every buffer, by name, shape, dtype and the SHA-256 of its bytes.

Buffers too: a buffer can be a view of a parameter's storage that the forward reads instead of
the parameter (vLLM's ``MambaMixer2`` registers ``conv_weights`` over ``conv1d.weight``), so
parameters equal under two loaders do not prove the buffers are.

A module of its own, not the scenario script: vLLM's tp workers unpickle the function by
module name, and a function of ``__main__`` is not the same object there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def _rows(named: Iterable[tuple[str, Any]]) -> list[tuple[str, list[int], str, str]]:
    import hashlib

    import torch

    out = []
    for name, t in named:
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        out.append((name, list(t.shape), str(t.dtype), hashlib.sha256(raw).hexdigest()))
    return out


def digests(model: Any) -> list[tuple[str, list[int], str, str]]:
    """Every parameter: name, shape, dtype and the SHA-256 of its bytes."""
    return _rows(model.named_parameters())


def buffer_digests(model: Any) -> list[tuple[str, list[int], str, str]]:
    """Every buffer (``named_buffers``), as ``digests`` records a parameter."""
    return _rows(model.named_buffers())
