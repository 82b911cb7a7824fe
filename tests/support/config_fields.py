"""Which config.json fields decide a parameter's shape or presence, per family, measured from
transformers itself (tests/families/test_config_fields.py).

A field is a candidate when the family's modeling code reads it (``config.X`` or
``getattr(config, "X", ...)`` in ``transformers/models/<type>/modeling_<type>.py``) and its
config class writes it; its other value is the flip of the written one (a bool negated, a
whole number + 1). Whether the field decides a parameter is then measured, never listed: the
family's model class is built from the row's config and from the config with the field
flipped, and the two parameter lists (names and shapes) compared. Fields the class refuses
to flip (a size that no longer divides) say nothing and are skipped.

vLLM's constructors (vllm/model_executor/models/*.py) cannot be imported beside transformers
5.23: their side of the review runs in the vLLM venv (tests/vllm/test_vllm_fields.py: every
field whose flip changes the parameters vLLM's class builds is refused). Where vLLM reads a
field otherwise than transformers does, ``VLLM_ONLY`` names it with the engine code and the
layout constraint that holds it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# model -> (field, the engine code that reads it otherwise, the vLLM layout's constraint)
VLLM_ONLY: dict[str, tuple[tuple[str, str, str], ...]] = {
    "falcon": (
        ("ffn_hidden_size", "vllm/model_executor/models/falcon.py FalconMLP: 4 * hidden_size",
         "mlp_four_hidden"),
    ),
}  # fmt: skip


def modeling_reads(model_type: str) -> set[str]:
    """The config fields transformers' modeling file of ``model_type`` reads."""
    import transformers

    root = Path(transformers.__file__).parent / "models" / model_type
    out: set[str] = set()
    for f in root.glob("modeling_*.py"):
        text = f.read_text()
        out |= set(re.findall(r"\bconfig\.(\w+)", text))
        out |= set(re.findall(r"getattr\(\s*config,\s*\"(\w+)\"", text))
    return out


def flipped(value: Any) -> Any:
    """The field's other value, or None where there is no plain one."""
    if type(value) is bool:
        return not value
    if type(value) is int:
        return value + 1
    return None


def parameters(hf_class: str, config_class: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """name -> shape of every parameter the class builds from ``config`` (meta device: no
    memory), or raises what the class raises."""
    import torch
    import transformers

    cfg = getattr(transformers, config_class)(**config)
    with torch.device("meta"):
        model = getattr(transformers, hf_class)(cfg)
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def candidates(
    model_type: str, hf_class: str, config_class: str, config: Mapping[str, Any]
) -> Iterator[tuple[str, Any, Any]]:
    """(field, written value, flipped value) for each candidate field of the family."""
    import transformers

    written = json.loads(getattr(transformers, config_class)(**config).to_json_string())
    for name in sorted(modeling_reads(model_type)):
        if name in written and (other := flipped(written[name])) is not None:
            yield name, written[name], other
