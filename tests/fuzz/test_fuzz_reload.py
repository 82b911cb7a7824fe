"""Fuzzing the reload readers: a bound file's metadata with one field broken (a value that is
no count, a JSON field edited at one path, a key removed) decoded by ``bound_format.decode``;
and whole ``--out`` files, plain and quantized, with one metadata field or one tensor entry
broken, loaded by ``read_bound`` as ``open_bound`` and ``bind --from`` load them. Only
specbind's own errors may come out, in one line; a file accepted reads back in bounds.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from fuzz_docs import ANY, DELETE, HOSTILE, VALUES, edited, paths
from fuzz_tally import planned, tally
from helpers import FULL_META
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specbind.cli import main
from specbind.core.errors import SpecbindError
from specbind.generated import MODELS, SPECS_SHA256
from specbind.runtime.bound.bound_format import decode
from specbind.runtime.bound.reload import read_bound

RELOAD = "reload metadata"

FULL = FULL_META.encode()
KEYS = st.sampled_from([*sorted(FULL), "unknown"])
JSON_KEYS = ("geometry", "overrides", "layers", "quant")
COUNTS = st.sampled_from(
    ["0", "1", "-1", "+1", " 1", "01", "1.0", "1e3", "٣", "²", "", str(2**64), "9" * 5000]
)  # fmt: skip
NAMEISH = st.sampled_from(
    sorted({b.name for t in MODELS.values() for b in t.blocks}
           | {s.name for t in MODELS.values() for s in t.slots}
           | {"decoder", "mtp", "swizzled", "dequantized", "nvfp4-modelopt", "0", "07"})
)  # fmt: skip
LEAVES = NAMEISH | VALUES
META_EDITS = st.sampled_from(["text", "json", "json", "count", "delete"])


@st.composite
def broken_meta(draw: st.DrawFn, base: dict[str, str]) -> dict[str, str]:
    """``base`` with one key removed or set to a hostile text, a count that is none, or its
    JSON edited at one path (a leaf set to a name of the specs or a hostile value)."""
    meta = dict(base)
    key = draw(KEYS)
    how = draw(META_EDITS)
    if how == "delete":
        meta.pop(key, None)
    elif how == "json" and key in JSON_KEYS and key in meta:
        doc = json.loads(meta[key])
        candidates = paths(doc)
        path = candidates[draw(ANY) % len(candidates)]
        value = DELETE if draw(ANY) % 5 == 0 else draw(LEAVES)
        meta[key] = json.dumps(edited(doc, path, value))
    elif how == "count":
        meta[key] = draw(COUNTS)
    else:
        meta[key] = draw(HOSTILE)
    return meta


@settings(max_examples=planned(RELOAD, 25))
@given(broken_meta(FULL))
@example(FULL | {"tensors": "9" * 5000})  # int() refuses over 4,300 digits
@example(FULL | {"layers": "[" * 100_000})  # json.loads: RecursionError
def test_metadata_with_one_field_broken_decodes_or_raises_only_specbind_errors(
    meta: dict[str, str],
) -> None:
    tally(RELOAD)
    try:
        decoded = decode(meta, "f")
    except SpecbindError as e:
        assert "\n" not in str(e), str(e)
        return
    assert decode(decoded.encode(), "f") == decoded  # what is accepted is a record


# Whole bound files: a tiny DeepSeek-V3.2 rank (tp 2, ep 2), plain and NVFP4-quantized, with
# one thing broken in the header; the data is left as it is.
def bound_file(root: Path, name: str, synth: list[str]) -> tuple[dict[str, Any], bytes]:
    ck, out = root / name, root / f"{name}.safetensors"
    tiny = ["--model", "deepseek-v3.2", "--layers", "1", "--set", "hidden=64"]
    assert main(["synth", str(ck), *tiny, *synth]) == 0
    argv = ["--tp-size", "2", "--tp-rank", "0", "--ep-size", "2", "--ep-rank", "0"]
    assert main(["bind", str(ck), *argv, "--out", str(out)]) == 0
    raw = out.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


@pytest.fixture(scope="module")
def bound(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], bytes]]:
    root = tmp_path_factory.mktemp("fuzz-reload")
    quant = ["--quant", "nvfp4-compressed-tensors", "--set", "intermediate=96",
             "--set", "q_lora_rank=32"]  # fmt: skip
    return {"plain": bound_file(root, "plain", []), "quant": bound_file(root, "quant", quant)}


ENTRY_EDITS = st.sampled_from(["rename", "dtype", "shape", "swap", "drop"])
DTYPE_TWINS = {"BF16": "F16", "F16": "BF16", "U8": "F8_E4M3", "F8_E4M3": "U8", "F32": "I32"}
RENAMES = st.sampled_from(
    ["globals.nope", "layers.0.attention.nope", "layers.1.mlp.down", "layers.0.nope.x",
     "layers.07.mlp.down", "layers.0.mlp.down_weight_scale", "layers.0.mlp.gate_up_packed",
     "layers.0.attention", "__metadata__x", ""]
)  # fmt: skip


@st.composite
def broken_headers(draw: st.DrawFn, header: dict[str, Any]) -> dict[str, Any]:
    """A bound file's header, one metadata field broken (``broken_meta``) or one entry: renamed,
    given a dtype of the same width, reshaped to the same size, two entries' places swapped,
    or an entry dropped (its bytes left as a hole)."""
    header = dict(header)
    if draw(st.booleans()):
        header["__metadata__"] = draw(broken_meta(header["__metadata__"]))
        return header
    names = sorted(k for k in header if k != "__metadata__")
    name = names[draw(ANY) % len(names)]
    e = dict(header[name])
    how = draw(ENTRY_EDITS)
    if how == "rename":
        header[draw(RENAMES)] = header.pop(name)
    elif how == "dtype":
        header[name] = e | {"dtype": DTYPE_TWINS.get(e["dtype"], e["dtype"])}
    elif how == "shape":
        flat = [math.prod(e["shape"])]
        header[name] = e | {"shape": [*reversed(e["shape"])] if draw(ANY) % 2 else flat}
    elif how == "swap":
        other = names[draw(ANY) % len(names)]
        header[name], header[other] = header[other], e
    else:
        del header[name]
    return header  # fmt: skip


@settings(max_examples=planned(RELOAD, 13))
@given(st.sampled_from(["plain", "quant"]), st.data())
def test_bound_files_with_one_thing_broken_load_or_raise_only_specbind_errors(
    bound: dict[str, tuple[dict[str, Any], bytes]],
    tmp_path_factory: pytest.TempPathFactory,
    kind: str,
    data: st.DataObject,
) -> None:
    header, payload = bound[kind]
    broken = data.draw(broken_headers(header))
    tally(RELOAD)  # after the draw: a draw that overruns ends the example before it runs
    raw = json.dumps(broken).encode()
    path = tmp_path_factory.getbasetemp() / "fuzz-reload-case.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + payload)
    try:
        f = read_bound(path, models=MODELS, specs_sha256=SPECS_SHA256)
    except SpecbindError as e:
        assert "\n" not in str(e), str(e)
        return
    assert sum(a.nbytes for a in f.tensors.values()) == len(payload)
