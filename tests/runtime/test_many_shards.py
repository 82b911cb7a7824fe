"""A checkpoint of many shards binds under a common open-file limit: one descriptor per open
shard, and a soft ``RLIMIT_NOFILE`` raised (never past the hard one) when the shards need it;
past the hard limit, one line naming it before any shard is opened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import patience
import pytest

from specbind.cli import main

REPO = Path(__file__).resolve().parents[2]
SHARDS = 98  # every tensor of a two-layer synth in a file of its own


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("many") / "ckpt"
    assert main(["synth", str(out), "--layers", "2", "--shards", str(SHARDS)]) == 0
    assert len(list(out.glob("*.safetensors"))) == SHARDS
    return out


def bind_under(ckpt: Path, out: Path, soft: int, hard: int) -> subprocess.CompletedProcess[str]:
    code = (
        "import resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
        f"sys.argv = ['specbind', 'bind', {str(ckpt)!r}, '--tp-size', '2', '--tp-rank', '1', "
        f"'--out', {str(out)!r}, '--no-progress']; "
        "from specbind.cli import entry; entry()"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return patience.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cpu=120, env=env
    )


def test_a_checkpoint_of_more_shards_than_half_the_limit_binds_one_descriptor_each(
    ckpt: Path, tmp_path: Path
) -> None:
    """Soft = hard = 1.4 x the shards: two descriptors a shard cannot fit, one can."""
    limit = SHARDS * 14 // 10
    proc = bind_under(ckpt, tmp_path / "r1.safetensors", limit, limit)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "r1.safetensors").stat().st_size > 0


def test_a_soft_limit_below_the_shard_count_is_raised_toward_the_hard_one(
    ckpt: Path, tmp_path: Path
) -> None:
    """The 1,024-soft / high-hard default, scaled down: soft 64 for 98 shards."""
    proc = bind_under(ckpt, tmp_path / "r1.safetensors", 64, 4 * SHARDS)
    assert proc.returncode == 0, proc.stderr


def test_a_hard_limit_below_the_shard_count_is_one_line_naming_it(
    ckpt: Path, tmp_path: Path
) -> None:
    proc = bind_under(ckpt, tmp_path / "r1.safetensors", 64, 64)
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        f"specbind: error: {ckpt}: {SHARDS} shard files to open at once, but this process may "
        "hold at most 64 open files (RLIMIT_NOFILE hard limit; at least "
    ), proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "r1.safetensors").exists()
