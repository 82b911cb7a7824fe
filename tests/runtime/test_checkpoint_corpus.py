"""The malformed-checkpoint corpus: every case is refused with a clear, specific, one-line
error — no crash, no hang, and no allocation sized by what a lying header claims."""

from __future__ import annotations

import json
import os
import resource
import struct
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import patience
import pytest
from helpers import TABLE, TINY, read_file

from specbind.core.errors import SpecbindError
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth

SHARD = "model-00001-of-00002.safetensors"
OTHER = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


def split(raw: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def join(header: Any, data: bytes, length: int | None = None, text: bytes | None = None) -> bytes:
    h = text if text is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def edit_shard(d: Path, fn: Callable[[dict[str, Any], bytes], bytes], name: str = SHARD) -> None:
    header, data = split((d / name).read_bytes())
    (d / name).write_bytes(fn(header, data))


def first_tensor(header: dict[str, Any]) -> str:
    return min(
        (k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0]
    )


def set_entry(key: str, value: Any) -> Callable[[dict[str, Any], bytes], bytes]:
    def fn(h: dict[str, Any], data: bytes) -> bytes:
        h[first_tensor(h)][key] = value
        return join(h, data)

    return fn


def edit_config(d: Path, **changes: Any) -> None:
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def edit_index(d: Path, fn: Callable[[dict[str, Any]], Any]) -> None:
    idx = json.loads((d / INDEX).read_text())
    (d / INDEX).write_text(json.dumps(fn(idx)))


def _offsets(h: dict[str, Any], data: bytes, shift: Callable[[list[int]], list[int]]) -> bytes:
    t = first_tensor(h)
    h[t]["data_offsets"] = shift(h[t]["data_offsets"])
    return join(h, data)


def _two_first(h: dict[str, Any]) -> tuple[str, str]:
    keys = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
    return keys[0], keys[1]


def _overlap(h: dict[str, Any], data: bytes) -> bytes:
    _a, b = _two_first(h)
    h[b]["data_offsets"] = [h[b]["data_offsets"][0] - 2, h[b]["data_offsets"][1] - 2]
    return join(h, data)


def _symlink_escape(d: Path) -> None:
    outside = d.parent / "outside.safetensors"
    os.replace(d / OTHER, outside)
    os.symlink(outside, d / OTHER)


def _duplicate_across_shards(d: Path) -> None:
    h1, d1 = split((d / SHARD).read_bytes())
    h2, d2 = split((d / OTHER).read_bytes())
    t = first_tensor(h1)
    size = h1[t]["data_offsets"][1] - h1[t]["data_offsets"][0]
    end = len(d2)
    h2[t] = {**h1[t], "data_offsets": [end, end + size]}
    (d / OTHER).write_bytes(join(h2, d2 + d1[h1[t]["data_offsets"][0] : h1[t]["data_offsets"][1]]))


def _extra_tensor_not_in_index(d: Path) -> None:
    h2, d2 = split((d / OTHER).read_bytes())
    end = len(d2)
    h2["stray.weight"] = {"dtype": "F32", "shape": [1], "data_offsets": [end, end + 4]}
    (d / OTHER).write_bytes(join(h2, d2 + b"\0" * 4))


def drop(d: Path, needle: str) -> None:
    """Rewrite every shard and the index without the tensors whose names contain ``needle``."""
    from safetensors.numpy import save_file

    idx = json.loads((d / INDEX).read_text())
    for f in sorted(d.glob("*.safetensors")):
        save_file({n: a for n, a in read_file(f).items() if needle not in n}, str(f))
    idx["weight_map"] = {n: f for n, f in idx["weight_map"].items() if needle not in n}
    (d / INDEX).write_text(json.dumps(idx))


def set_indexer_type(d: Path, layer: int, value: str) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg["indexer_types"][layer] = value
    (d / "config.json").write_text(json.dumps(cfg))


CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("truncated_data", lambda d: (d / SHARD).write_bytes((d / SHARD).read_bytes()[:-100]), "(truncated?)"),
    ("truncated_inside_header", lambda d: (d / SHARD).write_bytes((d / SHARD).read_bytes()[:64]), "runs past the end of the file"),
    ("shorter_than_length_prefix", lambda d: (d / SHARD).write_bytes(b"\x01\x02"), "too short for a safetensors header"),
    ("header_length_past_eof", lambda d: edit_shard(d, lambda h, x: join(h, x, length=10**7)), "runs past the end of the file"),
    ("header_over_the_cap", lambda d: edit_shard(d, lambda h, x: join(h, x, length=1 << 40)), "over the 104857600 B cap"),
    ("header_not_utf8", lambda d: edit_shard(d, lambda h, x: join(h, x, text=b'{"\xff\xfe": 1}')), "header is not UTF-8"),
    ("header_not_json", lambda d: edit_shard(d, lambda h, x: join(h, x, text=b"{not json")), "header is not valid JSON"),
    ("header_is_a_list", lambda d: edit_shard(d, lambda h, x: join(h, x, text=b"[1, 2, 3]")), "header is a JSON list, not an object"),
    ("header_nested_too_deeply", lambda d: edit_shard(d, lambda h, x: join(h, x, text=b"[" * 100000 + b"]" * 100000)), "header is not valid JSON"),
    ("header_duplicate_key", lambda d: edit_shard(d, lambda h, x: join(h, x, text=b'{"a": {}, "a": {}}')), "duplicate key 'a'"),
    ("metadata_not_strings", lambda d: edit_shard(d, lambda h, x: join({**h, "__metadata__": {"format": 1}}, x)), "__metadata__ must map strings to strings"),
    ("entry_without_offsets", lambda d: edit_shard(d, lambda h, x: join({k: ({kk: vv for kk, vv in v.items() if kk != "data_offsets"} if k == first_tensor(h) else v) for k, v in h.items()}, x)), "must be an object with dtype, shape and data_offsets"),
    ("unknown_dtype", lambda d: edit_shard(d, set_entry("dtype", "Q4_K")), "unknown dtype 'Q4_K'"),
    ("negative_dimension", lambda d: edit_shard(d, set_entry("shape", [-1, 4])), "is not a list of non-negative integers"),
    ("shape_not_a_list", lambda d: edit_shard(d, set_entry("shape", "64x64")), "is not a list of non-negative integers"),
    ("offsets_not_a_pair", lambda d: edit_shard(d, set_entry("data_offsets", [0, 1.5])), "is not [begin, end]"),
    ("offsets_reversed", lambda d: edit_shard(d, lambda h, x: _offsets(h, x, lambda o: [o[1], o[0]])), "data_offsets reversed"),
    ("offsets_overlap", lambda d: edit_shard(d, _overlap), "overlaps the previous one"),
    ("offsets_leave_a_hole", lambda d: edit_shard(d, lambda h, x: join({**h, "pad": {"dtype": "U8", "shape": [4], "data_offsets": [len(x) + 4, len(x) + 8]}}, x + b"\0" * 8)), "hole of 4 B"),
    ("offsets_out_of_bounds", lambda d: edit_shard(d, lambda h, x: join({**h, "far": {"dtype": "U8", "shape": [4], "data_offsets": [len(x), len(x) + 4]}}, x)), "(truncated?)"),
    ("shape_times_dtype_is_not_the_bytes", lambda d: edit_shard(d, set_entry("dtype", "F64")), "on disk, but F64"),
    ("trailing_bytes", lambda d: edit_shard(d, lambda h, x: join(h, x + b"junk")), "4 B of trailing data"),
    ("lying_huge_shape", lambda d: edit_shard(d, lambda h, x: join({**h, "huge": {"dtype": "F32", "shape": [1 << 40], "data_offsets": [len(x), len(x) + (1 << 42)]}}, x)), "(truncated?)"),
    ("index_not_json", lambda d: (d / INDEX).write_text("{"), "not valid JSON"),
    ("index_without_weight_map", lambda d: (d / INDEX).write_text("{}"), "must be an object with a weight_map object"),
    ("index_names_a_missing_file", lambda d: edit_index(d, lambda i: {**i, "weight_map": {**i["weight_map"], "x": "nope.safetensors"}}), "'x' -> 'nope.safetensors': no such file"),
    ("index_path_with_dotdot", lambda d: edit_index(d, lambda i: {**i, "weight_map": {k: ("../" + v if v == OTHER else v) for k, v in i["weight_map"].items()}}), "points outside the checkpoint directory"),
    ("index_absolute_path", lambda d: edit_index(d, lambda i: {**i, "weight_map": {k: ("/etc/hostname" if v == OTHER else v) for k, v in i["weight_map"].items()}}), "points outside the checkpoint directory"),
    ("index_file_name_not_a_string", lambda d: edit_index(d, lambda i: {**i, "weight_map": {**i["weight_map"], "x": 7}}), "weight_map['x'] is not a file name"),
    ("symlink_escapes_the_directory", _symlink_escape, "resolves outside the checkpoint directory"),
    ("same_tensor_in_two_shards", _duplicate_across_shards, "is in both"),
    ("shard_tensor_missing_from_index", _extra_tensor_not_in_index, "tensor 'stray.weight' is not in model.safetensors.index.json"),
    ("index_maps_to_a_shard_without_it", lambda d: edit_index(d, lambda i: {**i, "weight_map": {k: (OTHER if v == SHARD else v) for k, v in i["weight_map"].items()}}), "which does not hold it"),
    ("no_weights_at_all", lambda d: [p.unlink() for p in d.glob("*.safetensors*")], "no model.safetensors and no model.safetensors.index.json"),
    ("config_missing", lambda d: (d / "config.json").unlink(), "no config.json"),
    ("config_not_json", lambda d: (d / "config.json").write_text("{,}"), "config.json: not valid JSON"),
    ("config_missing_a_field", lambda d: edit_config(d, linear_num_heads=None), "missing field 'linear_num_heads'"),
    ("config_field_is_a_string", lambda d: edit_config(d, hidden_size="64"), "hidden_size is '64' (str), expected an integer"),
    ("config_field_is_a_bool", lambda d: edit_config(d, num_attention_heads=True), "num_attention_heads is True (bool), expected an integer"),
    ("config_field_is_a_float", lambda d: edit_config(d, kv_lora_rank=16.0), "kv_lora_rank is 16.0 (float), expected an integer"),
    ("config_text_config_not_an_object", lambda d: edit_config(d, text_config=[1]), "text_config is list, not an object"),
    ("config_zero_dimension", lambda d: edit_config(d, hidden_size=0), "hidden = 0 is below its minimum 1"),
    ("full_dsa_layer_without_its_indexer", lambda d: drop(d, "layers.3.self_attn.indexer."), "layer 3: config.json indexer_types[3] is 'full', but the layer has no indexer tensors"),
    ("shared_dsa_layer_with_an_indexer", lambda d: set_indexer_type(d, 3, "shared"), "layer 3: config.json indexer_types[3] is 'shared', but the layer carries indexer tensors"),
    ("indexer_type_unknown", lambda d: set_indexer_type(d, 3, "half"), "indexer_types[3] is 'half', expected one of 'full', 'shared'"),
    ("config_disagrees_with_the_tensors", lambda d: edit_config(d, hidden_size=48), "has shape [1024, 72], expected [1024, 48]"),
]  # fmt: skip


@pytest.fixture
def good(tmp_path: Path) -> Path:
    d = tmp_path / "ck"
    synth(TABLE, d, dict(TINY), layers=4, seed=1, mtp=False, shards=2)
    return d


def test_the_corpus_has_at_least_thirty_malformed_checkpoints() -> None:
    assert len(CASES) >= 30


def test_the_unmodified_checkpoint_binds(good: Path) -> None:
    assert len(bind_checkpoint(CheckpointDir(good), TABLE, progress=False).layers) == 4


@pytest.mark.parametrize(("name", "corrupt", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_a_malformed_checkpoint_is_refused_with_a_specific_error(
    good: Path, name: str, corrupt: Callable[[Path], None], fragment: str
) -> None:
    corrupt(good)
    tracemalloc.start()
    try:
        with pytest.raises(SpecbindError) as e:
            bind_checkpoint(CheckpointDir(good), TABLE, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fragment in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert peak < 64 << 20, f"{name}: {peak} B allocated while refusing"


LYING = [
    "header_length_past_eof",
    "header_over_the_cap",
    "lying_huge_shape",
    "header_nested_too_deeply",
]


@pytest.mark.parametrize("name", LYING)
def test_the_cli_refuses_a_lying_header_in_one_line_within_a_memory_limit(
    good: Path, name: str
) -> None:
    _, corrupt, fragment = next(c for c in CASES if c[0] == name)
    corrupt(good)

    def limit() -> None:  # 1 GiB of address space: a claimed 4 TiB tensor cannot be allocated
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    proc = patience.run([sys.executable, "-m", "specbind", "bind", str(good)], capture_output=True,
                        text=True, cpu=60, preexec_fn=limit)  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # refused: the checkpoint is wrong
    assert proc.stderr.count("\n") == 1 and fragment in proc.stderr
