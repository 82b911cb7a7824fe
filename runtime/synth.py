"""Write a synthetic GLM-5.3-Flash checkpoint in the Hugging Face layout.

What is written: ``config.json`` (flat ``Glm5NextTextConfig`` fields), shards
``model-0000i-of-0000n.safetensors`` and ``model.safetensors.index.json``, through the
safetensors library. Attention tensors take their names, dtypes and shapes from the generated
block tables, so the synthetic checkpoint follows the specs; the layer schedule is GLM's:
KDA where ``idx % 4 != 3``, DSA otherwise, one DSA-shaped MTP layer after the last, and every
second DSA layer "shared" (no indexer tensors).

Invariants: values are seeded and deterministic; ``A_log`` and ``dt_bias`` are F32 (unless
``gates_bf16`` asks for the broken wholesale cast); the output directory appears whole or not
at all (written beside it, then renamed).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from runtime.binding import Array
from runtime.dtypes import DTYPES
from runtime.errors import SpecbindError
from runtime.model import ModelTable

TINY: dict[str, int] = {
    "hidden": 64,
    "linear_heads": 16,
    "linear_head_dim": 64,
    "linear_conv": 4,
    "heads": 8,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 0,
    "v_head_dim": 16,
    "index_heads": 4,
    "index_head_dim": 16,
    "index_kpool": 4,
}
VOCAB = 256


@dataclass(frozen=True)
class LayerPlan:
    index: int
    block: str
    indexer: bool  # DSA only: full (True) or shared (False)
    mtp: bool = False


def schedule(layers: int, mtp: bool = True) -> list[LayerPlan]:
    out: list[LayerPlan] = []
    dsa_seen = 0
    for i in range(layers):
        if i % 4 != 3:
            out.append(LayerPlan(i, "kda", False))
        else:
            out.append(LayerPlan(i, "dsa", dsa_seen % 2 == 0))
            dsa_seen += 1
    if mtp:
        out.append(LayerPlan(layers, "dsa", True, mtp=True))
    return out


def config_for(
    table: ModelTable[Any], values: dict[str, int], plans: list[LayerPlan]
) -> dict[str, Any]:
    decoder = [p for p in plans if not p.mtp]
    cfg: dict[str, Any] = {
        "architectures": ["Glm5NextTextModel"],
        "model_type": "glm5_next_text",
        "torch_dtype": "bfloat16",
        "vocab_size": VOCAB,
        "num_hidden_layers": len(decoder),
        "num_key_value_heads": values["heads"],
        "num_nextn_predict_layers": len(plans) - len(decoder),
        "layer_types": [
            "linear_attention" if p.block == "kda" else "indexed_attention" for p in decoder
        ],
        "indexer_types": ["full" if p.block == "kda" or p.indexer else "shared" for p in decoder],
        "rms_norm_eps": 1e-5,
    }
    for f in table.geometry_fields:
        if f.config is not None:
            cfg[f.config] = values[f.name]
    return dict(sorted(cfg.items()))


def _values(rng: np.random.Generator, name: str, dtype: str, shape: tuple[int, ...]) -> Array:
    if name.endswith("A_log"):
        arr = np.log(rng.uniform(1.0, 16.0, size=shape)).astype(np.float32)
    elif name.endswith("dt_bias"):
        arr = rng.uniform(-4.0, -1.0, size=shape).astype(np.float32)
    else:
        arr = (rng.standard_normal(size=shape, dtype=np.float32) * 0.02).astype(np.float32)
    np_dtype = DTYPES[dtype].numpy
    assert np_dtype is not None
    return arr.astype(np_dtype)


def layer_tensors(
    table: ModelTable[Any], geometry: Any, plan: LayerPlan, hidden: int, gates_bf16: bool
) -> Iterator[tuple[str, str, tuple[int, ...]]]:
    """(layer-relative name, dtype, shape) of every tensor of one synthetic layer."""
    block = table.block(plan.block)
    shapes = block.shapes(geometry, 1)
    for rule in block.tensors:
        if rule.group == "indexer" and not plan.indexer:
            continue
        dtype = "BF16" if gates_bf16 and rule.dtype == "F32" else rule.dtype
        yield rule.name, dtype, shapes[rule.name]
    yield "input_layernorm.weight", "BF16", (hidden,)
    yield "post_attention_layernorm.weight", "BF16", (hidden,)
    yield "mlp.gate_proj.weight", "BF16", (2 * hidden, hidden)
    if plan.mtp:
        yield "eh_proj.weight", "BF16", (hidden, 2 * hidden)
        yield "enorm.weight", "BF16", (hidden,)
        yield "hnorm.weight", "BF16", (hidden,)


def synth(
    table: ModelTable[Any],
    out: Path,
    values: dict[str, int],
    layers: int = 8,
    seed: int = 0,
    mtp: bool = True,
    shards: int | None = None,
    gates_bf16: bool = False,
    nested_config: bool = False,
) -> dict[str, Any]:
    """Write the checkpoint; return a summary (files, tensors, bytes)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SpecbindError(f"{out}: exists and is not an empty directory; refusing to overwrite")
    if layers < 0 or layers > 4096:
        raise SpecbindError(f"--layers {layers} is out of range (0..4096)")
    full = table.default_values() | values
    geometry = table.make_geometry(full)
    for b in table.blocks:
        b.check(geometry, 1)
    plans = schedule(layers, mtp)
    hidden = full["hidden"]
    entries: list[tuple[str, str, tuple[int, ...]]] = [
        ("embed_tokens.weight", "BF16", (VOCAB, hidden))
    ]
    for p in plans:
        pre = table.layer_pattern.format(index=p.index)
        entries += [
            (pre + n, d, s) for n, d, s in layer_tensors(table, geometry, p, hidden, gates_bf16)
        ]
    entries.append(("norm.weight", "BF16", (hidden,)))
    total = sum(DTYPES[d].nbytes(s) for _, d, s in entries)
    n_shards = shards or max(2, math.ceil(total / (2 << 30)))
    n_shards = max(1, min(n_shards, len(entries)))
    per = math.ceil(len(entries) / n_shards)
    rng = np.random.default_rng(seed)

    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        weight_map: dict[str, str] = {}
        for i in range(n_shards):
            chunk = entries[i * per : (i + 1) * per]
            fn = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
            tensors = {n: _values(rng, n, d, s) for n, d, s in chunk}
            save_file(tensors, str(tmp / fn), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, fn))
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        cfg = config_for(table, full, plans)
        if nested_config:
            cfg = {
                "architectures": ["Glm5NextForConditionalGeneration"],
                "model_type": "glm5_next",
                "text_config": cfg,
            }
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; a checkpoint is an ordinary directory
        for f in tmp.iterdir():
            os.chmod(f, 0o666 & ~umask)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "path": str(out),
        "files": n_shards,
        "tensors": len(entries),
        "bytes": total,
        "layers": [
            {"index": p.index, "block": p.block, "indexer": p.indexer, "mtp": p.mtp} for p in plans
        ],
    }
