"""Binding across ranks under torchrun, on CPU with gloo: one host, two "nodes" on localhost, a
corrupt shard on one node, bytes that differ between nodes, and a killed rank.

Every run here is a real torchrun (``python -m torch.distributed.run``) of the CLI; the
per-rank files are read back with the safetensors library and rejoined to the tp=1 bind.
Budget: these tests start torch in 2-4 processes per run; all of them stay under two minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import patience
import pytest
from free_port import free_port
from helpers import copy_with, field_rules, read_file, rejoin
from torchrun_ranks import BOUND, finish, load_dir, torchrun

pytest.importorskip("torch")
pytestmark = pytest.mark.interop


def specbind(*args: str) -> subprocess.CompletedProcess[str]:
    return patience.run(
        [sys.executable, "-m", "specbind", *args], capture_output=True, text=True, cpu=BOUND
    )


def assert_rejoins(d: Path, full: dict[str, np.ndarray[Any, Any]]) -> None:
    index, ranks, meta = load_dir(d)
    tp, ep = index["tp_size"], index["ep_size"]
    rules = field_rules(meta)
    where = {(r["tp_rank"], r["ep_rank"]): i for i, r in enumerate(index["ranks"])}
    assert sorted(where) == [(t, e) for t in range(tp) for e in range(ep)]
    assert all(set(r) == set(full) for r in ranks)
    for name, want in full.items():
        shares = {k: ranks[i][name] for k, i in where.items()}
        assert rejoin(rules[name], shares, tp, ep).tobytes() == want.tobytes(), name


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("dist")
    ck = d / "ck"
    proc = specbind("synth", str(ck), "--seed", "5")
    assert proc.returncode == 0, proc.stderr
    proc = specbind("bind", str(ck), "--out-dir", str(d / "tp1"), "--json")
    assert proc.returncode == 0, proc.stderr
    index, ranks, _ = load_dir(d / "tp1")
    assert (index["world"], index["tp_size"], index["ep_size"]) == (1, 1, 1)
    return {"dir": d, "ck": ck, "full": ranks[0]}


def test_four_ranks_on_one_host_bind_tp2_ep2_shards_that_rejoin_to_the_tp1_bind(
    ckpt: dict[str, Any],
) -> None:
    out = ckpt["dir"] / "four"
    (rc, so, se), = finish(
        torchrun(4, "bind", str(ckpt["ck"]), "--out-dir", str(out), "--ep-size", "2", "--json")
    )  # fmt: skip
    assert rc == 0, se
    rep = json.loads(so)  # rank 0 alone prints, and prints one JSON document
    assert (rep["world"], rep["tp_size"], rep["ep_size"], rep["collectives"]) == (4, 2, 2, "gloo")
    assert [(r["tp_rank"], r["ep_rank"]) for r in rep["ranks"]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    cov = rep["coverage"]
    assert cov["tensors"] == len(
        json.loads((ckpt["ck"] / "model.safetensors.index.json").read_text())["weight_map"]
    )
    assert cov["sharded"] > 0 and cov["digests_compared"] > 0
    # each expert's bytes are read by one ep rank only, so the four ranks read less than
    # four copies of the replicated part would suggest, and more than one model's bytes
    assert sum(r["bytes"] for r in rep["ranks"]) > sum(a.nbytes for a in ckpt["full"].values()) // 2
    assert_rejoins(out, ckpt["full"])
    assert sorted(p.name for p in out.iterdir()) == [
        *(f"rank-{r:05d}-of-00004.safetensors" for r in range(4)), "specbind-index.json",
    ]  # fmt: skip


def test_two_nodes_on_localhost_rendezvous_and_rejoin_to_the_tp1_bind(ckpt: dict[str, Any]) -> None:
    out, port = ckpt["dir"] / "nodes", free_port()
    args = ("bind", str(ckpt["ck"]), "--out-dir", str(out))
    runs = finish(*(torchrun(1, *args, node=(2, n, port)) for n in (0, 1)))
    assert [rc for rc, _, _ in runs] == [0, 0], [se for _, _, se in runs]
    assert "2 rank(s) = tp 2 x ep 1 over gloo" in runs[0][1]
    assert runs[1][1] == "", "only rank 0 reports"
    assert_rejoins(out, ckpt["full"])


def test_a_corrupt_shard_on_one_node_makes_every_rank_exit_nonzero_with_its_message(
    ckpt: dict[str, Any],
) -> None:
    bad = ckpt["dir"] / "bad-copy"
    shutil.copytree(ckpt["ck"], bad)
    shard = bad / "model-00002-of-00002.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[8:16] = b"#garbage"  # the JSON header no longer parses
    shard.write_bytes(bytes(raw))
    out, port = ckpt["dir"] / "corrupt", free_port()
    # finish() fails the test if the ranks hang (no CPU used for a while) or loop
    runs = finish(
        torchrun(1, "bind", str(ckpt["ck"]), "--out-dir", str(out), node=(2, 0, port)),
        torchrun(1, "bind", str(bad), "--out-dir", str(out), node=(2, 1, port)),
    )
    for rc, so, se in runs:
        assert rc != 0 and so == ""
        assert (
            "rank 1 of 2 failed while reading the checkpoint: model-00002-of-00002.safetensors"
            in se
        ), se
    assert not out.exists() or not any(out.iterdir()), "nothing is written when a rank fails"


def test_bytes_that_differ_between_nodes_are_refused_by_digest_naming_the_tensor(
    ckpt: dict[str, Any],
) -> None:
    """Same names, dtypes, shapes and sizes on both nodes, one flipped value in a tensor
    every rank reads: only the digests of the shared ranges can see it."""
    same = copy_with(ckpt["ck"], ckpt["dir"] / "same")
    norm = read_file(same / "model.safetensors")["norm.weight"].copy()
    norm.reshape(-1)[3] = -norm.reshape(-1)[3] - 1  # shape unchanged -> one value differs
    other = copy_with(ckpt["ck"], ckpt["dir"] / "other", edit={"norm.weight": norm})
    out, port = ckpt["dir"] / "differ", free_port()
    runs = finish(
        torchrun(1, "bind", str(same), "--out-dir", str(out), node=(2, 0, port)),
        torchrun(1, "bind", str(other), "--out-dir", str(out), node=(2, 1, port)),
    )
    for rc, _, se in runs:
        assert rc != 0, se
        assert "do not cover the model exactly once per replica: norm.weight: bytes [0, " in se
        assert "differ between ranks" in se and "on rank 0 but" in se
    assert not (out / "specbind-index.json").exists()


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def test_a_killed_rank_makes_torchrun_tear_down_the_others_in_bounded_time(
    ckpt: dict[str, Any],
) -> None:
    run = torchrun(2, "bind", str(ckpt["ck"]), "--timeout", "30")
    watch = patience.Watch([run], cpu=BOUND)  # no wall deadline: a loaded machine is slower
    workers: list[int] = []
    while len(workers) < 2 and run.poll() is None:
        workers = _children(run.pid)
        time.sleep(0.05)
        watch.check("torchrun starting two workers")
    assert len(workers) == 2, "torchrun did not start two workers"
    os.kill(max(workers), signal.SIGKILL)
    rc, _, se = finish(run)[0]
    assert rc != 0
    assert "Signal 9" in se or "SIGKILL" in se, se[-2000:]
    assert not any(Path(f"/proc/{w}").exists() for w in workers), "a worker outlived torchrun"
