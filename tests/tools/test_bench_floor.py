"""``python -m benchmarks.floor``: the four ways of landing a checkpoint's bytes, each timed
over every tensor of the folder (the figures themselves are the log's, by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.floor import main, tensors


def test_the_floor_times_every_way_over_every_tensors_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specbind.cli import main as cli

    assert cli(["synth", "--model", "llama", str(tmp_path / "ckpt")]) == 0
    jobs, _ = tensors(tmp_path / "ckpt")
    total = sum(n for _, _, n in jobs)
    capsys.readouterr()  # synth's own lines
    main([str(tmp_path / "ckpt"), "--repeat", "2", "--threads", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{total / 1e9:.3f} GB, {len(jobs)} tensors, 2 threads")
    assert [line.split()[0] for line in out[1:]] == ["fresh", "faulted", "touch", "populate"]


def test_a_folder_with_no_tensors_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no \*\.safetensors tensors"):
        tensors(tmp_path)
