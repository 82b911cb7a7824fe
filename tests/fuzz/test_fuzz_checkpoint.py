"""Fuzzing the checkpoint readers: the safetensors header (arbitrary bytes, lying headers, and
valid headers with one thing broken) and the sharded directory (``model.safetensors.index.json``
with one entry broken, beside its shards, a ``config.json`` and an ``hf_quant_config.json``).
Only ``CheckpointError`` may come out, in one line; whatever is accepted reads back in bounds.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
from fuzz_docs import ANY, HOSTILE, VALUES
from fuzz_tally import planned, tally
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specbind.core.dtypes import DTYPES
from specbind.core.errors import CheckpointError
from specbind.runtime.io.checkpoint import INDEX, CheckpointDir
from specbind.runtime.io.safetensors_file import SafetensorsFile, parse_header

HEADER = "safetensors header"


@settings(max_examples=planned(HEADER, 10))
@given(st.binary(max_size=512), st.integers(0, 1 << 20))
def test_arbitrary_header_bytes_raise_only_checkpoint_errors(raw: bytes, data_len: int) -> None:
    tally(HEADER)
    check_header(raw, data_len)


entry = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["F32", "BF16", "U8", "F8_E4M3", "F4", "X9", 3]),
        "shape": st.lists(st.integers(-2, 40), max_size=3) | st.just("4"),
        "data_offsets": st.lists(st.integers(-4, 600), min_size=0, max_size=3),
    }
)
headers = st.dictionaries(st.text(max_size=6), entry | st.integers() | st.none(), max_size=5)


@settings(max_examples=planned(HEADER, 5))
@given(headers, st.binary(max_size=600), st.integers(-5, 5))
def test_structured_lying_headers_raise_only_checkpoint_errors(
    header: dict[str, Any], data: bytes, skew: int
) -> None:
    tally(HEADER)
    raw = json.dumps(header).encode()
    blob = struct.pack("<Q", max(0, len(raw) + skew)) + raw + data
    with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:
        f.write(blob)
        f.flush()
        try:
            st_file = SafetensorsFile(Path(f.name))
        except CheckpointError as e:
            assert "\n" not in str(e)
            return
        for name in st_file.names():  # whatever was accepted reads back in bounds
            t = st_file.raw(name)
            assert len(t.data) == st_file.entries[name].nbytes


DTYPE_NAMES = sorted(DTYPES)


TENSORS = st.lists(
    st.tuples(st.sampled_from(DTYPE_NAMES), st.lists(st.integers(0, 6), max_size=3)),
    min_size=1,
    max_size=4,
)
HEADER_BREAKS = st.sampled_from(["field", "element", "name", "entry", "repeat", "metadata", "none"])
FIELDS = st.sampled_from(["dtype", "shape", "data_offsets", "extra"])
NAMES = st.text(max_size=4) | st.just("__metadata__")
BYTES = st.sampled_from([0xFF, 0xC3, 0x00, 0x22])
SKEWS = st.sampled_from([0, 0, 0, -1, 1, 1 << 40])


@st.composite
def broken_headers(draw: st.DrawFn) -> tuple[bytes, int]:
    """A valid header (its entries tiling the data, in any order), then one thing broken: a
    field, an element of a list, a name, the metadata, a repeated key, a byte, the data size."""
    pairs: list[tuple[str, str]] = []  # (key, JSON text of its value): keys may repeat
    pos = 0
    for i, (dtype, shape) in enumerate(draw(TENSORS)):
        end = pos + DTYPES[dtype].nbytes(tuple(shape))
        doc = {"dtype": dtype, "shape": shape, "data_offsets": [pos, end]}
        pairs.append((f"t{i}", json.dumps(doc)))
        pos = end
    turn = draw(ANY) % len(pairs)
    pairs = pairs[turn:] + pairs[:turn]  # the offsets need not be in order
    if draw(st.booleans()):
        pairs.append(("__metadata__", json.dumps({"format": "pt"})))
    i = draw(ANY) % len(pairs)
    key, value = pairs[i]
    how = draw(HEADER_BREAKS)
    if how in ("field", "element") and key != "__metadata__":
        doc = json.loads(value)
        field = draw(FIELDS)
        if how == "element" and field in ("shape", "data_offsets"):
            items = [json.dumps(x) for x in doc[field]] or ["0"]
            items[draw(ANY) % len(items)] = draw(HOSTILE)
            broken = "[" + ", ".join(items) + "]"
        else:
            broken = draw(HOSTILE)
        parts = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items() if k != field]
        pairs[i] = (key, "{" + ", ".join([*parts, f'"{field}": {broken}']) + "}")
    elif how == "name":
        pairs[i] = (draw(NAMES), value)
    elif how == "entry":
        pairs[i] = (key, draw(HOSTILE))
    elif how == "repeat":
        pairs.append(pairs[i])
    elif how == "metadata":
        pairs.append(("__metadata__", draw(HOSTILE)))
    text = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs) + "}"
    raw = bytearray(text.encode())
    if draw(ANY) % 10 == 0:  # one byte changed: invalid UTF-8, or a broken token
        raw[draw(ANY) % len(raw)] = draw(BYTES)
    return bytes(raw), pos + draw(SKEWS)


@settings(max_examples=planned(HEADER, 10))
@given(broken_headers())
def test_valid_headers_with_one_thing_broken_raise_only_checkpoint_errors(
    case: tuple[bytes, int],
) -> None:
    tally(HEADER)
    check_header(*case)


def check_header(raw: bytes, data_len: int) -> None:
    try:
        entries, meta = parse_header(raw, data_len, "fuzz")
    except CheckpointError as e:
        assert "\n" not in str(e)
        return
    assert sum(e.nbytes for e in entries.values()) == data_len
    assert "__metadata__" not in entries
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())


# The index, on disk: two shards holding a, b and c, d; one entry of the index (or the index,
# a shard, config.json or hf_quant_config.json as a whole) broken.
INDEX_READER = "index"
SHARDS = {"s1.safetensors": ["a", "b"], "s2.safetensors": ["c", "d"]}
FILE_NAMES = st.sampled_from(
    ["s3.safetensors", "../s1.safetensors", "/etc/hostname", "sub/s1.safetensors", "sub",
     "s1.safetensors/", "", ".", "\\s1.safetensors", "s1\0", "x" * 300, "é" * 200,
     "\ud800.safetensors", "config.json", "out", "loop", "dangling", "s2.safetensors"]
)  # fmt: skip
JSON_BYTES = st.sampled_from(
    [b"{}", b"[]", b'"x"', b"", b"\xff\xfe", b"{", b"[" * 5000, b'{"a": NaN}', b'{"a": 1, "a": 2}',
     b'{"weight_map": {}}', b"null", ("9" * 5000).encode()]
) | HOSTILE.map(str.encode)  # fmt: skip


def shard(names: list[str]) -> bytes:
    head = {
        n: {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i, n in enumerate(names)
    }
    raw = json.dumps(head).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(range(len(names)))  # fmt: skip


DIR_BREAKS = st.sampled_from(
    ["file", "value", "drop", "add", "weight_map", "doc", "index", "shard", "single", "json"]
)
TENSOR_NAMES = st.sampled_from(["a", "b", "c", "d"])
SHARD_NAMES = st.sampled_from(sorted(SHARDS))
NEW_NAMES = st.text(max_size=3) | st.just("__metadata__")
SHARD_BYTES = st.sampled_from(
    [b"", b"\x00" * 8, shard(["a", "b", "c"]), shard(["a"]), shard([])]
) | st.binary(max_size=40)
SIDE_FILES = st.sampled_from(["config.json", "hf_quant_config.json"])


@st.composite
def broken_dirs(draw: st.DrawFn) -> dict[str, bytes]:
    """The files of a sharded checkpoint directory, one thing broken (the comment above)."""
    wm: dict[str, Any] = {n: fn for fn, names in SHARDS.items() for n in names}
    files = {fn: shard(names) for fn, names in SHARDS.items()} | {"config.json": b"{}"}
    doc: Any = {"metadata": {"total_size": 4}, "weight_map": wm}
    how = draw(DIR_BREAKS)
    if how == "file":
        wm[draw(TENSOR_NAMES)] = draw(FILE_NAMES)
    elif how == "value":
        wm[draw(TENSOR_NAMES)] = draw(VALUES)
    elif how == "drop":
        del wm[draw(TENSOR_NAMES)]
    elif how == "add":
        wm[draw(NEW_NAMES)] = draw(SHARD_NAMES)
    elif how == "weight_map":
        doc["weight_map"] = draw(VALUES)
    elif how == "doc":
        doc = draw(VALUES)
    elif how == "shard":
        files[draw(SHARD_NAMES)] = draw(SHARD_BYTES)
    elif how == "single":
        files["model.safetensors"] = shard([])
    files[INDEX] = json.dumps(doc).encode()
    if how == "index":
        files[INDEX] = draw(JSON_BYTES)
    if how == "json":
        files[draw(SIDE_FILES)] = draw(JSON_BYTES)
    return files


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for every example (a fresh one each costs more than the parse): what
    does not change is made here, what an example writes it deletes first."""
    root = tmp_path_factory.mktemp("fuzz-index")
    (root / "sub").mkdir()
    (root / "sub/s1.safetensors").write_bytes(shard(SHARDS["s1.safetensors"]))
    os.symlink("/etc/hostname", root / "out")
    os.symlink("loop", root / "loop")
    os.symlink("nowhere", root / "dangling")
    return root


WRITTEN = (INDEX, "model.safetensors", "config.json", "hf_quant_config.json", *SHARDS)


@settings(max_examples=planned(INDEX_READER, 15))
@given(broken_dirs())
@example({INDEX: json.dumps({"weight_map": {"a": "\ud800.safetensors"}}).encode()})
def test_index_directories_with_one_thing_broken_raise_only_checkpoint_errors(
    index_dir: Path, files: dict[str, bytes]
) -> None:
    tally(INDEX_READER)
    for fn in WRITTEN:
        (index_dir / fn).unlink(missing_ok=True)
    for fn, data in files.items():
        (index_dir / fn).write_bytes(data)
    try:
        ckpt = CheckpointDir(index_dir)
        for n in ckpt.names():  # whatever is accepted reads back: one byte each
            t = ckpt.get(n)
            assert t is not None and len(t.data) == 1
        used = {fn for fn, names in SHARDS.items() if set(names) & set(ckpt.names())}
        assert set(ckpt.names()) <= {"a", "b", "c", "d"}  # an empty weight_map reads nothing
        assert set(ckpt.unindexed_files()) == set(SHARDS) - used
        assert isinstance(ckpt.config, dict)
        ckpt.side_file("hf_quant_config.json")
    except CheckpointError as e:
        assert "\n" not in str(e)
