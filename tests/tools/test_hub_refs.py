"""A Hub cache's ``refs/main`` is hostile input: read bounded, taken only as the commit hash
huggingface_hub writes there (``file_download.REGEX_COMMIT_HASH``), and anything else refused in
one short line before any of the checkpoint is read; ``specbind.open("owner/name")`` reads the
Hub cache as the CLI does. In-process (``main``), on a 2-layer Llama."""

from __future__ import annotations

import os
import re
import shutil
import tracemalloc
from pathlib import Path

import pytest

import specbind
from specbind.cli import EXIT, main
from specbind.core.errors import CheckpointError
from specbind.generated import MODELS
from specbind.hub import resolve
from specbind.synth import synth, tiny_values

LLAMA = MODELS["llama"]
HASH = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
ID = "acme/Tiny-Llama"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hubrefs") / "ll"
    synth(LLAMA, out, tiny_values(LLAMA), layers=2, seed=3)
    return out


def hub(root: Path, ckpt: Path, revisions: tuple[str, ...] = (HASH,)) -> Path:
    """A Hub cache repo as huggingface_hub lays it out: blobs, snapshots of links; no refs."""
    repo = root / "models--acme--Tiny-Llama"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    for f in ckpt.iterdir():
        shutil.copy(f, repo / "blobs" / f"blob-{f.name}")
    for rev in revisions:
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True)
        for f in ckpt.iterdir():
            (snap / f.name).symlink_to(Path("../../blobs") / f"blob-{f.name}")
    return repo


def audit(capsys: pytest.CaptureFixture[str], code: int) -> str:
    """``specbind audit ID``'s stderr, its exit status checked."""
    got = main(["audit", ID, "--json"])
    err = capsys.readouterr().err
    assert got == code, err
    return err


@pytest.mark.parametrize(
    ("ref", "shows"),
    [
        (b"..", r"b'\.\.'"),  # read as snapshots/.. it would be the repo folder itself
        (b".", r"b'\.'"),
        (b"../../../etc", r"b'\.\./\.\./\.\./etc'"),
        (b"\xff\xfe\x00", r"b'\\xff\\xfe\\x00'"),  # not UTF-8: an internal error before
        (HASH.upper().encode(), re.escape(repr(HASH.upper().encode()))),
        (HASH[:12].encode(), re.escape(repr(HASH[:12].encode()))),  # a short hash
    ],
)
def test_a_refs_main_that_is_not_a_commit_hash_is_refused_naming_the_file(
    capsys: pytest.CaptureFixture[str], ckpt: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, ref: bytes, shows: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    repo = hub(tmp_path, ckpt, (HASH, HASH[:12], HASH.upper()))
    (repo / "snapshots" / ".." / "config.json").write_text("{}")  # the repo folder as a snapshot
    (repo / "refs" / "main").write_bytes(ref)
    (line,) = audit(capsys, EXIT["refused"]).splitlines()
    assert re.fullmatch(
        rf"specbind: error: {re.escape(str(repo))}/refs/main: holds {shows}, not a commit hash "
        r"\(40 lowercase hex digits, as huggingface_hub writes it\): the cache entry is damaged; "
        r"pass the snapshot directory to read",
        line,
    ), line


def test_a_refs_main_of_ten_megabytes_is_refused_in_a_short_line(
    capsys: pytest.CaptureFixture[str], ckpt: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    repo = hub(tmp_path, ckpt)
    (repo / "refs" / "main").write_text("a" * 10_000_000)
    (line,) = audit(capsys, EXIT["refused"]).splitlines()
    assert len(line) < 400, f"{len(line)} characters"
    assert "refs/main: holds 10000000 B, not a commit hash" in line


def test_a_huge_refs_main_is_read_bounded_not_whole(ckpt: Path, tmp_path: Path) -> None:
    """A sparse file of 64 MiB: reading it whole would allocate 64 MiB; the ref is at most 64 B."""
    repo = hub(tmp_path, ckpt)
    with (repo / "refs" / "main").open("wb") as f:
        f.truncate(64 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"refs/main: holds 67108864 B, not a commit"):
            resolve(ID, {"HF_HUB_CACHE": str(tmp_path)})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} B allocated to read refs/main"


def test_a_refs_main_that_is_a_fifo_is_refused_without_waiting_for_a_writer(
    ckpt: Path, tmp_path: Path
) -> None:
    repo = hub(tmp_path, ckpt)
    os.mkfifo(repo / "refs" / "main")
    with pytest.raises(CheckpointError, match=r"refs/main: is not a regular file"):
        resolve(ID, {"HF_HUB_CACHE": str(tmp_path)})


def test_a_refs_main_naming_a_snapshot_the_cache_lacks_is_refused_not_replaced_by_another(
    capsys: pytest.CaptureFixture[str], ckpt: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    repo = hub(tmp_path, ckpt, (OTHER,))
    (repo / "refs" / "main").write_text(HASH)
    (line,) = audit(capsys, EXIT["refused"]).splitlines()
    assert line == (
        f"specbind: error: {repo}/refs/main: names revision {HASH}, but "
        f"{repo}/snapshots/{HASH} is not there (snapshots there: '{OTHER}'): download it "
        "again, or pass the snapshot to read"
    )


@pytest.mark.parametrize("ending", ["", "\n"])
def test_a_refs_main_as_huggingface_hub_writes_it_reads_its_snapshot(
    capsys: pytest.CaptureFixture[str], ckpt: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, ending: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    repo = hub(tmp_path, ckpt, (HASH, OTHER))
    (repo / "refs" / "main").write_text(HASH + ending)
    err = audit(capsys, EXIT["ok"])
    assert f"{repo}/snapshots/{HASH} (revision {HASH}, refs/main)" in err


def test_the_api_opens_a_hub_id_from_the_local_hub_cache_as_the_cli_does(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    repo = hub(tmp_path, ckpt, (HASH, OTHER))
    (repo / "refs" / "main").write_text(HASH)
    ck = specbind.open(ID)
    assert ck.path == repo / "snapshots" / HASH
    assert ck.audit()["ok"]
    (repo / "refs" / "main").write_text("..")
    with pytest.raises(CheckpointError, match=r"refs/main: holds b'\.\.', not a commit hash"):
        specbind.open(ID)
