"""``plan --svg`` and ``audit --svg``: the pictures parsed back with ``xml.etree``, their claims
checked against the reports and against byte counts worked out here from the geometry.

The tiny Llama checkpoint (``synth --model llama``: hidden 40, head_dim 12, 2 KV heads, 2
layers) makes KV replication appear at tp 4; Qwen3-MoE's spec (experts cut to 8 by ``--set``)
gives experts at ep 2. Every command runs in-process.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers import copy_with

from specbind.cli import EXIT, main

NS = "{http://www.w3.org/2000/svg}"
RED = "#d62728"
KINDS = ("split", "copied", "replicated", "expert")  # plan --json's held bytes, by kind
TAGS = {"svg", "title", "defs", "pattern", "rect", "text", "line", "g"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("svg") / "llama"
    assert main(["synth", str(out), "--model", "llama"]) == 0
    return out


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    """``specbind ARGV --json``: its exit status and report."""
    rc = main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _svg(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert {e.tag.removeprefix(NS) for e in root.iter()} <= TAGS, "only the writer's elements"
    return root


def _tip(e: ET.Element) -> str:
    title = e.find(f"{NS}title")
    assert title is not None and title.text is not None
    return title.text


def _cells(root: ET.Element) -> dict[tuple[int, int, str], ET.Element]:
    return {
        (int(g.get("data-tp", -1)), int(g.get("data-ep", -1)), g.get("data-block", "")): g
        for g in root.iter(f"{NS}g")
        if g.get("data-block") is not None
    }


def _kinds(cell: ET.Element) -> dict[str, int]:
    """A cell's bar segments: bytes by kind (a kind the rank does not hold draws none)."""
    got = dict.fromkeys(KINDS, 0)
    for r in cell.iter(f"{NS}rect"):
        if r.get("data-kind") is not None:
            got[r.get("data-kind", "")] += int(r.get("data-bytes", -1))
    return got


def test_the_plan_picture_shows_every_rank_and_block_with_plan_jsons_bytes_by_kind(
    llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pic = tmp_path / "plan.svg"
    rc, rep = _run(capsys, "plan", str(llama), "--tp-size", "4", "--svg", str(pic))
    assert rc == 0
    root = _svg(pic)
    cells = _cells(root)
    blocks = list(rep["blocks"])
    assert blocks == ["dense", "gqa", "layer_norms", "lm_globals"]
    want = {(r["tp_rank"], r["ep_rank"], b) for r in rep["ranks"] for b in [*blocks, "total"]}
    assert set(cells) == want and len(want) == 4 * 5
    for r in rep["ranks"]:
        for b in blocks:
            cell = cells[(r["tp_rank"], r["ep_rank"], b)]
            assert _kinds(cell) == r["held"][b]
            assert int(cell.get("data-bytes", -1)) == sum(r["held"][b].values())
        total = cells[(r["tp_rank"], r["ep_rank"], "total")]
        assert int(total.get("data-bytes", -1)) == r["bytes"]
        assert f"{r['bytes']:,} B" in _tip(total)
    legend = {e.get("data-legend"): e for e in root.iter(f"{NS}rect") if e.get("data-legend")}
    shown = {e.get("data-legend"): e.text for e in root.iter(f"{NS}text") if e.get("data-legend")}
    assert set(legend) == set(KINDS) == set(shown)
    for k in KINDS:
        n = rep["totals"]["held"][k]
        assert int(legend[k].get("data-bytes", -1)) == n
        assert f"({n:,} B)" in (shown[k] or "")
    assert sum(rep["totals"]["held"].values()) == rep["totals"]["sum_rank_bytes"]


def test_kv_heads_fewer_than_tp_are_copied_bytes_in_the_attention_column(
    llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """2 KV heads: at tp 4 each rank holds one whole head of k and of v (12 rows of 40, BF16)
    in each of 2 layers, a head two ranks share; at tp 2 nothing is copied."""
    head = 12 * 40 * 2
    for tp, copied in ((4, 2 * 2 * head), (2, 0)):
        pic = tmp_path / f"tp{tp}.svg"
        assert _run(capsys, "plan", str(llama), "--tp-size", str(tp), "--svg", str(pic))[0] == 0
        cells = _cells(_svg(pic))
        for r in range(tp):
            assert _kinds(cells[(r, 0, "gqa")])["copied"] == copied
            assert _kinds(cells[(r, 0, "dense")])["copied"] == 0
            orange = [x for x in cells[(r, 0, "gqa")].iter(f"{NS}rect")
                      if x.get("data-kind") == "copied"]  # fmt: skip
            assert len(orange) == (1 if copied else 0)
            assert orange == [] or orange[0].get("fill") == "url(#copied)"


def test_at_ep_2_each_ep_rank_holds_half_the_experts_and_all_else_once_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["plan", "--model", "qwen3-moe", "--set", "experts=8"]
    one = _run(capsys, *base)[1]["totals"]["held"]
    pic = tmp_path / "moe.svg"
    rc, rep = _run(capsys, *base, "--ep-size", "2", "--svg", str(pic))
    assert rc == 0
    cells = _cells(_svg(pic))
    for r in rep["ranks"]:
        moe = _kinds(cells[(0, r["ep_rank"], "moe")])
        assert moe["expert"] * 2 == one["expert"] > 0
        attention = _kinds(cells[(0, r["ep_rank"], "gqa")])
        assert attention["expert"] == 0 and attention["split"] > 0
    two = rep["totals"]["held"]
    assert two["expert"] == one["expert"]
    assert (two["split"], two["replicated"]) == (2 * one["split"], 2 * one["replicated"])


def _cell(root: ET.Element, layer: int, slot: str) -> ET.Element:
    (rect,) = [
        r for r in root.iter(f"{NS}rect")
        if r.get("data-layer") == str(layer) and r.get("data-slot") == slot
    ]  # fmt: skip
    return rect


def test_an_audit_problem_cell_is_red_and_its_tooltip_is_the_problem(
    llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = copy_with(llama, tmp_path / "bad", {"layers.1.self_attn.k_proj.weight": None})
    pic = tmp_path / "audit.svg"
    rc, rep = _run(capsys, "audit", str(bad), "--svg", str(pic))
    assert rc == EXIT["refused"]
    (problem,) = rep["problems"]
    assert "self_attn.k_proj.weight" in problem
    root = _svg(pic)
    grid = [r for r in root.iter(f"{NS}rect") if r.get("data-slot")]
    assert {(r.get("data-layer"), r.get("data-slot")) for r in grid} == {
        (str(i), s) for i in (0, 1) for s in ("attention", "mlp", "norms")
    }
    cell = _cell(root, 1, "attention")
    assert cell.get("fill") == RED and _tip(cell) == problem
    assert [r for r in root.iter(f"{NS}rect") if r.get("fill") == RED and
            not r.get("data-legend")] == [cell], "red is for the problem only"  # fmt: skip
    legend = {r.get("data-legend"): r.get("fill") for r in root.iter(f"{NS}rect")}
    assert _cell(root, 0, "mlp").get("fill") == _cell(root, 1, "mlp").get("fill") == legend["dense"]
    assert _cell(root, 0, "attention").get("fill") == legend["gqa"] not in (legend["dense"], RED)
    listed = [_tip(g) for g in root.iter(f"{NS}g") if g.get("data-problem-text")]
    assert listed == [problem]


def test_a_bind_refusal_naming_a_tensor_reddens_the_slot_that_holds_it(
    llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The report-only bind's message names the tensor, not the slot: the block's rule names
    place it (q_proj is the attention slot's, under no ``attention.`` prefix)."""
    q = np.zeros((95, 40), ml_dtypes.bfloat16)
    bad = copy_with(llama, tmp_path / "bad", {"layers.0.self_attn.q_proj.weight": q})
    pic = tmp_path / "audit.svg"
    rc, rep = _run(capsys, "audit", str(bad), "--svg", str(pic))
    (problem,) = rep["problems"]
    assert rc == EXIT["refused"] and problem.startswith("bind: layer 0: ")
    assert "attention" not in problem and "gqa" not in problem
    root = _svg(pic)
    red = [r for r in root.iter(f"{NS}rect") if r.get("data-problem")]
    assert red == [_cell(root, 0, "attention")] and _tip(red[0]) == problem


def test_hostile_tensor_and_checkpoint_names_are_text_in_both_pictures(
    llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Markup, quotes, ampersands and a control character in a directory name and in tensor
    names: each picture parses, holds only the writer's elements, and shows the names as text
    (the control character spelled ``\\x01``)."""
    evil = "x<b>&\"'</b>"
    folder = "ck<i>&\"'\x01"  # no "/": a name, not a path
    edits = {
        f"layers.1.mlp.{evil}.weight": np.zeros((3,), ml_dtypes.bfloat16),
        "stray</text><script>alert(1)</script>": np.zeros((3,), ml_dtypes.bfloat16),
    }
    bad = copy_with(llama, tmp_path / folder, edits)
    pic = tmp_path / "audit.svg"
    rc, rep = _run(capsys, "audit", str(bad), "--svg", str(pic))
    assert rc == EXIT["refused"] and len(rep["problems"]) == 2
    root = _svg(pic)
    words = " ".join("".join(e.itertext()) for e in root.iter(f"{NS}text"))
    assert "ck<i>&\"'\\x01" in words
    assert all(p in {_tip(g) for g in root.iter(f"{NS}g") if g.get("data-problem-text")}
               for p in rep["problems"])  # fmt: skip
    mlp = _cell(root, 1, "mlp")
    (undeclared,) = [p for p in rep["problems"] if p.startswith("layer 1: mlp")]
    assert mlp.get("fill") == RED and _tip(mlp) == undeclared and "x<b>&" in undeclared
    model = [r for r in root.iter(f"{NS}rect") if r.get("data-layer") == "model"]
    assert model[0].get("fill") == RED and "<script>" in _tip(model[0])
    plan = tmp_path / "plan.svg"
    ok = copy_with(llama, tmp_path / f"plan{folder}")
    assert _run(capsys, "plan", str(ok), "--svg", str(plan))[0] == 0
    words = " ".join("".join(e.itertext()) for e in _svg(plan).iter(f"{NS}text"))
    assert "planck<i>&\"'\\x01" in words


@pytest.mark.parametrize("command", ["plan", "audit"])
def test_an_svg_path_that_is_a_directory_or_a_checkpoint_file_is_refused_in_one_line(
    command: str, llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = llama / "config.json"
    before = config.read_bytes()
    for given, why in (
        (tmp_path, f"--svg {tmp_path}: is a directory; --svg names the .svg picture to write"),
        (config, "is a file of the checkpoint being read"),
    ):
        assert main([command, str(llama), "--svg", str(given)]) == EXIT["usage"], "as --out"
        out, err = capsys.readouterr()
        assert out == "" and re.fullmatch(rf"specbind: error: .*{re.escape(why)}.*\n", err)
    assert config.read_bytes() == before


@pytest.mark.parametrize("command", ["plan", "audit"])
@pytest.mark.parametrize("where", ["checkpoint", "hub repo"])
def test_an_svg_path_inside_the_checkpoint_is_refused_as_out_is_and_nothing_is_written(
    command: str, where: str, llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new file in the checkpoint's folder (or in the Hub cache repo of a snapshot) is refused
    for ``--svg`` as for ``--out``: the folder stays as it was."""
    repo = tmp_path / "models--acme--ll"
    snap = repo / "snapshots" / ("0" * 40)
    snap.parent.mkdir(parents=True)
    snap.symlink_to(llama, target_is_directory=True)  # the snapshot, by a link to the folder
    ckpt, inside = (llama, llama / "pic.svg") if where == "checkpoint" else (snap, repo / "p.svg")
    before = sorted(p.name for p in llama.iterdir())
    assert main([command, str(ckpt), "--svg", str(inside)]) == EXIT["usage"]
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"specbind: error: --svg {inside}: is inside {inside.parent}, the checkpoint being "
        "read; write the picture outside it, so the checkpoint stays as it was\n"
    )
    assert sorted(p.name for p in llama.iterdir()) == before and not inside.exists()
