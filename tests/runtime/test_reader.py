"""The checkpoint reader: strict headers, a safe index, config.json geometry."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers import TABLE
from safetensors.numpy import save_file

from specbind.core.errors import CheckpointError
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.io.safetensors_file import MAX_HEADER_BYTES, SafetensorsFile
from specbind.runtime.layout.config import values_from_config


def write_raw(
    path: Path, header: dict[str, Any], data: bytes, *, length: int | None = None
) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_a_file_written_by_the_safetensors_library_reads_back_verbatim(tmp_path: Path) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.linspace(-1, 1, 4, dtype=np.float32).astype(ml_dtypes.bfloat16)
    save_file({"a": a, "b": b}, str(tmp_path / "x.safetensors"), metadata={"k": "v"})
    f = SafetensorsFile(tmp_path / "x.safetensors")
    assert f.metadata == {"k": "v"}
    ra, rb = f.raw("a"), f.raw("b")
    assert (ra.dtype, ra.shape, bytes(ra.data)) == ("F32", (2, 3), a.tobytes())
    assert (rb.dtype, rb.shape, bytes(rb.data)) == ("BF16", (4,), b.tobytes())


@pytest.mark.parametrize(
    ("header", "data", "length", "fragment"),
    [
        ({"a": entry("F32", [2], 0, 8)}, b"\0" * 4, None, "truncated"),
        ({"a": entry("F32", [2], 0, 8)}, b"\0" * 8, 10**6, "runs past the end of the file"),
        ({"a": entry("F32", [2], 0, 8)}, b"\0" * 8, MAX_HEADER_BYTES + 1, "over the"),
        ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [1], 4, 8)}, b"\0" * 8, None, "overlaps"),
        ({"a": entry("F32", [1], 4, 8)}, b"\0" * 8, None, "hole of 4 B"),
        ({"a": entry("F32", [1], 8, 4)}, b"\0" * 8, None, "reversed"),
        ({"a": entry("Q4_K", [1], 0, 4)}, b"\0" * 4, None, "unknown dtype"),
        ({"a": entry("F32", [3], 0, 8)}, b"\0" * 8, None, r"8 B on disk, but F32 x \[3\] is 12 B"),
        ({"a": entry("F32", [-1], 0, 8)}, b"\0" * 8, None, "not a list of non-negative"),
        ({"a": entry("F32", [2], 0, 8)}, b"\0" * 12, None, "trailing data"),
        ({"__metadata__": {"k": 1}}, b"", None, "__metadata__"),
        ({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, None, "data_offsets"),
    ],
)
def test_a_malformed_header_is_refused_with_a_clear_reason(
    tmp_path: Path, header: dict[str, Any], data: bytes, length: int | None, fragment: str
) -> None:
    p = write_raw(tmp_path / "bad.safetensors", header, data, length=length)
    with pytest.raises(CheckpointError, match=fragment):
        SafetensorsFile(p)


def test_a_header_that_is_not_json_or_not_utf8_or_not_an_object_is_refused(tmp_path: Path) -> None:
    for raw, fragment in [(b"\xff\xfe", "not UTF-8"), (b"{nope", "not valid JSON"), (b"[1, 2]", "not an object"),
                          (b'{"a": 1, "a": 2}', "duplicate key")]:  # fmt: skip
        p = tmp_path / "x.safetensors"
        p.write_bytes(struct.pack("<Q", len(raw)) + raw)
        with pytest.raises(CheckpointError, match=fragment):
            SafetensorsFile(p)


def test_a_file_shorter_than_the_length_prefix_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"\1\2\3")
    with pytest.raises(CheckpointError, match="too short"):
        SafetensorsFile(p)


def _sharded(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    save_file({"a": np.zeros(2, np.float32)}, str(d / "s1.safetensors"))
    save_file({"b": np.ones(2, np.float32)}, str(d / "s2.safetensors"))
    return d


def _index(d: Path, weight_map: dict[str, str]) -> None:
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_a_sharded_checkpoint_reads_through_its_index(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    _index(d, {"a": "s1.safetensors", "b": "s2.safetensors"})
    ck = CheckpointDir(d)
    assert sorted(ck.names()) == ["a", "b"]
    t = ck.get("b")
    assert t is not None and bytes(t.data) == np.ones(2, np.float32).tobytes()


@pytest.mark.parametrize(
    ("weight_map", "fragment"),
    [
        ({"a": "../s1.safetensors", "b": "s2.safetensors"}, "points outside"),
        ({"a": "/etc/passwd", "b": "s2.safetensors"}, "points outside"),
        ({"a": "s1.safetensors", "b": "missing.safetensors"}, "no such file"),
        (
            {"a": "s2.safetensors", "b": "s2.safetensors"},
            "'a' maps to s2.safetensors, which does not hold it",
        ),
        ({"a": "s1.safetensors", "b": "s2.safetensors", "c": "s1.safetensors"}, "does not hold it"),
    ],
)
def test_an_unsafe_or_inconsistent_index_is_refused(
    tmp_path: Path, weight_map: dict[str, str], fragment: str
) -> None:
    d = _sharded(tmp_path)
    _index(d, weight_map)
    with pytest.raises(CheckpointError, match=fragment):
        CheckpointDir(d)


def test_a_shard_tensor_missing_from_the_index_is_refused_not_ignored(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    save_file(
        {"a": np.zeros(2, np.float32), "c": np.zeros(1, np.float32)}, str(d / "s1.safetensors")
    )
    _index(d, {"a": "s1.safetensors", "b": "s2.safetensors"})
    with pytest.raises(
        CheckpointError,
        match=re.escape("s1.safetensors: tensor 'c' is not in model.safetensors.index.json"),
    ):
        CheckpointDir(d)


def test_a_shard_file_the_index_never_names_is_reported(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    _index(d, {"a": "s1.safetensors"})
    assert CheckpointDir(d).unindexed_files() == ["s2.safetensors"]


def test_a_symlinked_shard_that_escapes_the_directory_is_refused(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    outside = tmp_path / "elsewhere.safetensors"
    (d / "s2.safetensors").rename(outside)
    os.symlink(outside, d / "s2.safetensors")
    _index(d, {"a": "s1.safetensors", "b": "s2.safetensors"})
    with pytest.raises(CheckpointError, match="resolves outside"):
        CheckpointDir(d)


def test_the_same_tensor_in_two_shards_is_refused(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    save_file({"a": np.zeros(2, np.float32)}, str(d / "s2.safetensors"))
    _index(d, {"a": "s1.safetensors"})
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "s1.safetensors", "x": "s2.safetensors"}})
    )
    with pytest.raises(
        CheckpointError, match=re.escape("'a' is in both s2.safetensors and s1.safetensors")
    ):
        CheckpointDir(d)


def test_an_index_mapping_a_tensor_to_the_wrong_shard_says_which_shard_stores_it(
    tmp_path: Path,
) -> None:
    d = _sharded(tmp_path)
    _index(d, {"a": "s2.safetensors", "b": "s1.safetensors"})  # each in the other's shard
    with pytest.raises(
        CheckpointError,
        match="^"
        + re.escape(
            "model.safetensors.index.json: maps 'a' to s2.safetensors, but it is stored in "
            "s1.safetensors"
        )
        + "$",
    ):
        CheckpointDir(d)


def test_a_missing_checkpoint_is_no_such_directory_and_a_file_is_not_a_directory(
    tmp_path: Path,
) -> None:
    with pytest.raises(CheckpointError, match=re.escape(f"{tmp_path / 'nope'}: no such directory")):
        CheckpointDir(tmp_path / "nope")
    (tmp_path / "file").write_text("{}")
    with pytest.raises(CheckpointError, match=re.escape(f"{tmp_path / 'file'}: not a directory")):
        CheckpointDir(tmp_path / "file")


def test_a_directory_without_weights_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        CheckpointError, match=re.escape("no model.safetensors and no model.safetensors.index.json")
    ):
        CheckpointDir(tmp_path)


def _config() -> dict[str, Any]:
    return {f.config: f.value for f in TABLE.geometry_fields if f.config}


def test_geometry_comes_from_flat_or_nested_config_fields() -> None:
    flat = values_from_config(TABLE, _config())
    nested = values_from_config(TABLE, {"model_type": "glm5_next", "text_config": _config()})
    assert flat == nested == TABLE.default_values()


def test_a_missing_config_field_is_named() -> None:
    cfg = _config()
    del cfg["linear_num_heads"]
    with pytest.raises(CheckpointError, match=r"missing field 'linear_num_heads'.*linear_heads"):
        values_from_config(TABLE, cfg)


@pytest.mark.parametrize("bad", ["64", 64.0, True, None, [64]])
def test_a_config_field_of_the_wrong_type_is_refused(bad: object) -> None:
    cfg = _config() | {"num_attention_heads": bad}
    with pytest.raises(CheckpointError, match=r"num_attention_heads is .* expected an integer"):
        values_from_config(TABLE, cfg)


def test_a_zero_dimension_in_config_is_refused() -> None:
    with pytest.raises(Exception, match="hidden = 0 is below its minimum 1"):
        values_from_config(TABLE, _config() | {"hidden_size": 0})
