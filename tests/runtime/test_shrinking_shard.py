"""A shard truncated while a bind reads it is refused in one line naming the file, never a SIGBUS
(exit 135, no word) and never a bind of zeros: each tensor is taken after one ``fstat`` of its
file, a short ``preadv`` asks again, the CLI bind asks once more before it keeps its output, and
a fault in between is one line and exit 1 (``specbind.sigbus``).

Each case runs ``specbind bind`` in a child process with a hook of this test (never of
specbind) that truncates the shard at a chosen point: after a tensor is taken and before its
bytes are read, or just before the bind reads a view it already holds."""

from __future__ import annotations

import json
import re
import shutil
import struct
import sys
from pathlib import Path

import patience
import pytest

from specbind.cli import EXIT
from specbind.generated import MODELS
from specbind.synth import synth, tiny_values

LLAMA = MODELS["llama"]
SHARD = "model-00001-of-00002.safetensors"

# argv: shard file name, size to truncate it to, when ("first": after its first tensor is taken;
# "last": after the tensor at its end is taken; "view": before the bind starts, a view already
# held and read after the truncation), then the CLI's arguments
HOOK = r"""
import json, os, struct, sys
from specbind.runtime.io import safetensors_file as sf
from specbind.runtime.bind import bind as bind_module
from specbind.cli import main

shard, size, when = sys.argv[1], int(sys.argv[2]), sys.argv[3]
done = []

def cut(path):
    done.append(path)
    os.truncate(path, size)

original_raw = sf.SafetensorsFile.raw

def raw(self, name):
    got = original_raw(self, name)  # checked: the file shrinks after, before the bytes are read
    if not done and self.path.name == shard:
        last = max(self.entries.values(), key=lambda e: e.end).name
        if when == "first" or (when == "last" and name == last):
            cut(self.path)
    return got

original_bind = bind_module.bind_checkpoint

def bind_checkpoint(ckpt, *args, **kwargs):
    if when == "view":
        name = next(n for n in ckpt.names() if ckpt.file_of(n) == shard)
        view = ckpt.get(name).data  # taken while the file is whole
        cut(ckpt.root / shard)
        bytes(view)  # read from the map past the file's new end: SIGBUS
    return original_bind(ckpt, *args, **kwargs)

sf.SafetensorsFile.raw = raw
bind_module.bind_checkpoint = bind_checkpoint
sys.exit(main(sys.argv[4:]))
"""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shrink") / "ll"
    synth(LLAMA, out, tiny_values(LLAMA), layers=2, seed=6, shards=2)
    return out


def run(ckpt: Path, tmp_path: Path, size: int, when: str, *flags: str) -> tuple[int, str]:
    """``specbind bind`` of a copy of ``ckpt`` through the hook: (status, stderr)."""
    copy = tmp_path / "ck"
    shutil.copytree(ckpt, copy)
    proc = patience.run(
        [sys.executable, "-c", HOOK, SHARD, str(size), when, "bind", str(copy), *flags],
        capture_output=True, text=True, cpu=300,
    )  # fmt: skip
    return proc.returncode, proc.stderr


def size_of(path: Path) -> int:
    return path.stat().st_size


def refusal(shard: str, now: int, was: int) -> str:
    return (
        rf"specbind: error: (layer \d+: )?{re.escape(shard)}: is {now} B now, {was} B when opened "
        r"\(reading [^)]+\): the file was truncated or rewritten while it was read; bind it "
        r"again once nothing writes it"
    )


@pytest.mark.parametrize("flags", [(), ("--tp-size", "2", "--tp-rank", "1"), ("--out", "OUT")])
def test_a_shard_truncated_after_a_tensor_is_taken_is_refused_in_one_line_naming_it(
    ckpt: Path, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    out = tmp_path / "bound.safetensors"
    flags = tuple(str(out) if f == "OUT" else f for f in flags)
    was = size_of(ckpt / SHARD)
    code, err = run(ckpt, tmp_path, 0, "first", *flags)
    assert code == EXIT["refused"], err  # before: SIGBUS, or exit 0 without --out
    (line,) = err.splitlines()
    assert re.fullmatch(refusal(SHARD, 0, was), line), line
    assert not out.exists() and not list(tmp_path.glob(".bound*")), "nothing kept"


def test_a_shard_cut_inside_its_last_page_is_refused_not_bound_with_zeros(
    ckpt: Path, tmp_path: Path
) -> None:
    """A few bytes off the end: the last page is still mapped (it would read zeros, not fault)."""
    was = size_of(ckpt / SHARD)
    out = tmp_path / "bound.safetensors"
    code, err = run(ckpt, tmp_path, was - 6, "last", "--out", str(out))
    assert code == EXIT["refused"], err
    (line,) = err.splitlines()
    assert re.fullmatch(refusal(SHARD, was - 6, was), line), line
    assert not out.exists()


def test_a_read_of_a_view_past_the_files_new_end_is_one_line_and_exit_1_not_sigbus(
    ckpt: Path, tmp_path: Path
) -> None:
    """The window no check closes: the view taken, then the file cut, then the view read. The
    fault is caught (``specbind.sigbus``), named by file and byte, and ends the bind."""
    was = size_of(ckpt / SHARD)
    code, err = run(ckpt, tmp_path, 0, "view")
    assert code == EXIT["refused"], f"exit {code}: {err}"  # before: -7 (SIGBUS), no message
    (line,) = err.splitlines()
    assert line.startswith(f"specbind: error: {SHARD}: is 0 B now, {was} B when opened")
    assert "(reading byte " in line


def test_a_shard_truncated_after_open_is_refused_by_the_api_before_any_read(
    ckpt: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "ck"
    shutil.copytree(ckpt, copy)
    script = (
        "import os, sys, specbind\n"
        "from specbind.core.errors import CheckpointError\n"
        f"ck = specbind.open({str(copy)!r})\n"
        f"os.truncate({str(copy / SHARD)!r}, 0)\n"
        "try:\n"
        "    m = ck.bind()\n"
        "    print(sum(int(t.view('u1').sum()) for t in m.tensors().values()))\n"
        "except CheckpointError as e:\n"
        "    print('refused:', e)\n"
    )
    proc = patience.run([sys.executable, "-c", script], capture_output=True, text=True, cpu=300)
    assert proc.returncode == 0, proc.stderr  # before: killed by SIGBUS
    assert proc.stdout.startswith(f"refused: layer 0: {SHARD}: is 0 B now"), proc.stdout


def test_the_second_synth_shard_ends_with_its_last_tensors_bytes(ckpt: Path) -> None:
    """The fixture the cases lean on: the shard holds tensors and ends with the last one's
    bytes (so 'last' is the tensor whose page a few bytes off the end cuts)."""
    data = (ckpt / SHARD).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    assert len(ends) > 1 and 8 + n + max(ends) == len(data)
