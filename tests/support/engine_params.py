"""Engine parameters for the fill tests: torch BF16 parameters shaped like the bound fields,
their bits as NumPy, and the tiny synth Llama they are bound from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def tiny_llama(factory: pytest.TempPathFactory, name: str) -> Path:
    """specbind's synth Llama (vocab 112, which vLLM pads to 128) in a folder of its own."""
    from specbind.cli import main

    ckpt = factory.mktemp(name) / "ckpt"
    assert main(["synth", "--model", "llama", str(ckpt)]) == 0
    return ckpt


def params_for(fields: dict[str, Any]) -> dict[str, Any]:
    """A zeroed BF16 torch parameter of each field's shape, by the field's name."""
    import torch

    return {
        n: torch.nn.Parameter(torch.zeros(f.array.shape, dtype=torch.bfloat16), False)
        for n, f in fields.items()
    }


def bits(t: Any) -> Any:
    """A BF16 tensor's bits as NumPy ``int16`` (compared exactly)."""
    import torch

    return t.detach().view(torch.int16).numpy()


def copied_params(ckpt: Path, tp: int, rank: int) -> dict[str, Any]:
    """The vLLM parameters of ``ckpt``'s tp rank as a plain copying ``fill`` leaves them: what
    every other way of filling them must equal, bit for bit."""
    from specbind.engine import bind_for_engine, fill

    fields = bind_for_engine(ckpt, "vllm", tp_size=tp, tp_rank=rank)
    want = params_for(fields)
    fill("vllm", want, fields)
    return want
