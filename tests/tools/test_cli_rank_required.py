"""A tp size above 1 with no rank, outside a launcher, is refused in one line (never rank 0).

Each run is in-process (``specbind.cli.main``) with a scrubbed environment: no torchrun or
mpirun variable, so only the flags can give the rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specbind.cli import EXIT, main

LAUNCHER_VARS = (
    "WORLD_SIZE", "RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "MASTER_ADDR",
    "MASTER_PORT", "LOCAL_RANK",
)  # fmt: skip


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rank") / "tiny"
    assert main(["synth", str(out), "--model", "llama", "--seed", "5"]) == 0
    return out


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in LAUNCHER_VARS:
        monkeypatch.delenv(k, raising=False)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("specbind: error: "), err
    return err


@pytest.mark.parametrize("tp", [2, 4])
def test_a_bind_at_tp_above_one_without_a_rank_outside_a_launcher_is_refused_naming_the_flag(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], tp: int
) -> None:
    out = tmp_path / "r.safetensors"
    assert main(["bind", str(ckpt), "--tp-size", str(tp), "--out", str(out)]) == EXIT["usage"]
    err = _one_line(capsys)
    assert f"--tp-size {tp} without --tp-rank outside a launcher" in err
    assert f"--tp-rank 0..{tp - 1}" in err
    assert not out.exists(), "nothing written for a rank nobody named"


def test_a_launcher_size_without_its_rank_is_refused_naming_the_variables(
    ckpt: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert main(["bind", str(ckpt)]) == EXIT["usage"]
    err = _one_line(capsys)
    assert "tp size 2 (from OMPI_COMM_WORLD_SIZE/OMPI_COMM_WORLD_RANK) without --tp-rank" in err


def test_the_rank_from_a_flag_or_a_launcher_still_binds_and_tp_one_needs_none(
    ckpt: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    assert main(["bind", str(ckpt), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tp_size"] == 1
    assert main(["bind", str(ckpt), "--tp-size", "2", "--tp-rank", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tp_rank"] == 1
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    assert main(["bind", str(ckpt), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["tp_size"], rep["tp_rank"]) == (2, 1)


@pytest.mark.parametrize("command", ["bind", "bench"])
def test_an_ep_size_above_one_without_an_ep_rank_is_refused_naming_the_flag(
    ckpt: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert main([command, str(ckpt), "--ep-size", "2"]) == EXIT["usage"]
    err = _one_line(capsys)
    assert "--ep-size 2 without --ep-rank" in err and "--ep-rank 0..1" in err


@pytest.mark.parametrize("what", ["tp", "ep"])
def test_the_python_apis_bind_of_a_size_above_1_without_a_rank_is_refused_never_rank_0(
    ckpt: Path, what: str
) -> None:
    """``Checkpoint.bind(tp_size=2)`` and ``bind_for_engine(..., tp_size=2)`` name the missing
    rank; a size of 1 needs none."""
    import specbind
    from specbind.core.errors import GeometryError
    from specbind.engine import bind_for_engine

    c = specbind.open(ckpt)
    with pytest.raises(GeometryError, match=rf"^bind: {what}_size=2 without {what}_rank: "):
        c.bind(**{f"{what}_size": 2})
    assert c.bind(**{f"{what}_size": 1}).tp_rank == 0
    if what == "tp":
        with pytest.raises(GeometryError, match=r"tp_size=2 without tp_rank"):
            bind_for_engine(ckpt, "vllm", tp_size=2)
