"""Hypothesis over drawn geometries: binding is byte-exact against the source, and any single
corruption is refused with a message naming the layer and the corrupted tensor."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from helpers import (
    TABLE,
    dsa_geometries,
    kda_geometries,
    layer_arrays,
    model_values,
    raw,
    read_file,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import BindError
from generated import dsa, kda
from runtime.bind import bind_checkpoint
from runtime.checkpoint import Checkpoint
from runtime.source import DictSource
from runtime.synth import synth

MODULES: dict[str, Any] = {"kda": kda, "dsa": dsa}


def reference_bytes(ckpt: Path) -> dict[str, bytes]:
    """Every tensor's bytes as the safetensors library parses them (independent of our reader)."""
    out: dict[str, bytes] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        out |= {name: a.tobytes() for name, a in read_file(f).items()}
    return out


@settings(max_examples=200)
@given(model_values(), st.integers(0, 2**16), st.booleans())
def test_a_synthetic_checkpoint_binds_with_bytes_equal_to_the_source(
    values: dict[str, int], seed: int, nested: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ck = Path(tmp) / "ck"
        synth(TABLE, ck, values, layers=8, seed=seed, nested_config=nested)
        ref = reference_bytes(ck)
        result = bind_checkpoint(Checkpoint(ck), TABLE, progress=False)
    kinds = [layer.kind for layer in result.layers]
    assert kinds == ["kda", "kda", "kda", "dsa", "kda", "kda", "kda", "dsa", "dsa"]
    for layer in result.layers:
        rep, module = layer.report, MODULES[layer.kind]
        assert rep.bound == rep.self_attn_seen and rep.unknown_self_attn == []
        pre = f"layers.{layer.index}."
        for field, arr in layer.weights.arrays().items():
            if module.FIELDS[field].kind == "transform":
                continue  # computed, not copied: see test_transforms.py
            want = b"".join(ref[pre + src] for src in module.SOURCES[field])
            assert arr.tobytes() == want, (layer.index, field)
        assert rep.bytes == sum(
            len(ref[pre + r.name]) for r in module.TENSORS if pre + r.name in ref
        )


CORRUPTIONS = ["drop", "unknown", "dtype", "dim"]


@settings(max_examples=800)
@given(st.data(), st.sampled_from(sorted(MODULES)), st.sampled_from(CORRUPTIONS))
def test_one_corruption_is_refused_naming_the_tensor(
    data: st.DataObject, block: str, how: str
) -> None:
    module = MODULES[block]
    g = data.draw(kda_geometries() if block == "kda" else dsa_geometries(), label="geometry")
    arrays = layer_arrays(module, g, seed=data.draw(st.integers(0, 99)))
    tensors = {n: raw(a) for n, a in arrays.items()}
    victim = data.draw(st.sampled_from(sorted(tensors)), label="victim")
    if how == "drop":
        del tensors[victim]
    elif how == "unknown":
        suffix = data.draw(st.from_regex(r"[a-z][a-z0-9_]{0,12}(\.weight)?", fullmatch=True))
        victim = "self_attn.extra_" + suffix
        tensors[victim] = raw(np.zeros(2, np.float32))
    elif how == "dtype":
        a = arrays[victim]
        other = np.float32 if a.dtype == ml_dtypes.bfloat16 else ml_dtypes.bfloat16
        tensors[victim] = raw(a.astype(other))
    else:
        a = arrays[victim]
        axis = data.draw(st.integers(0, a.ndim - 1), label="axis")
        grown = np.concatenate([a, a.take([0], axis=axis)], axis=axis)  # one more along `axis`
        tensors[victim] = raw(grown)
    bind = getattr(module, f"bind_{block}")
    try:
        bind(g, 9, DictSource(tensors))
    except BindError as e:
        assert str(e).startswith("layer 9: ")
        assert victim in str(e)
    else:
        raise AssertionError(f"{how} of {victim} was not refused")
