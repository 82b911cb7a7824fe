"""Hypothesis over drawn geometries: binding is byte-exact against the source, and any single
corruption is refused with a message naming the layer and the corrupted tensor."""

from __future__ import annotations

import importlib
import re
import tempfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from budget import examples
from helpers import (
    TABLE,
    block_geometries,
    dsa_geometries,
    kda_geometries,
    layer_arrays,
    model_values,
    raw,
    read_file,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from specbind.core.errors import BindError
from specbind.core.planning import Ranks
from specbind.generated import model_glm_5_3_flash as m
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.io.source import DictSource
from specbind.synth import synth

MODULES: dict[str, Any] = {
    b.name: importlib.import_module(f"specbind.generated.{b.name}") for b in TABLE.blocks
}


def reference_bytes(ckpt: Path) -> dict[str, bytes]:
    """Every tensor's bytes as the safetensors library parses them (independent of our reader)."""
    out: dict[str, bytes] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        out |= {name: a.tobytes() for name, a in read_file(f).items()}
    return out


def copied_bytes(module: Any, field: str, pre: str, ref: dict[str, bytes], g: Any) -> bytes:
    """What a verbatim, concat or stack field must hold at tp = ep = 1: its sources' bytes in
    order (a stack: expert by expert, each expert's sources in order)."""
    srcs = module.SOURCES[field]
    rule = module.FIELDS[field]
    if rule.family is None:
        return b"".join(ref[pre + s] for s in srcs)
    n = module.counts(g)[rule.family]
    marker = "{" + rule.family + "}"
    return b"".join(ref[pre + s.replace(marker, str(e))] for e in range(n) for s in srcs)


@settings(max_examples=examples(0.6), deadline=None)
@given(model_values(), st.integers(0, 2**16), st.booleans())
def test_a_synthetic_checkpoint_binds_with_bytes_equal_to_the_source(
    values: dict[str, int], seed: int, nested: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ck = Path(tmp) / "ck"
        synth(TABLE, ck, values, layers=8, seed=seed, nested_config=nested)
        ref = reference_bytes(ck)
        result = bind_checkpoint(CheckpointDir(ck), TABLE, progress=False)
    kinds = [layer.slots["attention"].block for layer in result.layers]
    assert kinds == ["kda", "kda", "kda", "dsa", "kda", "kda", "kda", "dsa", "dsa"]
    geometry = TABLE.make_geometry(TABLE.default_values() | values)
    seen = 0
    for where, slot in result.slots():
        module = MODULES[slot.block]
        g = getattr(m, f"{slot.block}_geometry")(geometry, Ranks())
        rep = slot.report
        assert rep.bound == rep.seen and rep.other == 0
        seen += rep.seen
        pre = "" if where == "globals" else where.rsplit(".", 1)[0] + "."  # layers.{i}.
        for field, arr in slot.weights.arrays().items():
            if module.FIELDS[field].kind == "transform":
                continue  # computed, not copied: see test_transforms.py
            assert arr.tobytes() == copied_bytes(module, field, pre, ref, g), (where, field)
    assert seen == len(ref), "every tensor of the checkpoint was bound"


CORRUPTIONS = ["drop", "unknown", "dtype", "dim"]
BLOCK_GEOMETRIES: dict[str, Any] = {
    "kda": kda_geometries(),
    "dsa": dsa_geometries(),
} | {name: block_geometries(mod) for name, mod in MODULES.items() if name not in ("kda", "dsa")}
FLOATS = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32}


@settings(max_examples=examples(8))
@given(st.data(), st.sampled_from(sorted(MODULES)), st.sampled_from(CORRUPTIONS))
def test_one_corruption_is_refused_naming_the_tensor(
    data: st.DataObject, block: str, how: str
) -> None:
    module = MODULES[block]
    g = data.draw(BLOCK_GEOMETRIES[block], label="geometry")
    arrays = layer_arrays(module, g, seed=data.draw(st.integers(0, 99)))
    tensors = {n: raw(a) for n, a in arrays.items()}
    victim = data.draw(st.sampled_from(sorted(tensors)), label="victim")
    rule = next(
        r for r in module.TENSORS
        if r.name == victim or (r.family and re.fullmatch(
            re.escape(r.name).replace(re.escape("{" + r.family + "}"), r"\d+"), victim))
    )  # fmt: skip
    if how == "drop":
        if rule.tie is not None:
            return  # a tied tensor may be absent: its target binds in its place
        if rule.group is not None and all(
            r.group != rule.group or r.name == rule.name for r in module.TENSORS
        ):
            return  # dropping a one-tensor optional group drops the group, which is allowed
        del tensors[victim]
    elif how == "unknown":
        suffix = data.draw(st.from_regex(r"[a-z][a-z0-9_]{0,12}(\.weight)?", fullmatch=True))
        victim = (module.PREFIX or "") + "extra_" + suffix
        tensors[victim] = raw(np.zeros(2, np.float32))
    elif how == "dtype":
        accepted = {rule.dtype, *rule.stored}
        other = data.draw(st.sampled_from(sorted(set(FLOATS) - accepted)), label="dtype")
        tensors[victim] = raw(arrays[victim].astype(FLOATS[other]))
    else:
        a = arrays[victim]
        if a.ndim == 0:
            return
        axis = data.draw(st.integers(0, a.ndim - 1), label="axis")
        grown = np.concatenate([a, a.take([0], axis=axis)], axis=axis)  # one more along `axis`
        tensors[victim] = raw(grown)
    bind = getattr(module, f"bind_{block}")
    try:
        bind(g, 9, DictSource(tensors))
    except BindError as e:
        assert str(e).startswith("layer 9: ")
        if module.PREFIX or how != "unknown":
            assert victim in str(e)
    else:
        raise AssertionError(f"{how} of {victim} was not refused")
