"""The hub's MTP layer added to a checkpoint transformers wrote (transformers saves none).

DeepSeek-V3/V3.2 hub checkpoints carry ``model.layers.{L}.*`` after the L decoder layers: a
decoder layer's attention, MoE MLP and norms, plus ``enorm``, ``hnorm``, ``eh_proj``,
``shared_head.norm``, and their own copies of the embedding and LM head (``embed_tokens``,
``shared_head.head``), as vLLM's DeepSeekMTP loads them. This writes such a layer: the decoder
part shaped as the last decoder layer, every value seeded N(0, 0.05) anew (no copied bytes),
each tensor in its neighbour's dtype.
"""

from __future__ import annotations

import json
from pathlib import Path


def add_mtp_layer(path: Path, seed: int = 1, vocab_copies: bool = True) -> dict[str, object]:
    """Append the MTP layer to ``path``'s single ``model.safetensors``; return its tensors."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((path / "config.json").read_text())
    layers, hidden, vocab = (
        config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]
    )  # fmt: skip
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    gen = torch.Generator().manual_seed(seed)

    def rand(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, dtype=torch.float32) * 0.05).to(dtype)

    last, mtp = f"model.layers.{layers - 1}.", f"model.layers.{layers}."
    added = {
        mtp + n[len(last) :]: rand(tuple(t.shape), t.dtype)
        for n, t in sorted(tensors.items())
        if n.startswith(last)
    }
    bf16 = torch.bfloat16
    extras = {"enorm.weight": (hidden,), "hnorm.weight": (hidden,),
              "eh_proj.weight": (hidden, 2 * hidden), "shared_head.norm.weight": (hidden,)}  # fmt: skip
    if vocab_copies:
        extras |= {
            "embed_tokens.weight": (vocab, hidden),
            "shared_head.head.weight": (vocab, hidden),
        }
    added |= {mtp + n: rand(shape, bf16) for n, shape in extras.items()}
    save_file(tensors | added, str(file), metadata={"format": "pt"})
    return dict(added)
