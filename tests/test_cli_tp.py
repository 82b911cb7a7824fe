"""Tensor parallelism through the CLI: per-rank --out files rejoin to the TP=1 result, and
`plan` accounts for every byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors
from helpers import TABLE, read_file

from generated import dsa, kda


def specbind(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def load(path: Path) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, str]]:
    out = read_file(path)
    with safetensors.safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
    return out, meta


@pytest.fixture(scope="module")
def bound(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("tp")
    ck = d / "ck"
    assert specbind("synth", str(ck), "--seed", "11").returncode == 0
    outs: dict[str, Any] = {}
    for name, args in [
        ("tp1", []),
        ("r0", ["--tp-size", "2", "--tp-rank", "0"]),
        ("r1", ["--tp-size", "2", "--tp-rank", "1"]),
    ]:
        proc = specbind("bind", str(ck), "--json", "--out", str(d / f"{name}.safetensors"), *args)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout) | {"ckpt": str(ck)}
        outs[name] = (*load(d / f"{name}.safetensors"), report)
    # torchrun-style environment instead of flags
    proc = specbind(
        "bind",
        str(ck),
        "--json",
        "--out",
        str(d / "env.safetensors"),
        env={"WORLD_SIZE": "2", "RANK": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    outs["env"] = (*load(d / "env.safetensors"), json.loads(proc.stdout))
    return outs


MODULES: dict[str, Any] = {"kda": kda, "dsa": dsa}


def _kind(field: str, layer_kind: str) -> tuple[str, int, int]:
    """(shard kind, axis, number of concatenated sources) of a bound field."""
    rule = MODULES[layer_kind].FIELDS[field]
    return rule.layout, 0 if rule.layout == "rows" else -1, rule.parts


def test_two_rank_out_files_rejoin_to_the_tp1_result_for_every_field(bound: dict[str, Any]) -> None:
    full, _, rep = bound["tp1"]
    r0, m0, _ = bound["r0"]
    r1, m1, _ = bound["r1"]
    assert (m0["tp_size"], m0["tp_rank"], m1["tp_rank"]) == ("2", "0", "1")
    assert m0["specs_sha256"] == m1["specs_sha256"]
    assert set(r0) == set(r1) == set(full)
    kinds = {layer["index"]: layer["kind"] for layer in rep["layers"]}
    seen = set()
    for name, want in full.items():
        _, index, field = name.split(".", 2)
        kind, axis, parts = _kind(field, kinds[int(index)])
        seen.add(kind)
        if kind == "replicated":
            assert r0[name].tobytes() == r1[name].tobytes() == want.tobytes(), name
            continue
        # A concat (the conv) is [q_local; k_local; v_local] on each rank: rejoin part by part.
        pieces = [np.split(r[name], parts, axis=0) for r in (r0, r1)]
        joined = np.concatenate(
            [np.concatenate([p[i] for p in pieces], axis=axis) for i in range(parts)], axis=0
        )
        assert joined.tobytes() == want.tobytes(), name
        assert r0[name].nbytes == want.nbytes // 2
    assert seen == {"replicated", "rows", "cols"}


def test_four_rank_out_files_rejoin_to_the_tp1_result_including_the_absorbs(
    bound: dict[str, Any], tmp_path: Path
) -> None:
    full, _, rep = bound["tp1"]
    ck = Path(rep["ckpt"])
    ranks = []
    for r in range(4):
        out = tmp_path / f"r{r}.safetensors"
        proc = specbind("bind", str(ck), "--out", str(out), "--tp-size", "4", "--tp-rank", str(r))
        assert proc.returncode == 0, proc.stderr
        ranks.append(load(out)[0])
    kinds = {layer["index"]: layer["kind"] for layer in rep["layers"]}
    for name, want in full.items():
        _, index, field = name.split(".", 2)
        kind, axis, parts = _kind(field, kinds[int(index)])
        if kind == "replicated":
            assert all(r[name].tobytes() == want.tobytes() for r in ranks), name
            continue
        pieces = [np.split(r[name], parts, axis=0) for r in ranks]
        joined = np.concatenate(
            [np.concatenate([p[i] for p in pieces], axis=axis) for i in range(parts)], axis=0
        )
        assert joined.tobytes() == want.tobytes(), name  # q_absorb and o_absorb included


def test_each_rank_file_holds_only_its_bytes(bound: dict[str, Any]) -> None:
    full = sum(a.nbytes for a in bound["tp1"][0].values())
    halves = [sum(a.nbytes for a in bound[r][0].values()) for r in ("r0", "r1")]
    assert halves[0] == halves[1] < full
    reported = [sum(layer["bytes"] for layer in bound[r][2]["layers"]) for r in ("tp1", "r0", "r1")]
    assert reported[1] == reported[2] < reported[0], "each rank reads only its shard of the source"


def test_the_rank_comes_from_torchrun_variables_when_no_flag_is_given(
    bound: dict[str, Any],
) -> None:
    env_arrays, env_meta, env_rep = bound["env"]
    r1, _, _ = bound["r1"]
    assert (env_rep["tp_size"], env_rep["tp_rank"]) == (2, 1)
    assert env_meta["tp_rank"] == "1"
    assert all(env_arrays[n].tobytes() == r1[n].tobytes() for n in r1)


def test_plan_at_tp8_on_the_real_geometry_accounts_for_every_byte() -> None:
    proc = specbind("plan", "--tp-size", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["tp_size"] == 8 and len(rep["ranks"]) == 8
    names = {b: [t["name"] for t in rep["blocks"][b]["tensors"]] for b in ("kda", "dsa")}
    assert len(names["kda"]) == 15 and len(names["dsa"]) == 14
    for r in rep["ranks"]:
        for b in ("kda", "dsa"):
            assert [t["name"] for t in r["tensors"][b]] == names[b]
    tot = rep["totals"]
    assert tot["sum_rank_bytes"] == tot["tp1_bytes"] + 7 * tot["replicated_bytes"]
    assert tot["tp1_bytes"] == sum(
        t["full_bytes"] for b in ("kda", "dsa") for t in rep["blocks"][b]["tensors"]
    )
    for b in ("kda", "dsa"):
        per_tensor = [
            sum(r["tensors"][b][i]["local_bytes"] for r in rep["ranks"])
            for i in range(len(names[b]))
        ]
        for t, total in zip(rep["blocks"][b]["tensors"], per_tensor, strict=True):
            copies = 8 if t["shard"] == "replicated" else 1
            assert total == copies * t["full_bytes"], t["name"]
    assert rep["blocks"]["kda"]["all_reduce"] and rep["blocks"]["dsa"]["all_reduce"]
    q = next(t for t in rep["ranks"][3]["tensors"]["kda"] if t["name"] == "self_attn.q_proj.weight")
    assert q["local_shape"] == [1024, 4096] and q["row_offset"] == 3 * 1024
    o = next(t for t in rep["ranks"][3]["tensors"]["dsa"] if t["name"] == "self_attn.o_proj.weight")
    assert o["local_shape"] == [4096, 2048] and o["col_offset"] == 3 * 2048
    assert rep["geometry"] == TABLE.default_values()


def test_plan_on_a_checkpoint_counts_its_layers(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert specbind("synth", str(ck)).returncode == 0
    rep = json.loads(specbind("plan", str(ck), "--tp-size", "2", "--json").stdout)
    assert rep["blocks"]["kda"]["layers"] == [0, 1, 2, 4, 5, 6]
    assert rep["blocks"]["dsa"]["layers"] == [3, 7, 8]
    tot = rep["totals"]
    assert tot["sum_rank_bytes"] == tot["tp1_bytes"] + tot["replicated_bytes"]


def test_a_tp_that_does_not_divide_the_heads_is_refused_in_one_line(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert specbind("synth", str(ck)).returncode == 0
    proc = specbind("bind", str(ck), "--tp-size", "3", "--tp-rank", "0")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "which tp 3 does not divide" in proc.stderr
