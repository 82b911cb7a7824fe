"""The checks ranks make together, in one process and without torch: the coverage proof over
real plans of every rank, the agreement refusal, the rank layout, and the CLI's refusals.

A ``ScriptedComm`` plays the other ranks: its collectives return this rank's object beside
what the test says the others sent, so a disagreement reaches ``distributed.run`` exactly as
an all-gather would deliver it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import patience
import pytest
from helpers import TABLE
from rank_pieces import every_rank

from specbind.core.errors import DistributedError, GeometryError
from specbind.core.planning import Ranks
from specbind.generated import SPECS_SHA256
from specbind.runtime.binder.backends import NUMPY
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.ranks import agreement, byte_coverage, distributed


@pytest.fixture(scope="module")
def ck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ranks") / "ck"
    proc = patience.run(
        [sys.executable, "-m", "specbind", "synth", str(d), "--seed", "2"],
        capture_output=True, text=True, cpu=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return d


def pieces(ck: Path, tp: int, ep: int) -> tuple[list[list[byte_coverage.Piece]], set[str]]:
    """Every rank's planned pieces at tp x ep, in rank order, and the names to be covered."""
    return every_rank(ck, TABLE, tp, ep)


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (4, 1), (2, 3)])
def test_every_rank_plans_read_every_tensor_exactly_once_per_replica(
    ck: Path, tp: int, ep: int
) -> None:
    by_rank, claimed = pieces(ck, tp, ep)
    assert byte_coverage.check(by_rank, claimed) == []
    got = byte_coverage.summary(by_rank)
    assert got["tensors"] == len(claimed) == len(CheckpointDir(ck).names())
    assert (got["sharded"] > 0) == (tp > 1)


def test_a_missing_tp_rank_leaves_each_sharded_tensor_with_a_gap(ck: Path) -> None:
    by_rank, claimed = pieces(ck, 4, 1)
    problems = byte_coverage.check([by_rank[0], by_rank[1], by_rank[3]], claimed)
    assert problems and all("read by no rank" in p or "expected 4 rank(s)" in p for p in problems)
    assert any(p.endswith("of each row are read by no rank") for p in problems)


def test_a_rank_reading_another_ranks_shard_is_refused_as_read_twice(ck: Path) -> None:
    by_rank, claimed = pieces(ck, 2, 1)
    problems = byte_coverage.check([by_rank[0], by_rank[0]], claimed)
    twice = [p for p in problems if p.endswith("are read by ranks 0,1, expected 1 rank(s)")]
    gaps = [p for p in problems if p.endswith("of each row are read by no rank")]
    assert twice and len(twice) == len(gaps)  # each sharded tensor: its first half twice, no second


def test_an_ep_rank_that_is_missing_leaves_its_experts_read_by_no_rank(ck: Path) -> None:
    by_rank, claimed = pieces(ck, 1, 2)
    problems = byte_coverage.check([by_rank[0]], claimed)
    unread = [p for p in problems if p.endswith(": no rank reads it")]
    assert unread and all(".experts." in p for p in unread)


def test_a_replicated_range_with_another_digest_is_named_with_both_ranks(ck: Path) -> None:
    by_rank, claimed = pieces(ck, 2, 1)
    i, victim = next((i, p) for i, p in enumerate(by_rank[1]) if p.name == "norm.weight")
    assert victim.digest and victim.width == victim.nbytes  # replicated: whole, compared
    by_rank[1][i] = replace(victim, digest="0" * 32)
    problems = byte_coverage.check(by_rank, claimed)
    assert len(problems) == 1
    assert problems[0].startswith(f"norm.weight: bytes [0, {victim.nbytes}) differ between ranks: ")
    assert problems[0].endswith("on rank 0 but 000000000000 on rank 1")


def test_ranks_are_tp_innermost_and_a_world_the_sizes_do_not_make_is_refused() -> None:
    assert [distributed.place(6, r, None, 2) for r in (0, 2, 3, 5)] == [
        Ranks(3, 0, 2, 0), Ranks(3, 2, 2, 0), Ranks(3, 0, 2, 1), Ranks(3, 2, 2, 1),
    ]  # fmt: skip
    with pytest.raises(GeometryError, match=r"--tp-size 2 x --ep-size 2 = 4 ranks, but 6 rank"):
        distributed.place(6, 0, 2, 2)
    with pytest.raises(GeometryError, match=r"--ep-size 4 does not divide the 6 rank"):
        distributed.place(6, 0, None, 4)


def test_disagreements_name_the_fact_and_which_ranks_hold_which_value() -> None:
    a = {"spec hash": "aa", "size of x.safetensors": "10 B"}
    b = {"spec hash": "aa", "size of x.safetensors": "9 B"}
    assert agreement.disagreements([a, a, b]) == [
        "size of x.safetensors: 10 B on ranks 0,1; 9 B on rank 2"
    ]
    assert agreement.disagreements([a, {"spec hash": "aa"}]) == [
        "size of x.safetensors: 10 B on rank 0; absent on rank 1"
    ]


class ScriptedComm:
    """Rank 0 of a world of two; rank 1's all-gather payloads are ``edit``(rank 0's)."""

    rank = 0
    world = 2
    backend = "scripted"

    def __init__(self, edit: Any) -> None:
        self.edit = edit

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj, self.edit(obj)]

    def gather(self, obj: Any) -> list[Any] | None:
        return [obj, obj]

    def broadcast(self, obj: Any) -> Any:
        return obj

    def close(self) -> None:
        pass


def job(ck: Path, out: Path | None = None) -> distributed.Job:
    return distributed.Job(ck, TABLE, SPECS_SHA256, {}, None, 1, NUMPY, out)


def test_a_rank_built_from_other_specs_makes_every_rank_refuse_naming_the_spec_hash(
    ck: Path,
) -> None:
    def other_specs(status: Any) -> Any:
        err, desc = status
        return err, {**desc, "spec hash": "0123456789abcdef"}

    with pytest.raises(DistributedError) as e:
        distributed.run(job(ck), ScriptedComm(other_specs))
    assert str(e.value) == (
        "the ranks disagree, so none binds: spec hash: "
        f"{SPECS_SHA256[:16]} on rank 0; 0123456789abcdef on rank 1"
    )


def test_another_ranks_error_is_raised_here_naming_that_rank(ck: Path, tmp_path: Path) -> None:
    def fails(status: Any) -> Any:
        return "model-00001-of-00002.safetensors: cannot open: No such file or directory", None

    with pytest.raises(DistributedError) as e:
        distributed.run(job(ck, tmp_path / "out"), ScriptedComm(fails))
    assert str(e.value) == (
        "rank 1 of 2 failed while reading the checkpoint: "
        "model-00001-of-00002.safetensors: cannot open: No such file or directory"
    )
    assert not (tmp_path / "out").exists()


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; from specbind.cli import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'the single-rank path imported torch'; sys.exit(rc)"
    )
    return patience.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cpu=120,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_single_rank_out_dir_writes_one_file_and_the_index_without_importing_torch(
    ck: Path, tmp_path: Path
) -> None:
    proc = cli("bind", str(ck), "--out-dir", str(tmp_path / "d"), "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert (rep["world"], rep["collectives"]) == (1, "local")
    index = json.loads((tmp_path / "d" / "specbind-index.json").read_text())
    assert [r["file"] for r in index["ranks"]] == ["rank-00000-of-00001.safetensors"]
    assert index["specs_sha256"] == SPECS_SHA256


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--out-dir", "D", "--tp-rank", "1"], {}, "--tp-rank with --out-dir or under torchrun"),
        (["--out-dir", "D", "--tp-size", "2"], {}, "--tp-size 2 x --ep-size 1 = 2 ranks, but 1"),
        (
            ["--out", "x.safetensors"],
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "0"},
            "--out under torchrun: every rank would write the same file; use --out-dir",
        ),
    ],
)
def test_rank_flags_that_cannot_hold_are_refused_in_one_line(
    ck: Path, tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    args = [str(tmp_path / a) if a == "D" else a for a in args]
    proc = cli("bind", str(ck), *args, env=env)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_mpirun_variables_still_bind_one_rank_alone(ck: Path, tmp_path: Path) -> None:
    env = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}
    proc = cli("bind", str(ck), "--json", "--out", str(tmp_path / "r1.safetensors"), env=env)
    assert proc.returncode == 0, proc.stderr
    assert (json.loads(proc.stdout)["tp_size"], json.loads(proc.stdout)["tp_rank"]) == (2, 1)


class FailingStep:
    """A world of one whose ``n``-th all-gather reports this rank failed (as if it had)."""

    rank = 0
    world = 1
    backend = "scripted"

    def __init__(self, n: int) -> None:
        self.n = n

    def all_gather(self, obj: Any) -> list[Any]:
        self.n -= 1
        return [("No space left on device", None)] if self.n == 0 else [obj]

    def gather(self, obj: Any) -> list[Any] | None:
        return [obj]

    def broadcast(self, obj: Any) -> Any:
        return obj

    def close(self) -> None:
        pass


def test_a_failure_while_binding_leaves_no_index_so_the_directory_is_not_a_finished_bind(
    ck: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    distributed.run(job(ck, out), FailingStep(0))  # a whole run: files and the index
    assert (out / "specbind-index.json").exists()
    with pytest.raises(
        DistributedError, match=r"^rank 0 of 1 failed while binding its shard: No space"
    ):
        distributed.run(job(ck, out), FailingStep(3))  # prepare, plan, then bind fails
    assert not (out / "specbind-index.json").exists(), "the previous index would name a mixed set"


@dataclass
class _Place:
    """Just what ``distributed._prepare`` reads of a communicator: this rank and the world."""

    rank: int
    world: int


@pytest.mark.parametrize("ep", [1, 2, 3])
def test_a_quantized_checkpoint_is_covered_as_its_packed_weights_and_companions(
    tmp_path: Path, ep: int
) -> None:
    """The coverage proof plans a quantized linear as bind reads it: packed bytes and each
    scale, every one read exactly once per replica (a plan that ignored the scheme would leave
    every scale read by no rank), and a single-rank --out-dir holds what bind binds."""
    from specbind import open_bound
    from specbind.cli import main
    from specbind.runtime.bind.bind import bind_checkpoint

    ck = tmp_path / "q"
    assert main(["synth", str(ck), "--layers", "4", "--quant", "nvfp4-modelopt"]) == 0
    job = distributed.Job(
        ckpt=ck, table=TABLE, specs_sha256=SPECS_SHA256, overrides={}, tp_size=1, ep_size=ep,
        backend=NUMPY, out_dir=None,
    )  # fmt: skip
    by_rank: list[list[byte_coverage.Piece]] = []
    for r in range(ep):
        p = distributed._prepare(job, _Place(r, ep))  # type: ignore[arg-type]
        by_rank.append(byte_coverage.plan_pieces(
            p.view, TABLE, p.lay, p.geometry, p.ranks, lambda i, s, p=p: p.quant.get((i, s))
        ))  # fmt: skip
    names = {x.name for pieces in by_rank for x in pieces}
    assert byte_coverage.check(by_rank, names) == []
    assert names == set(CheckpointDir(ck).names())
    assert any(n.endswith(".weight_scale") for n in names)
    if ep == 1:
        out = tmp_path / "out"
        assert main(["bind", str(ck), "--out-dir", str(out)]) == 0
        f = open_bound(out / "rank-00000-of-00001.safetensors")
        mem = bind_checkpoint(CheckpointDir(ck), TABLE, progress=False).fields()
        assert sorted(f.tensors) == sorted(mem)
        assert any(n.endswith("_weight_scale") for n in f.tensors)
