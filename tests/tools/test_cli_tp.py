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
import patience
import pytest
import safetensors
from helpers import TABLE, TINY, field_rules, read_file, rejoin


def specbind(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return patience.run(
        [sys.executable, "-m", "specbind", *args], capture_output=True, text=True, cpu=120,
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


def test_two_rank_out_files_rejoin_to_the_tp1_result_for_every_field(bound: dict[str, Any]) -> None:
    full, _, _ = bound["tp1"]
    r0, m0, _ = bound["r0"]
    r1, m1, _ = bound["r1"]
    assert (m0["tp_size"], m0["tp_rank"], m1["tp_rank"]) == ("2", "0", "1")
    assert m0["specs_sha256"] == m1["specs_sha256"]
    assert set(r0) == set(r1) == set(full)
    rules = field_rules(m0)
    assert set(rules) >= set(full)
    seen = set()
    for name, want in full.items():
        rule = rules[name]
        seen.add(rule.layout)
        joined = rejoin(rule, {(0, 0): r0[name], (1, 0): r1[name]}, tp=2, ep=1)
        assert joined.tobytes() == want.tobytes(), name
        if rule.layout != "replicated":
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
    rules = field_rules(load(tmp_path / "r0.safetensors")[1])
    for name, want in full.items():
        shares = {(r, 0): ranks[r][name] for r in range(4)}
        joined = rejoin(rules[name], shares, tp=4, ep=1)
        # byte-exact, the absorbs too: each head's product is one fixed-length dot product
        assert joined.tobytes() == want.tobytes(), name


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


def _glm_bytes() -> int:
    """The whole GLM-5.3-Flash checkpoint's bound bytes, from the census in DESIGN.md written out
    by hand (not from the specs): 45 layers (34 KDA; 11 DSA, of which the spec's schedule makes
    every second one shared, without an indexer: 6 full, 5 shared; 3 dense MLPs, 42 MoE) plus
    one MTP layer (full DSA, MoE)."""
    H, V, F_, Im, E, S, N = 4096, 154880, 12288, 2048, 288, 1, 4
    M = (2 + N) * N
    kda = 2 * (3 * 8192 * H + 3 * 8192 * 4 + 2 * 128 * H + 2 * 8192 * 128 + 64 * H + 128 + H * 8192)
    kda += 4 * (64 + 8192)  # A_log, dt_bias: F32
    mla = 2 * (1536 * H + 1536 + 64 * 256 * 1536 + 512 * H + 512 + 64 * 512 * 512 + H * 64 * 256)
    indexer = 2 * (32 * 128 * 1536 + 128 * H + 128 + 128 + 32 * H + 128 * H + 16 * 128)
    dense = 2 * 3 * F_ * H
    moe = 2 * (E * H + 3 * E * Im * H + 3 * S * Im * H) + 4 * E
    norms = 2 * 2 * H
    mhc = 2 * 4 * (M * N * H + M + 3)  # all F32 as bound (fn is BF16 on disk, widened)
    layers = 34 * kda + 11 * mla + 6 * indexer + 3 * dense + 42 * moe + 45 * (norms + mhc)
    mtp = mla + indexer + moe + norms + 2 * (3 * H + 2 * H * H)
    return layers + mtp + 2 * (2 * V * H + H)


def test_plan_of_the_real_model_at_tp8_accounts_for_every_byte() -> None:
    proc = specbind("plan", "--tp-size", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["tp_size"] == 8 and len(rep["ranks"]) == 8
    tot = rep["totals"]
    assert tot["tp1_bytes"] == _glm_bytes()
    assert tot["sum_rank_bytes"] == tot["expected_sum"]
    assert rep["blocks"]["kda"]["layers"] == [i for i in range(45) if i % 4 != 3]
    assert rep["blocks"]["dense"]["layers"] == [0, 1, 2]
    assert rep["blocks"]["moe"]["layers"] == list(range(3, 46))
    assert rep["blocks"]["mtp_head"]["layers"] == [45]
    assert rep["blocks"]["kda"]["all_reduce"] and rep["blocks"]["dsa"]["all_reduce"]
    assert rep["blocks"]["moe"]["all_reduce"] and not rep["blocks"]["mhc"]["all_reduce"]
    r3 = rep["ranks"][3]["tensors"]
    q = next(t for t in r3["kda"] if t["name"] == "self_attn.q_proj.weight")
    assert q["local_shape"] == [1024, 4096] and (q["axis"], q["offset"]) == (0, 3 * 1024)
    o = next(t for t in r3["dsa"] if t["name"] == "self_attn.o_proj.weight")
    assert o["local_shape"] == [4096, 2048] and (o["axis"], o["offset"]) == (1, 3 * 2048)
    up = next(t for t in r3["moe"] if t["name"] == "mlp.experts.287.up_proj.weight")
    assert up["local_shape"] == [256, 4096] and up["offset"] == 3 * 256
    emb = next(t for t in r3["lm_globals"] if t["name"] == "embed_tokens.weight")
    assert emb["local_shape"] == [154880 // 8, 4096]
    assert rep["geometry"] == TABLE.default_values()


def test_plan_of_the_real_model_at_ep8_puts_36_whole_experts_on_each_rank() -> None:
    rep = json.loads(specbind("plan", "--ep-size", "8", "--json").stdout)
    assert [(r["tp_rank"], r["ep_rank"]) for r in rep["ranks"]] == [(0, e) for e in range(8)]
    for r in rep["ranks"]:
        experts = {t["name"].split(".")[2] for t in r["tensors"]["moe"] if ".experts." in t["name"]}
        e0 = 36 * r["ep_rank"]
        assert experts == {str(e) for e in range(e0, e0 + 36)}
        w = next(t for t in r["tensors"]["moe"] if t["name"].endswith("gate_proj.weight"))
        assert w["local_shape"] == [2048, 4096], "ep alone keeps each expert whole"
    tot = rep["totals"]
    assert tot["tp1_bytes"] == _glm_bytes() and tot["sum_rank_bytes"] == tot["expected_sum"]
    experts = 43 * 3 * 288 * 2048 * 4096 * 2  # 42 MoE layers + MTP
    assert tot["sum_rank_bytes"] == 8 * (tot["tp1_bytes"] - experts) + experts
    assert len({r["bytes"] for r in rep["ranks"]}) == 1, "288 experts split evenly 8 ways"


def test_plan_on_a_checkpoint_counts_its_layers(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert specbind("synth", str(ck)).returncode == 0
    rep = json.loads(specbind("plan", str(ck), "--tp-size", "2", "--json").stdout)
    assert rep["blocks"]["kda"]["layers"] == [0, 1, 2, 4, 5, 6]
    assert rep["blocks"]["dsa"]["layers"] == [3, 7, 8]
    assert rep["blocks"]["moe"]["layers"] == [3, 4, 5, 6, 7, 8]
    tot = rep["totals"]
    assert tot["sum_rank_bytes"] == tot["expected_sum"]
    files = sum(f.stat().st_size for f in ck.glob("*.safetensors"))
    assert 0 < files - tot["tp1_bytes"] < 64 * 1024, "the whole checkpoint, headers aside"


def test_a_tp_that_does_not_divide_the_heads_is_refused_in_one_line(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert specbind("synth", str(ck)).returncode == 0
    proc = specbind("bind", str(ck), "--tp-size", "3", "--tp-rank", "0")
    assert proc.returncode == 1  # refused: the geometry cannot be split so
    assert proc.stderr.count("\n") == 1 and "which tp 3 does not divide" in proc.stderr


def test_plan_text_shows_each_tensors_local_shape_and_names_the_model_level_tensors(
    tmp_path: Path,
) -> None:
    """The text says what ``--json`` says: rank (tp 0, ep 0)'s local shape beside the full one
    (a column-sliced down_proj [X, I] holds [X, I/tp]; an expert [Im/tp, X]), and the globals
    as model-level, not as the internal layer -1."""
    ck = tmp_path / "ck"
    assert specbind("synth", str(ck)).returncode == 0
    text = specbind("plan", str(ck), "--tp-size", "2", "--ep-size", "2").stdout
    x, i, im = TINY["hidden"], TINY["intermediate"], TINY["moe_intermediate"]
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith("  ")}
    assert " ".join(rows["mlp.down_proj.weight"][-4:]) == f"[{x}, {i}] [{x}, {i // 2}]"
    assert (
        " ".join(rows["mlp.experts.{e}.gate_proj.weight"][-4:]) == f"[{im}, {x}] [{im // 2}, {x}]"
    )
    assert "lm_globals: model-level," in text and "[-1]" not in text
