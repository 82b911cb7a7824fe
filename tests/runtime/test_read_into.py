"""``safetensors_file.read_view``: a contiguous view of a mapped checkpoint file is read with
``preadv`` from that very file (device and inode checked), and refused (the caller copies from the
map) wherever that could give other bytes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from specbind.runtime.binder.backends import Arena
from specbind.runtime.io import safetensors_file
from specbind.runtime.io.safetensors_file import SafetensorsFile, read_view


def _write(path: Path, data: np.ndarray) -> None:
    """A one-tensor U8 safetensors file holding ``data``."""
    import json

    head = json.dumps({"t": {"dtype": "U8", "shape": [data.size], "data_offsets": [0, data.size]}})
    raw = head.encode() + b" " * (-len(head) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data.tobytes())


def _view(f: SafetensorsFile) -> np.ndarray:
    return np.frombuffer(f.raw("t").data, np.uint8)


def test_a_view_of_the_map_is_read_from_the_file_byte_for_byte(tmp_path: Path) -> None:
    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)
    _write(tmp_path / "a.safetensors", data)
    f = SafetensorsFile(tmp_path / "a.safetensors")
    v = _view(f)[12345 : 12345 + (2 << 20)]  # starts off any page boundary
    out = np.zeros(v.size, np.uint8)
    assert read_view(out, v)
    assert out.tobytes() == data[12345 : 12345 + (2 << 20)].tobytes()


def test_a_file_replaced_since_it_was_mapped_is_read_as_it_was_opened(tmp_path: Path) -> None:
    """A checkpoint rewritten in place (a new file at the same path) holds other bytes: a read
    descriptor opened again by path is checked against the mapped file's device and inode and
    refused (the caller copies from the map); one kept from a read before the rewrite reads
    the mapped file. Either way the bytes are the map's, never the new file's."""
    path = tmp_path / "a.safetensors"
    old = np.full(1 << 16, 7, np.uint8)
    _write(path, old)
    f = SafetensorsFile(path)
    early = SafetensorsFile(path, "read before the rewrite")
    assert read_view(np.zeros(old.size, np.uint8), _view(early))  # its descriptor is kept
    _write(tmp_path / "b.safetensors", np.full(1 << 16, 9, np.uint8))
    os.replace(tmp_path / "b.safetensors", path)
    out = np.zeros(old.size, np.uint8)
    assert not read_view(out, _view(f)), "the path names another file now"
    assert read_view(out, _view(early)) and out.tobytes() == old.tobytes()
    arena = Arena()
    placed = arena.place(_view(f))
    assert arena.holds(placed) and placed.tobytes() == old.tobytes()


def test_read_descriptors_are_few_and_reopened_as_needed(tmp_path: Path) -> None:
    """One descriptor per open file (its map's); ``read_view`` keeps at most ``READERS`` more,
    for the files read last, and opens an evicted file's again when it is read again."""
    n = 2 * safetensors_file.READERS
    before = len(os.listdir("/proc/self/fd"))
    files = []
    for i in range(n):
        _write(tmp_path / f"{i}.safetensors", np.full(4096, i, np.uint8))
        files.append(SafetensorsFile(tmp_path / f"{i}.safetensors"))
    assert len(os.listdir("/proc/self/fd")) <= before + n
    for _ in range(2):
        for i, f in enumerate(files):
            out = np.zeros(4096, np.uint8)
            assert read_view(out, _view(f)) and (out == i).all()
    assert len(os.listdir("/proc/self/fd")) <= before + n + safetensors_file.READERS


def test_memory_of_its_own_or_a_closed_files_view_is_refused(tmp_path: Path) -> None:
    """A writable array is no map's view; a read-only array in no open file's map (its file
    gone, or never mapped) has no descriptor to read from: both are left to the copy."""
    assert not read_view(np.zeros(4096, np.uint8), np.ones(4096, np.uint8))
    _write(tmp_path / "a.safetensors", np.full(4096, 3, np.uint8))
    gone = _view(SafetensorsFile(tmp_path / "a.safetensors"))  # the file object is dropped
    assert not read_view(np.zeros(4096, np.uint8), gone)
    stray = np.ones(4096, np.uint8)
    stray.flags.writeable = False
    assert not read_view(np.zeros(4096, np.uint8), stray)


def test_a_read_that_comes_up_short_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)
    _write(tmp_path / "a.safetensors", data)
    f = SafetensorsFile(tmp_path / "a.safetensors")
    monkeypatch.setattr(safetensors_file.os, "preadv", lambda fd, bufs, off: 0)  # at EOF
    assert not read_view(np.zeros(data.size, np.uint8), _view(f))


def test_a_stack_of_row_views_reads_each_from_the_file_and_equals_numpys_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ops.stack`` of [gate; up] row shards (views of the map) reads each part from the file
    into its rows of the result; the bytes are NumPy's concatenate-then-stack of the same."""
    from specbind.runtime.binder import ops

    data = np.random.default_rng(1).integers(0, 256, 6 * 8 * 64, dtype=np.uint8)
    _write(tmp_path / "a.safetensors", data)
    f = SafetensorsFile(tmp_path / "a.safetensors")  # kept open, as a CheckpointDir keeps it
    rows = _view(f).view(np.uint16).reshape(6, 8, 32)
    gate = [rows[e, :4] for e in range(3)]  # [3 members] of [4, 32], views of the map
    up = [rows[e + 3, 4:] for e in range(3)]
    reads: list[tuple[int, bool]] = []
    real = safetensors_file.read_view

    def spy(dest: np.ndarray, src: np.ndarray) -> bool:
        done = real(dest, src)
        reads.append((src.nbytes, done))
        return done

    monkeypatch.setattr(safetensors_file, "read_view", spy)
    got = ops.stack([gate, up], axis=0, squeeze=None)
    want = np.stack([np.concatenate([g, u]) for g, u in zip(gate, up, strict=True)])
    assert got.shape == (3, 8, 32) and got.tobytes() == want.tobytes()
    assert reads == [(4 * 32 * 2, True)] * 6  # every part was read from the file


def test_within_split_reads_a_large_view_is_read_as_page_aligned_ranges_by_threads_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import itertools
    import threading

    data = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8)
    _write(tmp_path / "a.safetensors", data)
    f = SafetensorsFile(tmp_path / "a.safetensors")
    monkeypatch.setattr(safetensors_file, "PARALLEL_MIN", 1 << 18)
    reads: list[tuple[int, int, str]] = []
    real = safetensors_file._pread

    def spy(fd: int, view: memoryview, offset: int, lo: int, hi: int) -> bool:
        reads.append((lo, hi, threading.current_thread().name))
        return real(fd, view, offset, lo, hi)

    monkeypatch.setattr(safetensors_file, "_pread", spy)
    v = _view(f)[777 : 777 + (3 << 20) - 1000]  # off any page boundary, not a page multiple
    out = np.zeros(v.size, np.uint8)
    assert read_view(out, v) and len(reads) == 1  # outside: one read, the caller's thread
    reads.clear()
    out[:] = 0
    with safetensors_file.split_reads(3):
        assert read_view(out, v)
    assert out.tobytes() == data[777 : 777 + (3 << 20) - 1000].tobytes()
    spans = sorted((lo, hi) for lo, hi, _ in reads)
    assert len(spans) == 3 and spans[0][0] == 0 and spans[-1][1] == v.size
    assert all(a[1] == b[0] and a[1] % 4096 == 0 for a, b in itertools.pairwise(spans))
    assert all(name.startswith("specbind-read") for _, _, name in reads)
    assert safetensors_file._THREADS == [1]  # restored on leaving
