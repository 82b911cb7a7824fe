"""The temp file of ``bind --out`` / ``--out-dir`` (``runtime/io/atomic.py``): its name fits in
NAME_MAX, a writer killed outright leaves one that the next write to the same target removes
(and says so) while a live writer's is never touched, and a full disk is one line naming the
file, with no file left behind."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import patience
import pytest

from specbind.cli import main
from specbind.runtime.io import atomic

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("temp") / "tiny"
    assert main(["synth", str(out), "--layers", "1"]) == 0
    return out


def temps(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp"))


# -- the temp name -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a" * 242 + ".safetensors", "é" * 120 + ".safetensors"])
def test_every_temp_name_of_a_long_target_fits_in_name_max_and_names_that_target(
    name: str,
) -> None:
    assert len(os.fsencode(name)) <= 255
    stem = atomic.temp_stem(name)
    longest = f".{stem}.4194304-0123abcd.tmp"
    assert len(os.fsencode(longest)) <= 255
    assert stem == atomic.temp_stem(name), "every writer of the target uses the same stem"
    assert stem != atomic.temp_stem(name[:-1] + "x"), "another target: another stem"


def test_a_legal_252_byte_out_name_binds(ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / ("r" * 240 + ".safetensors")
    assert len(out.name) == 252
    assert main(["bind", str(ckpt), "--out", str(out), "--no-progress"]) == 0
    assert out.stat().st_size > 0 and temps(tmp_path) == []


# -- a writer killed outright ----------------------------------------------------------------

_PAUSED_CHILD = """
import sys, time
from pathlib import Path
from specbind.runtime.bound import stream_out
real = stream_out.StreamWriter.tensor
def tensor(self, name, host):
    real(self, name, host)
    Path(sys.argv[1]).write_text("writing")
    time.sleep(600)
stream_out.StreamWriter.tensor = tensor
from specbind.cli import main
sys.exit(main(sys.argv[2:]))
"""


def paused_writer(marker: Path, *argv: str) -> subprocess.Popen[bytes]:
    """A ``specbind`` child that stops for good after its first tensor is written."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", _PAUSED_CHILD, str(marker), *argv], env=env)
    watch = patience.Watch([child], cpu=120)  # not a wall deadline: a loaded machine is slower
    while not marker.exists() and child.poll() is None:
        time.sleep(0.05)
        watch.check("a bind that was to write its first tensor")
    assert marker.exists(), f"the child did not start writing (exit {child.poll()})"
    return child


def killed_writer(marker: Path, *argv: str) -> None:
    child = paused_writer(marker, *argv)
    child.send_signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL  # SIGKILL cannot be caught: it ends, load or not


@pytest.mark.parametrize("how", ["--out", "--out-dir"])
def test_a_later_bind_removes_the_temp_a_sigkilled_bind_left_and_says_so(
    ckpt: Path, tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "d"
    d.mkdir()
    target = d / "rank.safetensors" if how == "--out" else d
    file = target if how == "--out" else d / "rank-00000-of-00001.safetensors"
    killed_writer(tmp_path / "marker", "bind", str(ckpt), how, str(target), "--no-progress")
    left = temps(d)
    assert len(left) == 1 and left[0].startswith(f".{file.name}."), left
    size = (d / left[0]).stat().st_size
    assert size > 0
    capsys.readouterr()
    assert main(["bind", str(ckpt), how, str(target), "--no-progress"]) == 0
    err = capsys.readouterr().err
    note = [line for line in err.splitlines() if "temp file" in line]
    assert note == [
        f"specbind: note: removed 1 temp file(s) of an earlier write to {file} that did not "
        f"finish ({left[0]}; {size} B; their writers are gone)"
    ]
    assert temps(d) == [] and file.stat().st_size > 0


def test_a_live_writers_temp_is_left_alone_by_a_bind_to_the_same_file(
    ckpt: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rank.safetensors"
    child = paused_writer(tmp_path / "marker", "bind", str(ckpt), "--out", str(out))
    try:
        (live,) = temps(tmp_path)
        assert main(["bind", str(ckpt), "--out", str(out), "--no-progress"]) == 0
        assert temps(tmp_path) == [live], "the live writer keeps its temp file"
    finally:
        child.kill()
        child.wait()


def test_an_unlocked_temp_of_a_live_pid_is_kept_while_new_and_removed_once_stale(
    tmp_path: Path,
) -> None:
    """The instant between a writer creating its temp and locking it: the pid is alive and
    the file new, so it stays; the same file long after (the pid reused) is stale."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        out = tmp_path / "x.safetensors"
        tmp = tmp_path / f".x.safetensors.{sleeper.pid}-0123abcd.tmp"
        tmp.write_bytes(b"half")
        notes: list[str] = []
        assert atomic.remove_stale(out, notes.append) == [] and tmp.exists() and notes == []
        old = time.time() - 2 * atomic.STALE_S
        os.utime(tmp, (old, old))
        assert atomic.remove_stale(out, notes.append) == [tmp.name] and not tmp.exists()
        assert len(notes) == 1 and str(out) in notes[0]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_only_the_temps_of_the_same_target_are_candidates(tmp_path: Path) -> None:
    other = tmp_path / ".y.safetensors.999999999-0123abcd.tmp"  # another target's, dead pid
    odd = tmp_path / ".x.safetensors.abcdefgh.tmp"  # mkstemp's name: no pid, not ours to judge
    for p in (other, odd):
        p.write_bytes(b"")
    assert atomic.remove_stale(tmp_path / "x.safetensors", lambda s: None) == []
    assert other.exists() and odd.exists()


# -- a full disk -----------------------------------------------------------------------------


class _Full:
    """A file whose writes fail with ENOSPC once ``room`` bytes are written."""

    def __init__(self, f: Any, room: int) -> None:
        self._f, self._room = f, room

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        if n > self._room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= n
        return int(self._f.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


@pytest.mark.parametrize("how", ["--out", "--out-dir"])
def test_a_full_disk_at_the_header_reservation_names_the_file_and_leaves_nothing(
    ckpt: Path,
    tmp_path: Path,
    how: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    real = os.fdopen
    monkeypatch.setattr(atomic.os, "fdopen", lambda *a, **k: _Full(real(*a, **k), 0))
    d = tmp_path / "d"
    d.mkdir()
    target = d / "rank.safetensors" if how == "--out" else d
    file = target if how == "--out" else d / "rank-00000-of-00001.safetensors"
    assert main(["bind", str(ckpt), how, str(target), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"specbind: error: (rank 0 of 1 failed while binding its shard: )?"
        rf"{re.escape(str(file))}: writing failed at byte 0: No space left on device\n",
        err,
    ), err
    assert list(d.iterdir()) == []


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Any:
    """A 64 KiB tmpfs, where this process may mount one (root on Linux); skipped elsewhere."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True
        ).returncode
    ):
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.parametrize("how", ["--out", "--out-dir"])
def test_a_real_full_disk_names_the_file_and_leaves_no_partial_or_temp_file(
    ckpt: Path, tiny_fs: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tiny_fs / "rank.safetensors" if how == "--out" else tiny_fs / "d"
    file = target if how == "--out" else target / "rank-00000-of-00001.safetensors"
    assert main(["bind", str(ckpt), how, str(target), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{file}: writing failed at byte " in err, err
    assert err.endswith(": No space left on device\n"), err
    assert sorted(p.name for p in tiny_fs.rglob("*") if p.is_file()) == []
