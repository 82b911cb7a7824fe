"""``bind --out`` streams: each slot is written as soon as it is bound and dropped, and the file
holds exactly what an in-memory bind returns."""

from __future__ import annotations

import json
import re
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import patience
import pytest
from safetensors.numpy import load_file

from specbind.cli import main
from specbind.generated import MODELS
from specbind.runtime.bind.bind import Expected, SlotResult, bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

TABLE = MODELS["glm-5.3-flash"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stream") / "tiny"
    assert main(["synth", str(out), "--layers", "4"]) == 0
    return out


def test_the_streamed_file_holds_exactly_the_in_memory_bind(ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "r1.safetensors"
    assert main(["bind", str(ckpt), "--tp-size", "2", "--tp-rank", "1", "--out", str(out)]) == 0
    mem = bind_checkpoint(CheckpointDir(ckpt), TABLE, tp_size=2, tp_rank=1).fields()
    got = load_file(out)
    assert sorted(got) == sorted(mem)
    for name, (_, a) in mem.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape, name
        assert got[name].tobytes() == np.ascontiguousarray(a).tobytes(), name


def test_the_header_is_sorted_metadata_first_and_padded_to_its_reservation(
    ckpt: Path, tmp_path: Path
) -> None:
    out = tmp_path / "r0.safetensors"
    assert main(["bind", str(ckpt), "--out", str(out)]) == 0
    raw = out.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    head = json.loads(raw[8 : 8 + n])
    keys = list(head)
    assert keys[0] == "__metadata__" and keys[1:] == sorted(keys[1:])
    layers = json.loads(head["__metadata__"]["layers"])
    assert sorted(layers, key=int) == [str(i) for i in range(5)]  # 4 decoder layers + MTP
    ends = sorted(v["data_offsets"] for k, v in head.items() if k != "__metadata__")
    assert ends[0][0] == 0 and ends[-1][1] == len(raw) - 8 - n


def test_a_streaming_bind_hands_each_slot_over_and_keeps_none(ckpt: Path) -> None:
    seen: list[str] = []
    announced: list[str] = []

    class Sink:
        def start(self, expected: Expected) -> None:
            announced.extend(expected.names)

        def slot(self, where: str, bound: SlotResult) -> None:
            assert not seen or seen[-1] != where
            seen.extend(f"{where}.{n}" for n in bound.weights.arrays())

    result = bind_checkpoint(CheckpointDir(ckpt), TABLE, sink=Sink())
    assert result.fields() == {}  # nothing kept in memory
    assert set(seen) <= set(announced) and len(seen) == len(set(seen))
    assert sorted(seen) == sorted(bind_checkpoint(CheckpointDir(ckpt), TABLE).fields())


def _slots_alive_at_each_next_slot(monkeypatch: pytest.MonkeyPatch, run: Any) -> list[int]:
    """Run ``run()``, and as each slot's bind starts, count how many arrays of the slots bound
    before it are still alive (weak references, after a collection)."""
    import gc
    import weakref

    import specbind.runtime.bind.bind as bind_mod

    before = bind_mod._bind_one
    refs: list[weakref.ref[Any]] = []
    alive: list[int] = []

    def watched(*args: Any, **kwargs: Any) -> SlotResult:
        gc.collect()
        alive.append(sum(r() is not None for r in refs))
        got = before(*args, **kwargs)
        refs.extend(weakref.ref(a) for a in got.weights.arrays().values())
        return got

    with monkeypatch.context() as m:
        m.setattr(bind_mod, "_bind_one", watched)
        run()
    return alive


def test_a_report_only_bind_drops_each_slots_arrays_before_binding_the_next(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the in-memory bind (the API's) keeps every slot: the count can grow, so the claim can fail
    kept = _slots_alive_at_each_next_slot(
        monkeypatch, lambda: bind_checkpoint(CheckpointDir(ckpt), TABLE, tp_size=2)
    )
    assert kept[-1] > 0 and kept == sorted(kept)
    dropped = _slots_alive_at_each_next_slot(
        monkeypatch, lambda: main(["bind", str(ckpt), "--tp-size", "2", "--tp-rank", "0", "--json"])
    )
    assert len(dropped) == len(kept) and dropped == [0] * len(kept)
    report = json.loads(capsys.readouterr().out)
    assert report["bytes"] > 0 and len(report["layers"]) == 5  # still reports every slot


def test_the_scale_bench_child_reports_every_phase_of_a_streamed_bind(
    tmp_path: Path,
) -> None:
    from benchmarks.scale import child

    ck = tmp_path / "sparse"
    assert main(["synth", str(ck), "--sparse", "--layers", "4"]) == 0
    r = child(str(ck), str(tmp_path / "o.safetensors"), 2, 2, "all")
    assert r["tensors"] == len(CheckpointDir(ck).names())
    assert r["bytes"] == (tmp_path / "o.safetensors").stat().st_size
    assert 0 < r["largest_field_mb"] * 2**20 < r["bytes"]
    for k in ("index_open_s", "planning_s", "bind_s", "write_s", "fsync_s", "peak_rss_mb"):
        assert r[k] > 0, k


def test_a_header_write_that_fails_keeps_the_previous_file_and_leaves_no_partial_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specbind.core.errors import OutputError
    from specbind.core.planning import Ranks
    from specbind.runtime.binder.backends import NUMPY
    from specbind.runtime.bound.bound_format import BoundMeta
    from specbind.runtime.bound.stream_out import StreamWriter

    out = tmp_path / "rank.safetensors"
    out.write_bytes(b"the previous bind")

    def fail(self: StreamWriter) -> None:
        raise OutputError("--out: header over its reservation")

    monkeypatch.setattr(StreamWriter, "_finish", fail)
    with (
        pytest.raises(OutputError, match="over its reservation"),
        StreamWriter(out, BoundMeta("m", "0" * 64, Ranks(), {}), NUMPY) as w,
    ):
        w.start(Expected([], {}, None))
    assert out.read_bytes() == b"the previous bind"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank.safetensors"]


def test_an_out_dir_rank_file_is_streamed_by_the_same_writer_into_the_same_format(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--out-dir`` (here a world of one; torchrun's ranks take the same path) writes each
    tensor through ``StreamWriter`` as it is bound, and its file is the ``--out`` file of that
    rank: the same tensors, byte for byte, and the same metadata plus its world and rank."""
    from specbind.runtime.bound.bound_format import decode
    from specbind.runtime.bound.stream_out import StreamWriter
    from specbind.runtime.io.safetensors_file import SafetensorsFile

    written: list[str] = []
    real = StreamWriter.tensor

    def spy(self: StreamWriter, name: str, host: np.ndarray[Any, Any]) -> None:
        written.append(name)
        real(self, name, host)

    monkeypatch.setattr(StreamWriter, "tensor", spy)
    assert main(["bind", str(ckpt), "--out-dir", str(tmp_path / "d")]) == 0
    assert main(["bind", str(ckpt), "--out", str(tmp_path / "one.safetensors")]) == 0
    ranked = SafetensorsFile(tmp_path / "d" / "rank-00000-of-00001.safetensors", "ranked")
    single = SafetensorsFile(tmp_path / "one.safetensors", "single")
    assert sorted(written) == sorted([*ranked.entries, *single.entries])
    head = decode(ranked.metadata, "ranked")
    assert (head.world, head.rank) == (1, 0)
    assert replace(head, world=None, rank=None) == decode(single.metadata, "single")
    assert tensor_bytes(ranked) == tensor_bytes(single)


def tensor_bytes(f: Any) -> dict[str, bytes]:
    """Each tensor of a ``SafetensorsFile`` by name, as its bytes."""
    return {n: bytes(f.view[f.data_start + e.begin : f.data_start + e.end])
            for n, e in f.entries.items()}  # fmt: skip


def test_a_write_that_fails_in_the_writer_thread_is_one_line_and_leaves_the_previous_file(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ENOSPC on the third tensor, raised in the background writer: the bind stops with one
    line naming the file and the cause, exit 1, the previous file as it was, no temp file."""
    import errno
    import os

    from specbind.runtime.bound import stream_out

    out = tmp_path / "o" / "rank.safetensors"
    out.parent.mkdir()
    out.write_bytes(b"the previous bind")
    real, calls = stream_out._Background._write, []

    def full(self: Any, *item: Any) -> int:
        calls.append(item[0])
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *item)

    monkeypatch.setattr(stream_out._Background, "_write", full)
    assert main(["bind", str(ckpt), "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"specbind: error: {re.escape(str(out))}: writing failed at byte [1-9][0-9]*: "
        r"No space left on device\n",
        err,
    ), err
    assert len(calls) == 3, "nothing is written after the failure"
    assert out.read_bytes() == b"the previous bind"
    assert [p.name for p in out.parent.iterdir()] == ["rank.safetensors"], "no temp file left"


def test_a_file_size_limit_hit_by_the_writer_thread_is_reported_and_leaves_no_file(
    ckpt: Path, tmp_path: Path
) -> None:
    """A real kernel refusal (EFBIG under RLIMIT_FSIZE) mid-file, in a fresh CLI process."""
    import sys

    out = tmp_path / "rank.safetensors"
    code = (
        "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000)); "
        f"sys.argv = ['specbind', 'bind', {str(ckpt)!r}, '--out', {str(out)!r}]; "
        "from specbind.cli import entry; entry()"
    )

    proc = patience.run([sys.executable, "-c", code], capture_output=True, text=True, cpu=120)
    assert proc.returncode == 1, proc.stderr
    assert re.fullmatch(
        rf"specbind: error: {re.escape(str(out))}: writing failed at byte [0-9]+: "
        r"File too large\n",
        proc.stderr,
    ), proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_down_proj_column_shards_are_gathered_straight_into_w2_with_the_copying_stacks_bytes(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import specbind.runtime.binder.ops as ops
    import specbind.runtime.binder.tp as tp

    def w2s() -> list[Any]:
        r = bind_checkpoint(CheckpointDir(ckpt), TABLE, tp_size=2, tp_rank=1, kinds=["moe"])
        return [s.weights.arrays()["w2"] for x in r.layers for s in x.slots.values()]

    direct = w2s()
    assert direct  # the tiny model has expert layers
    for w2 in direct:  # a view of the buffer the members were gathered into: no second copy
        assert isinstance(w2.base, np.ndarray) and w2.base.ctypes.data in tp._FAMILY_BUFFERS
    monkeypatch.setattr(ops, "stacked_run", lambda members: None)  # the copying stack
    copied = w2s()
    assert all(c.base is None for c in copied)
    assert [a.tobytes() for a in direct] == [c.tobytes() for c in copied]
