"""Nothing lost: a write that fails half way leaves the previous file exactly as it was."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specbind.core.planning import Ranks
from specbind.generator import render
from specbind.generator.render import generate
from specbind.runtime.bind.bind import Expected
from specbind.runtime.binder.backends import NUMPY
from specbind.runtime.bound.bound_format import BoundMeta
from specbind.runtime.bound.stream_out import StreamWriter

REPO = Path(__file__).resolve().parents[2]
HEAD = BoundMeta("m", "0" * 64, Ranks(), {"x": 1, "a": 2})


def write_out(out: Path, arrays: dict[str, Any], head: BoundMeta = HEAD) -> None:
    """``arrays`` through the one ``--out`` writer, in this order, as a bind hands them over."""
    with StreamWriter(out, head, NUMPY) as w:
        w.start(Expected(list(arrays), {}, None))
        for name, a in arrays.items():
            w.tensor(name, a)


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("error", [Boom, KeyboardInterrupt])
def test_an_interrupted_out_file_leaves_the_previous_one_intact_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type[BaseException]
) -> None:
    out = tmp_path / "bound.safetensors"
    write_out(out, {"a": np.arange(4, dtype=np.float32)})
    before = out.read_bytes()
    calls = []
    real = np.ascontiguousarray

    def flaky(a: object) -> object:  # the second tensor's bytes cannot be read
        calls.append(a)
        if len(calls) == 2:
            raise error("disk pulled out")
        return real(a)

    monkeypatch.setattr(np, "ascontiguousarray", flaky)
    with pytest.raises(error):
        write_out(out, {"a": np.ones(4, np.float32), "b": np.zeros(8, np.float32)})
    assert len(calls) == 2, "the failure came after the header and the first tensor were written"
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["bound.safetensors"], "no temp file left behind"


def test_an_interrupted_generate_leaves_every_generated_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    generate(tmp_path, tmp_path / "generated")
    spec = tmp_path / "specs" / "blocks" / "kda.yaml"
    spec.write_text(spec.read_text().replace("<= 49152", "<= 40960"))  # changes two files
    before = {p: p.read_bytes() for p in (tmp_path / "generated").rglob("*") if p.is_file()}
    writes = []
    real = render.atomic_writer

    def flaky(path: Path) -> object:
        writes.append(path)
        if len(writes) == 2:
            raise KeyboardInterrupt  # the second file is being written
        return real(path)

    monkeypatch.setattr(render, "atomic_writer", flaky)
    with pytest.raises(KeyboardInterrupt):
        generate(tmp_path, tmp_path / "generated")
    after = {p: p.read_bytes() for p in (tmp_path / "generated").rglob("*") if p.is_file()}
    assert after == before, "the first file must not have been replaced either"


def test_the_same_arrays_always_write_the_same_bytes_whatever_the_metadata_order(
    tmp_path: Path,
) -> None:
    arrays = {"z": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.ones(3, dtype=np.int8)}
    write_out(tmp_path / "1.safetensors", arrays)
    shuffled = BoundMeta("m", "0" * 64, Ranks(), {"a": 2, "x": 1})
    write_out(tmp_path / "2.safetensors", arrays, shuffled)
    assert (tmp_path / "1.safetensors").read_bytes() == (tmp_path / "2.safetensors").read_bytes()


def test_a_terminated_bind_leaves_the_previous_out_file_intact_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (``kill``, a launcher tearing its ranks down) mid-write unwinds like Ctrl-C:
    exit 143, the temp file removed, the previous ``--out`` file exactly as it was."""
    import os
    import signal

    from specbind.cli import main

    ck, out = tmp_path / "ck", tmp_path / "out" / "bound.safetensors"
    out.parent.mkdir()
    assert main(["synth", str(ck), "--seed", "0"]) == 0
    assert main(["bind", str(ck), "--out", str(out), "--no-progress"]) == 0
    before = out.read_bytes()
    real, calls = StreamWriter.tensor, []

    def killed(self: StreamWriter, name: str, a: Any) -> None:
        calls.append(name)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises at the next bytecode
        real(self, name, a)

    monkeypatch.setattr(StreamWriter, "tensor", killed)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        rc = main(["bind", str(ck), "--out", str(out), "--no-progress"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert rc == 143 and len(calls) == 3
    assert out.read_bytes() == before
    assert [p.name for p in out.parent.iterdir()] == ["bound.safetensors"], "no temp file left"
