"""Nothing lost: a write that fails half way leaves the previous file exactly as it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from generator.render import _atomic_write
from runtime.export import write_safetensors


class Boom(RuntimeError):
    pass


def test_an_interrupted_out_file_leaves_the_previous_one_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "bound.safetensors"
    write_safetensors(out, {"a": np.arange(4, dtype=np.float32)}, {"k": "v"})
    before = out.read_bytes()
    calls = []
    real = np.ascontiguousarray

    def flaky(a: object) -> object:  # the second tensor's bytes cannot be read
        calls.append(a)
        if len(calls) == 2:
            raise Boom("disk pulled out")
        return real(a)

    monkeypatch.setattr(np, "ascontiguousarray", flaky)
    with pytest.raises(Boom):
        write_safetensors(
            out, {"a": np.ones(4, np.float32), "b": np.zeros(8, np.float32)}, {"k": "v"}
        )
    assert len(calls) == 2, "the failure came after the header and the first tensor were written"
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["bound.safetensors"], "no temp file left behind"


def test_an_interrupted_generated_file_leaves_the_previous_one_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "kda.py"
    target.write_text("previous = True\n")

    def fail_fsync(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("os.fsync", fail_fsync)
    with pytest.raises(KeyboardInterrupt):
        _atomic_write(target, b"half = ")
    assert target.read_text() == "previous = True\n"
    assert [p.name for p in tmp_path.iterdir()] == ["kda.py"]


def test_the_same_arrays_always_write_the_same_bytes(tmp_path: Path) -> None:
    arrays = {"z": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.ones(3, dtype=np.int8)}
    write_safetensors(tmp_path / "1.safetensors", arrays, {"x": "1", "a": "2"})
    write_safetensors(
        tmp_path / "2.safetensors", dict(reversed(arrays.items())), {"a": "2", "x": "1"}
    )
    assert (tmp_path / "1.safetensors").read_bytes() == (tmp_path / "2.safetensors").read_bytes()
