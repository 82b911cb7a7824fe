"""`bind --out` never destroys anything: not a device, a FIFO, a directory, a symlink, nor a file
of the checkpoint being read; a symlink is written through to its target; no temp file is left."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
from helpers import TABLE

from runtime.checkpoint import Checkpoint
from runtime.errors import OutputError
from runtime.export import check_out_path, write_safetensors
from runtime.synth import TINY, synth

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


def test_write_safetensors_itself_refuses_a_file_of_its_inputs(work: Path) -> None:
    shard = work / "ck" / SHARD
    before = shard.read_bytes()
    with pytest.raises(OutputError, match="is a file of the checkpoint being read"):
        write_safetensors(
            shard, {"a": np.zeros(2, np.float32)}, {}, Checkpoint(work / "ck").files()
        )
    assert shard.read_bytes() == before
    assert sorted(p.name for p in (work / "ck").iterdir()) == sorted(
        p.name for p in Checkpoint(work / "ck").files()
    ), "no temp file was made"


def test_checkpoint_files_are_the_shards_the_index_and_the_config(work: Path) -> None:
    assert [p.name for p in Checkpoint(work / "ck").files()] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "config.json",
    ]


def test_check_out_path_refuses_a_link_to_an_input_and_returns_a_symlinks_target(
    work: Path,
) -> None:
    inputs = Checkpoint(work / "ck").files()
    os.link(work / "ck" / SHARD, work / "hard")
    os.symlink(work / "ck" / "config.json", work / "soft")
    with pytest.raises(OutputError, match=f"is a hard link to {work / 'ck' / SHARD}"):
        check_out_path(work / "hard", inputs)
    with pytest.raises(OutputError, match="is a file of the checkpoint being read"):
        check_out_path(work / "soft", inputs)
    os.symlink(work / "elsewhere.safetensors", work / "link")
    assert check_out_path(work / "link", inputs) == work.resolve() / "elsewhere.safetensors"
