"""`python -m benchmarks --ranks N --loaders` rows, on a tiny checkpoint: N workers bind their own
rank's share, and a loader that is not installed is skipped with a note, never an error."""

from __future__ import annotations

import sys
from pathlib import Path

import patience
import pytest
from helpers import TABLE

from benchmarks import ranks as bench_ranks


@pytest.fixture(scope="module")
def ck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("benchranks") / "ck"
    proc = patience.run(
        [sys.executable, "-m", "specbind", "synth", str(d), "--seed", "4"],
        capture_output=True, text=True, cpu=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return d


def test_two_rank_workers_each_bind_half_of_what_one_rank_binds_at_tp2(ck: Path) -> None:
    row = bench_ranks.ranks_row(ck, 2, 1)
    whole = sum(a.nbytes for a in bench_ranks._bind_fields(ck, TABLE, 1, 0))
    a, b = row["bytes_per_rank"]
    assert a == b and whole / 2 <= a < whole  # the replicated norms are held by both
    assert row["concurrent_s"] > 0 and row["sequential_s"] > 0
    assert "| 2 | " in "\n".join(bench_ranks.render([row], None))


def test_a_loader_that_is_not_installed_is_skipped_with_a_note(
    ck: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        bench_ranks, "LOADERS", {"no-such-loader": ("no_such_loader_module", lambda *a: 0)}
    )
    got = bench_ranks.loader_rows(ck, TABLE, 1)
    assert [r["loader"] for r in got["rows"]] == ["specbind"]
    assert got["rows"][0]["bytes"] == sum(
        a.nbytes for a in bench_ranks._bind_fields(ck, TABLE, 1, 0)
    )
    assert got["skipped"] == [
        "no-such-loader: not installed (pip install no-such-loader); row skipped"
    ]
