"""`bind --out` never destroys anything: not a device, a FIFO, a directory, a symlink, nor a file
of the checkpoint being read; a symlink is written through to its target; no temp file is left."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import patience
import pytest
from helpers import TABLE, TINY, read_file

from specbind.core.errors import OutputError
from specbind.core.planning import Ranks
from specbind.runtime.binder.backends import NUMPY
from specbind.runtime.bound.bound_format import BoundMeta
from specbind.runtime.bound.stream_out import StreamWriter
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.io.out_path import check_out_path
from specbind.synth import synth

SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("out") / "ck"
    synth(TABLE, d, dict(TINY), layers=4, seed=2, mtp=False, shards=2)
    return d


@pytest.fixture
def work(tmp_path: Path, ckpt: Path) -> Path:
    """A private copy of the checkpoint (at work/ck) that a test may try to damage."""
    shutil.copytree(ckpt, tmp_path / "ck")
    return tmp_path


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("/dev/null", "exists and is a character device, not a regular file"),
        (".", "is a directory; output names the .safetensors file to write"),
        ("", "output '': an empty path"),
    ],
)
def test_check_out_path_refuses_what_is_not_a_regular_file(path: str, fragment: str) -> None:
    with pytest.raises(OutputError, match=fragment):
        check_out_path(path)


def test_check_out_path_refuses_a_unix_socket(tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "s"))
        with pytest.raises(OutputError, match="exists and is a socket"):
            check_out_path(tmp_path / "s")
    finally:
        sock.close()


def test_the_writer_itself_refuses_a_file_of_its_inputs(work: Path) -> None:
    shard = work / "ck" / SHARD
    before = shard.read_bytes()
    head = BoundMeta("m", "0" * 64, Ranks(), {})
    with (
        pytest.raises(OutputError, match="is a file of the checkpoint being read"),
        StreamWriter(shard, head, NUMPY, CheckpointDir(work / "ck").files()) as w,
    ):
        w.tensor("a", np.zeros(2, np.float32))
    assert shard.read_bytes() == before
    assert sorted(p.name for p in (work / "ck").iterdir()) == sorted(
        p.name for p in CheckpointDir(work / "ck").files()
    ), "no temp file was made"


def test_checkpoint_files_are_the_shards_the_index_and_the_config(work: Path) -> None:
    assert [p.name for p in CheckpointDir(work / "ck").files()] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "config.json",
    ]


def test_check_out_path_refuses_a_link_to_an_input_and_returns_a_symlinks_target(
    work: Path,
) -> None:
    inputs = CheckpointDir(work / "ck").files()
    os.link(work / "ck" / SHARD, work / "hard")
    os.symlink(work / "ck" / "config.json", work / "soft")
    with pytest.raises(OutputError, match=f"is a hard link to {work / 'ck' / SHARD}"):
        check_out_path(work / "hard", inputs)
    with pytest.raises(OutputError, match="is a file of the checkpoint being read"):
        check_out_path(work / "soft", inputs)
    os.symlink(work / "elsewhere.safetensors", work / "link")
    assert check_out_path(work / "link", inputs) == work.resolve() / "elsewhere.safetensors"


# The CLI: a bad --out is refused before any binding, in one line.


def specbind(*args: str) -> subprocess.CompletedProcess[str]:
    return patience.run(
        [sys.executable, "-m", "specbind", *args], capture_output=True, text=True, cpu=120
    )


def refused(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # a usage error: the path given
    assert proc.stdout == "", "refused before binding: no report printed"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specbind: error: --out "), proc.stderr
    return lines[0]


def snapshot(d: Path) -> dict[str, bytes | str]:
    """Every entry of ``d``: a symlink as its target, a file as its bytes, else its kind."""
    out: dict[str, bytes | str] = {}
    for p in sorted(d.rglob("*")):
        mode = p.lstat().st_mode
        key = str(p.relative_to(d))
        if stat.S_ISLNK(mode):
            out[key] = "-> " + os.readlink(p)
        elif stat.S_ISREG(mode):
            out[key] = p.read_bytes()
        else:
            out[key] = stat.filemode(mode)[0]
    return out


def test_out_refuses_an_empty_path(work: Path) -> None:
    line = refused(specbind("bind", str(work / "ck"), "--out", ""))
    assert "--out '': an empty path" in line


def test_out_refuses_a_path_inside_the_input_checkpoint(work: Path) -> None:
    before = snapshot(work)
    for name in (SHARD, "model.safetensors.index.json", "config.json"):
        line = refused(specbind("bind", str(work / "ck"), "--out", str(work / "ck" / name)))
        assert "is a file of the checkpoint being read" in line and name in line
    assert snapshot(work) == before


def test_out_refuses_a_hard_link_to_a_file_of_the_input_checkpoint(work: Path) -> None:
    os.link(work / "ck" / SHARD, work / "bound.safetensors")
    before = snapshot(work)
    line = refused(specbind("bind", str(work / "ck"), "--out", str(work / "bound.safetensors")))
    assert f"is a hard link to {work / 'ck' / SHARD}" in line
    assert snapshot(work) == before


def test_out_refuses_a_symlink_to_a_file_of_the_input_checkpoint(work: Path) -> None:
    os.symlink(work / "ck" / SHARD, work / "bound.safetensors")
    before = snapshot(work)
    line = refused(specbind("bind", str(work / "ck"), "--out", str(work / "bound.safetensors")))
    assert "is a file of the checkpoint being read" in line
    assert snapshot(work) == before


def test_out_refuses_a_fifo_and_leaves_it_a_fifo(work: Path) -> None:
    os.mkfifo(work / "pipe")
    line = refused(specbind("bind", str(work / "ck"), "--out", str(work / "pipe")))
    assert "exists and is a FIFO, not a regular file" in line
    assert stat.S_ISFIFO((work / "pipe").lstat().st_mode)


def test_out_refuses_a_symlink_to_dev_null_and_leaves_both_alone(work: Path) -> None:
    # Through a link in tmp_path: if the check were missing, the link would be replaced,
    # never /dev/null itself.
    os.symlink("/dev/null", work / "null")
    line = refused(specbind("bind", str(work / "ck"), "--out", str(work / "null")))
    assert "exists and is a character device" in line
    assert os.readlink(work / "null") == "/dev/null"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_out_refuses_a_symlink_loop(work: Path) -> None:
    os.symlink("loop", work / "loop")
    assert "cannot be resolved" in refused(
        specbind("bind", str(work / "ck"), "--out", str(work / "loop"))
    )


def test_out_refuses_a_path_under_a_regular_file(work: Path) -> None:
    (work / "file").write_text("x")
    line = refused(
        specbind("bind", str(work / "ck"), "--out", str(work / "file" / "b.safetensors"))
    )
    assert f"{work / 'file'} is not a directory" in line


def test_out_writes_through_a_symlink_to_its_target(work: Path) -> None:
    (work / "real").mkdir()
    target = work / "real" / "bound.safetensors"
    target.write_bytes(b"old")
    os.symlink(target, work / "link.safetensors")
    proc = specbind("bind", str(work / "ck"), "--out", str(work / "link.safetensors"))
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(work / "link.safetensors") == str(target), "the link itself is kept"
    assert "layers.0.attention.conv" in read_file(target)
    assert sorted(p.name for p in (work / "real").iterdir()) == ["bound.safetensors"]


def test_a_dangling_symlink_out_creates_its_target(work: Path) -> None:
    target = work / "new" / "bound.safetensors"
    os.symlink(target, work / "link.safetensors")
    proc = specbind("bind", str(work / "ck"), "--out", str(work / "link.safetensors"))
    assert proc.returncode == 0, proc.stderr
    assert (work / "link.safetensors").is_symlink() and "layers.0.attention.conv" in read_file(
        target
    )


def test_a_bad_out_is_refused_before_any_binding(work: Path) -> None:
    # This override breaks a constraint that binding would report; the --out refusal wins.
    assert (
        "scan_shared_memory" in specbind("bind", str(work / "ck"), "--set", "kda_chunk=128").stderr
    )
    line = refused(
        specbind("bind", str(work / "ck"), "--set", "kda_chunk=128", "--out", str(work / "ck"))
    )
    assert "is a directory" in line


def test_out_refuses_a_new_file_inside_the_checkpoint_directory(work: Path) -> None:
    """A new model.safetensors beside the index would make every loader refuse (or misread)
    the checkpoint; any other new file there is the checkpoint's to keep, not ours to write."""
    before = snapshot(work)
    for name in ("model.safetensors", "generation_config.json", "sub/bound.safetensors"):
        line = refused(specbind("bind", str(work / "ck"), "--out", str(work / "ck" / name)))
        assert "is inside" in line and "the checkpoint being read" in line
    assert snapshot(work) == before


def hub_snapshot(ckpt: Path, repo: Path) -> Path:
    """``ckpt`` laid out as a Hub cache repo: ``repo/snapshots/abc/x -> ../../blobs/x``."""
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc"
    snap.mkdir(parents=True)
    for f in ckpt.iterdir():
        (repo / "blobs" / f.name).write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(Path("../../blobs") / f.name)
    return snap


def test_out_refuses_the_hub_cache_repo_a_snapshot_links_into(tmp_path: Path, ckpt: Path) -> None:
    repo = tmp_path / "models--org--m"
    snap = hub_snapshot(ckpt, repo)
    (repo / "blobs" / "gen").write_text("{}")
    (snap / "generation_config.json").symlink_to("../../blobs/gen")
    line = refused(specbind("bind", str(snap), "--out", str(snap / "generation_config.json")))
    assert "the checkpoint being read" in line
    assert (repo / "blobs" / "gen").read_text() == "{}"


def test_out_refuses_the_cache_repo_of_a_snapshot_reached_through_a_link(
    tmp_path: Path, ckpt: Path
) -> None:
    repo = tmp_path / "hub" / "models--org--m"
    (tmp_path / "link").symlink_to(hub_snapshot(ckpt, repo))
    line = refused(
        specbind("bind", str(tmp_path / "link"), "--out", str(repo / "blobs" / "new.safetensors"))
    )
    assert "the checkpoint being read" in line
    assert not (repo / "blobs" / "new.safetensors").exists()
