"""Symlinks in a checkpoint: the Hugging Face Hub cache layout (``snapshots/<rev>/x ->
../../blobs/<hash>``) reads the same sharded or single-file; any other escape is refused."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import TABLE, TINY, read_file
from safetensors.numpy import save_file

from specbind.core.errors import CheckpointError
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import INDEX, SINGLE, CheckpointDir
from specbind.synth import synth

SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("links") / "plain"
    synth(TABLE, d, dict(TINY), layers=4, seed=4, mtp=False, shards=2)
    return d


def single_file(src: Path, dest: Path) -> Path:
    """``src``'s tensors as one ``model.safetensors`` (no index), with its config.json."""
    dest.mkdir()
    tensors = {n: a for f in sorted(src.glob("*.safetensors")) for n, a in read_file(f).items()}
    save_file(tensors, str(dest / SINGLE))
    shutil.copy(src / "config.json", dest / "config.json")
    return dest


def hub_cache(src: Path, cache: Path, repo: str = "models--org--tiny") -> Path:
    """Lay ``src`` out as ``snapshot_download`` does: every file a relative symlink from
    ``<repo>/snapshots/<rev>/`` into ``<repo>/blobs/<sha256>``. Returns the snapshot directory."""
    blobs = cache / repo / "blobs"
    snap = cache / repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, blobs / digest)
        os.symlink(Path("..", "..", "blobs", digest), snap / f.name)
    return snap


def relink(link: Path, target: Path) -> None:
    link.unlink()
    os.symlink(target, link)


def test_a_sharded_checkpoint_in_the_hub_cache_layout_binds_like_the_plain_one(
    plain: Path, tmp_path: Path
) -> None:
    snap = hub_cache(plain, tmp_path / "hub")
    assert (snap / SHARD).is_symlink()
    got = bind_checkpoint(CheckpointDir(snap), TABLE, progress=False)
    want = bind_checkpoint(CheckpointDir(plain), TABLE, progress=False)
    assert got.as_dict()["layers"] == want.as_dict()["layers"]
    assert len(got.layers) == 4


def test_a_single_file_checkpoint_in_the_hub_cache_layout_binds(
    plain: Path, tmp_path: Path
) -> None:
    snap = hub_cache(single_file(plain, tmp_path / "single"), tmp_path / "hub")
    assert (snap / SINGLE).is_symlink() and not (snap / INDEX).exists()
    assert len(bind_checkpoint(CheckpointDir(snap), TABLE, progress=False).layers) == 4


def _to_outside(snap: Path, name: str) -> Path:
    """Point ``name`` at a copy of its bytes outside the cache repo (an /etc/passwd stand-in)."""
    outside = snap.parents[3] / "passwd"
    shutil.copy(snap / name, outside)
    relink(snap / name, outside)
    return outside


def _to_other_repo(snap: Path, name: str) -> Path:
    """Point ``name`` at the same bytes, but in a *different* cache repo's blobs."""
    blob = (snap / name).resolve()
    other = snap.parents[2] / "models--evil--repo" / "blobs"
    other.mkdir(parents=True)
    shutil.copy(blob, other / blob.name)
    relink(snap / name, Path("..", "..", "..", "models--evil--repo", "blobs", blob.name))
    return other / blob.name


@pytest.mark.parametrize("name", [SHARD, INDEX, "config.json"])
@pytest.mark.parametrize("escape", [_to_outside, _to_other_repo], ids=["outside", "other_repo"])
def test_a_hub_cache_symlink_that_escapes_its_repo_is_refused_naming_where_it_resolves(
    plain: Path, tmp_path: Path, name: str, escape: Callable[[Path, str], Path]
) -> None:
    snap = hub_cache(plain, tmp_path / "hub")
    where = escape(snap, name)
    with pytest.raises(CheckpointError) as e:
        bind_checkpoint(CheckpointDir(snap), TABLE, progress=False)  # config.json is read here
    msg = str(e.value)
    assert f"resolves outside the checkpoint directory, to {where.resolve()}" in msg
    if name == SHARD:
        assert msg.startswith(f"{INDEX}: ") and f"-> {SHARD!r} resolves outside" in msg, msg
    else:
        assert msg.startswith(f"{name} resolves outside"), msg


def test_a_hub_cache_whose_blobs_folder_is_itself_a_symlink_is_refused(
    plain: Path, tmp_path: Path
) -> None:
    snap = hub_cache(plain, tmp_path / "hub")
    blobs = snap.parents[1] / "blobs"
    shutil.move(blobs, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", blobs)
    with pytest.raises(
        CheckpointError, match=f"^{INDEX} resolves outside .* to {tmp_path}/elsewhere/"
    ):
        CheckpointDir(snap)


def test_a_single_file_symlink_out_of_the_hub_cache_shape_is_refused(
    plain: Path, tmp_path: Path
) -> None:
    snap = hub_cache(single_file(plain, tmp_path / "single"), tmp_path / "hub")
    moved = snap.parent.parent / "revs" / snap.name  # blobs is two levels up, but not snapshots/
    moved.parent.mkdir()
    snap.rename(moved)
    with pytest.raises(
        CheckpointError, match=f"^{SINGLE} resolves outside the checkpoint directory, to "
    ):
        CheckpointDir(moved)


@pytest.mark.parametrize("layout", ["sharded", "single"])
def test_a_link_out_of_a_plain_directory_is_refused_in_either_layout(
    plain: Path, tmp_path: Path, layout: str
) -> None:
    if layout == "sharded":
        d, name = tmp_path / "ck", SHARD
        shutil.copytree(plain, d)
    else:
        d, name = single_file(plain, tmp_path / "ck"), SINGLE
    outside = tmp_path / "passwd"
    shutil.move(d / name, outside)
    os.symlink(outside, d / name)
    with pytest.raises(
        CheckpointError, match=f"resolves outside the checkpoint directory, to {outside}$"
    ):
        CheckpointDir(d)


def test_a_symlink_inside_the_directory_is_followed(plain: Path, tmp_path: Path) -> None:
    d = tmp_path / "ck"
    shutil.copytree(plain, d)
    (d / "store").mkdir()
    shutil.move(d / SHARD, d / "store" / "real.safetensors")
    os.symlink(Path("store", "real.safetensors"), d / SHARD)
    assert len(bind_checkpoint(CheckpointDir(d), TABLE, progress=False).layers) == 4


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (
            lambda d: os.symlink("nowhere.safetensors", d / SHARD),
            "a symlink whose target does not exist",
        ),
        (lambda d: os.symlink(SHARD, d / SHARD), "cannot be resolved (a loop?)"),
        (
            lambda d: (d / "sub").mkdir() or os.symlink("sub", d / SHARD),
            "which is not a regular file",
        ),
        (lambda d: os.mkfifo(d / SHARD), "not a regular file"),
    ],
    ids=["dangling", "loop", "to_a_directory", "fifo"],
)
def test_a_shard_entry_that_is_not_a_regular_file_or_a_link_to_one_is_refused(
    plain: Path, tmp_path: Path, make: Callable[[Path], object], fragment: str
) -> None:
    d = tmp_path / "ck"
    shutil.copytree(plain, d)
    (d / SHARD).unlink()
    make(d)
    with pytest.raises(CheckpointError, match=re.escape(f"{INDEX}: ") + ".*" + re.escape(fragment)):
        CheckpointDir(d)


def test_a_subdirectory_symlink_that_escapes_is_refused(plain: Path, tmp_path: Path) -> None:
    d = tmp_path / "ck"
    shutil.copytree(plain, d)
    (tmp_path / "outside").mkdir()
    shutil.move(d / SHARD, tmp_path / "outside" / SHARD)
    os.symlink(tmp_path / "outside", d / "sub")
    idx = (d / INDEX).read_text().replace(f'"{SHARD}"', f'"sub/{SHARD}"')
    (d / INDEX).write_text(idx)
    with pytest.raises(CheckpointError, match=f"-> 'sub/{SHARD}' resolves outside"):
        CheckpointDir(d)


def test_a_hub_snapshot_whose_blob_is_gone_is_refused_naming_the_missing_blob(
    plain: Path, tmp_path: Path
) -> None:
    snap = hub_cache(plain, tmp_path / "cache")
    blob = (snap / SHARD).resolve()
    blob.unlink()  # an interrupted download, or a cache cleaned by hand
    with pytest.raises(CheckpointError) as e:
        CheckpointDir(snap)
    msg = str(e.value)
    assert f"'{SHARD}'" in msg and str(blob) in msg and "does not exist" in msg, msg
