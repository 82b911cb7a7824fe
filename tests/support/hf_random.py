"""A transformers model filled with seeded random weights and saved, then loaded back in
float64: the fixture behind the model-family tests (``kimi_model``, ``deepseek_model``).

Trap: ``from_pretrained`` with ``dtype="auto"`` would turn the F32 tensors into BF16; loading
in float64 keeps every stored value exactly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


def write_random(
    model_cls: Any, config_cls: Any, config: dict[str, Any], path: Path, f32: re.Pattern[str],
    seed: int = 0,
) -> None:  # fmt: skip
    """Every parameter (and the routers' correction-bias buffers) random, BF16 unless its
    in-memory name matches ``f32``; then ``save_pretrained``, which writes the hub names."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    model = model_cls(config_cls(**config))
    with torch.no_grad():
        items = list(model.named_parameters())
        items += [(n, b) for n, b in model.named_buffers() if n.endswith("correction_bias")]
        for name, t in items:
            v = torch.randn(t.shape, generator=gen, dtype=torch.float32) * 0.05
            t.data = v if f32.fullmatch(name) else v.to(torch.bfloat16)
    model.save_pretrained(path)


def load_f64(model_cls: Any, path: Path) -> Any:
    """The checkpoint as transformers loads it, in float64 (every stored value exactly)."""
    import torch

    return model_cls.from_pretrained(path, dtype=torch.float64).eval()
