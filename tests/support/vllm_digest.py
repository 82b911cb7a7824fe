"""What tests/support/vllm_scenario.py records of each vLLM rank's model (runs inside vLLM's workers).

A module of its own, not the scenario script: vLLM's tp workers unpickle the function by
module name, and a function of ``__main__`` is not the same object there.
"""

from __future__ import annotations

from typing import Any


def digests(model: Any) -> list[tuple[str, list[int], str, str]]:
    """Every parameter: name, shape, dtype and the SHA-256 of its bytes."""
    import hashlib

    import torch

    out = []
    for name, p in model.named_parameters():
        raw = p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        out.append((name, list(p.shape), str(p.dtype), hashlib.sha256(raw).hexdigest()))
    return out
