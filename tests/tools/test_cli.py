"""The CLI end to end: synth -> audit --json -> bind --json --out, and refusals in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import patience
import pytest
import safetensors
from helpers import copy_with

from specbind.cli import EXIT
from specbind.generated import SPECS_SHA256


def specbind(*args: str) -> subprocess.CompletedProcess[str]:
    return patience.run(
        [sys.executable, "-m", "specbind", *args], capture_output=True, text=True, cpu=120
    )


def refused(proc: subprocess.CompletedProcess[str], code: int = EXIT["refused"]) -> str:
    """A refusal (``code``: a usage error's status instead): that exit status, one line on
    stderr, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [x for x in proc.stderr.strip().splitlines() if not x.startswith("specbind: note: ")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("specbind: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "tiny"
    proc = specbind("synth", str(out), "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    return out


def test_synth_writes_an_hf_layout_checkpoint(ckpt: Path) -> None:
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    config = json.loads((ckpt / "config.json").read_text())
    shards = sorted(p.name for p in ckpt.glob("*.safetensors"))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert set(index["weight_map"].values()) == set(shards)
    assert config["model_type"] == "glm5_next_text" and config["num_hidden_layers"] == 8
    assert (
        config["layer_types"][3] == "indexed_attention" and config["indexer_types"][7] == "shared"
    )
    header = {n: t for f in shards for n, t in safetensors.deserialize((ckpt / f).read_bytes())}
    assert header["layers.0.self_attn.A_log"]["dtype"] == "F32"
    assert header["layers.0.self_attn.dt_bias"]["dtype"] == "F32"
    assert header["layers.0.self_attn.q_proj.weight"]["dtype"] == "BF16"


def test_audit_json_is_a_clean_census_of_the_tiny_checkpoint(ckpt: Path) -> None:
    proc = specbind("audit", str(ckpt), "--json")
    assert proc.returncode == 0, proc.stderr
    rep: dict[str, Any] = json.loads(proc.stdout)
    kinds = {row["index"]: row["slots"]["attention"]["block"] for row in rep["layers"]}
    assert kinds == {0: "kda", 1: "kda", 2: "kda", 3: "dsa", 4: "kda", 5: "kda", 6: "kda",
                     7: "dsa", 8: "dsa"}  # fmt: skip
    mlps = {row["index"]: row["slots"]["mlp"]["block"] for row in rep["layers"]}
    assert mlps == {0: "dense", 1: "dense", 2: "dense"} | {i: "moe" for i in range(3, 9)}
    assert [row["role"] for row in rep["layers"]] == ["decoder"] * 8 + ["mtp"]
    assert "mhc" not in rep["layers"][8]["slots"] and "mtp" in rep["layers"][8]["slots"]
    assert rep["kinds"]["kda"] == {
        "layers": 6,
        "distinct_signatures": 1,
        "signatures": rep["kinds"]["kda"]["signatures"],
    }
    assert rep["kinds"]["dsa"]["distinct_signatures"] == 2, "full and shared DSA layers differ"
    slots = [s for row in rep["layers"] for s in row["slots"].values()]
    assert all(not s["missing"] and not s["unknown"] for s in slots)
    assert rep["layers"][7]["slots"]["attention"]["absent_optional_groups"] == ["indexer"]
    assert rep["quantization_artifacts"] == 0 and rep["identical_bytes"] == []
    assert rep["coverage"] == {"bound": rep["tensors"], "declared_unbound": 0, "unaccounted": 0}
    assert rep["globals"] == ["embed_tokens.weight", "lm_head.weight", "norm.weight"]


def test_bind_json_reports_every_layer_bound_with_no_unknowns(ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "bound.safetensors"
    proc = specbind("bind", str(ckpt), "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert set(rep) == {"specbind_version", "tp_size", "tp_rank", "ep_size", "ep_rank", "globals", "layers",
                        "declared_unbound", "bytes", "seconds"}  # fmt: skip
    assert (rep["tp_size"], rep["tp_rank"], rep["ep_size"], rep["ep_rank"]) == (1, 0, 1, 0)
    assert len(rep["layers"]) == 9
    tensors = 0
    for layer in rep["layers"]:
        assert set(layer) == {"index", "role", "bound", "bytes", "slots"}
        for slot in layer["slots"].values():
            assert set(slot) == {
                "block",
                "bound",
                "seen",
                "other",
                "bytes",
                "verdict_bytes",
                "cast",
            }
            assert slot["other"] == 0, "each slot is given only the names it claims"
            tensors += slot["seen"]
    assert rep["globals"]["bound"] == 3
    audit = json.loads(specbind("audit", str(ckpt), "--json").stdout)
    assert tensors + rep["globals"]["bound"] == audit["tensors"], "every tensor is bound"
    with safetensors.safe_open(str(out), framework="numpy") as f:
        meta = f.metadata()
        names = set(f.keys())
    assert (
        meta["specs_sha256"] == SPECS_SHA256 and meta["tp_size"] == "1" and meta["tp_rank"] == "0"
    )
    assert json.loads(meta["layers"])["8"] == {
        "role": "mtp",
        "slots": {"attention": "dsa", "mlp": "moe", "norms": "layer_norms", "mtp": "mtp_head"},
    }
    assert json.loads(meta["geometry"])["hidden"] == 72 and json.loads(meta["overrides"]) == {}
    assert "layers.0.attention.conv" in names and "layers.3.attention.wk" in names
    assert "layers.7.attention.wk" not in names, "layer 7 is a shared DSA layer"
    assert "layers.8.attention.q_absorb" in names, "the MTP layer binds as DSA"
    assert "layers.8.mtp.eh_proj" in names and "layers.8.mhc.attn_fn" not in names
    assert {"layers.0.mlp.gate_up", "layers.3.mlp.w13", "layers.3.mlp.w2"} <= names
    assert {"globals.embed_tokens", "globals.norm", "globals.lm_head"} <= names


def test_two_binds_write_byte_identical_files(ckpt: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert specbind("bind", str(ckpt), "--out", str(a)).returncode == 0
    assert specbind("bind", str(ckpt), "--out", str(b)).returncode == 0
    assert a.read_bytes() == b.read_bytes()


def test_bind_refuses_a_dropped_tensor_naming_layer_and_tensor(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_with(ckpt, tmp_path / "bad", {"layers.3.self_attn.q_b_proj.weight": None})
    line = refused(specbind("bind", str(bad), "--json"))
    assert "layer 3: missing layers.3.self_attn.q_b_proj.weight" in line


def test_bind_refuses_a_bf16_a_log_saying_why(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_with(
        ckpt, tmp_path / "bad", {"layers.1.self_attn.A_log": np.zeros(8, ml_dtypes.bfloat16)}
    )
    line = refused(specbind("bind", str(bad)))
    assert "layer 1: layers.1.self_attn.A_log is BF16 but a kda block requires F32" in line
    assert "would change the gate" in line


def test_bind_refuses_a_kda_layer_missing_a_tensor_as_matching_no_block(
    ckpt: Path, tmp_path: Path
) -> None:
    bad = copy_with(ckpt, tmp_path / "bad", {"layers.0.self_attn.o_norm.weight": None})
    line = refused(specbind("bind", str(bad)))
    assert "layer 0:" in line and "nearest is kda" in line and "self_attn.o_norm.weight" in line


def test_a_failed_bind_leaves_the_previous_out_file_intact(ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "bound.safetensors"
    assert specbind("bind", str(ckpt), "--out", str(out)).returncode == 0
    before = out.read_bytes()
    bad = copy_with(
        ckpt, tmp_path / "bad", {"layers.5.self_attn.extra.weight": np.zeros(2, np.float32)}
    )
    line = refused(specbind("bind", str(bad), "--out", str(out)))
    assert (
        "layer 5: 1 unrecognised self_attn tensor(s): ['layers.5.self_attn.extra.weight']" in line
    )
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_audit_lists_the_missing_half_of_a_partial_indexer(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_with(ckpt, tmp_path / "p", {"layers.3.self_attn.indexer.wk.weight": None})
    rep = json.loads(specbind("audit", str(bad), "--json").stdout)
    assert rep["layers"][3]["slots"]["attention"]["missing"] == ["self_attn.indexer.wk.weight"]
    assert rep["layers"][3]["slots"]["attention"]["absent_optional_groups"] == []


def test_audit_reports_quantization_artifacts_and_identical_bytes(
    ckpt: Path, tmp_path: Path
) -> None:
    scale = np.ones(1, np.float32)
    with safetensors.safe_open(
        str(ckpt / "model-00001-of-00002.safetensors"), framework="numpy"
    ) as h:
        a_log = h.get_tensor("layers.0.self_attn.A_log")
    bad = copy_with(ckpt, tmp_path / "q", {"layers.2.self_attn.q_proj.weight_scale": scale,
                                             "layers.2.self_attn.q_proj.input_scale": scale,
                                             "layers.1.self_attn.A_log": a_log})  # fmt: skip
    rep = json.loads(specbind("audit", str(bad), "--json").stdout)
    attn = rep["layers"][2]["slots"]["attention"]
    assert attn["quantization_artifacts"] == [
        "self_attn.q_proj.input_scale (F32)", "self_attn.q_proj.weight_scale (F32)"]  # fmt: skip
    assert attn["unknown"] == [
        "self_attn.q_proj.input_scale",
        "self_attn.q_proj.weight_scale",
    ]
    assert rep["kinds"]["kda"]["distinct_signatures"] == 2
    assert ["layers.0.self_attn.A_log", "layers.1.self_attn.A_log"] in rep["identical_bytes"]


USAGE = EXIT["usage"]


@pytest.mark.parametrize(
    ("args", "fragment", "code"),
    [
        (["bind", "/nonexistent/ckpt"], "/nonexistent/ckpt: no such directory", USAGE),
        (["audit", "/nonexistent/ckpt"], "/nonexistent/ckpt: no such directory", USAGE),
        (["plan", "/nonexistent/ckpt"], "/nonexistent/ckpt: no such directory", USAGE),
        (["bind", __file__], f"{__file__}: not a directory", USAGE),
        (["bind", "."], "no model.safetensors and no model.safetensors.index.json", 1),
        (["audit", "."], "no model.safetensors and no model.safetensors.index.json", 1),
        (["synth", "/tmp", "--layers", "2"], "exists and is not an empty directory", USAGE),
        (["bind", ".", "--model", "xlnet"], "unknown model 'xlnet'", USAGE),
        (["audit", ".", "--model", "xlnet"], "unknown model 'xlnet'", USAGE),
        (["bind", ".", "--set", "hidden=big"], "not an integer", USAGE),
        (["bind", ".", "--set", "hidden=1_6"], "'1_6' is not an integer", USAGE),
        (["bind", ".", "--set", "hidden=+16"], "'+16' is not an integer", USAGE),
        (["bind", ".", "--set", "hidden=64", "--set", "hidden=72"], "given twice", USAGE),
        (["synth", "/tmp/x-never", "--shards", "0"], "--shards 0: must be >= 1", USAGE),
        (["bind", ".", "--tp-size", "2", "--tp-rank", "2"], "tp rank 2 is outside [0, 2)", USAGE),
        (["plan", "--tp-size", "0"], "tp size 0 must be >= 1", USAGE),
        (["bind", "--from", "/nonexistent/f.safetensors"], "cannot open", USAGE),
    ],
)
def test_bad_invocations_are_refused_in_one_line_usage_apart_from_refusals(
    args: list[str], fragment: str, code: int
) -> None:
    assert fragment in refused(specbind(*args), code)


@pytest.mark.parametrize("command", ["audit", "plan", "bind"])
def test_a_flag_argparse_does_not_know_exits_with_the_usage_status(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from specbind.cli import main

    with pytest.raises(SystemExit) as stop:
        main([command, ".", "--no-such-flag"])
    assert stop.value.code == USAGE and "unrecognized arguments" in capsys.readouterr().err


def test_a_chunk_override_that_breaks_the_shared_memory_ceiling_is_refused(ckpt: Path) -> None:
    # The tiny geometry has D = 64: C = 128 needs 8*128*64 + 4*128*128 = 131072 B > 49152 B.
    proc = specbind("bind", str(ckpt), "--set", "kda_chunk=128")
    line = refused(proc)
    assert "constraint scan_shared_memory" in line and "refused, not truncated" in line


def test_a_set_override_is_announced_on_stderr_and_recorded_in_the_out_file(
    ckpt: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.safetensors"
    proc = specbind("bind", str(ckpt), "--set", "kda_chunk=16", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "specbind: note: --set overrides config.json: kda_chunk=16" in proc.stderr
    with safetensors.safe_open(str(out), framework="numpy") as f:
        meta = f.metadata()
    assert json.loads(meta["overrides"]) == {"kda_chunk": 16}
    assert json.loads(meta["geometry"])["kda_chunk"] == 16


def test_a_bad_set_is_refused_without_announcing_an_override(ckpt: Path) -> None:
    proc = specbind("bind", str(ckpt), "--set", "nonsense=3")
    assert "unknown geometry symbol 'nonsense'" in refused(proc, USAGE)
    assert "note:" not in proc.stderr, "no override happened, so none is announced"


def test_rank_flags_win_over_a_broken_launcher_environment(ckpt: Path) -> None:
    proc = patience.run(
        [sys.executable, "-m", "specbind", "bind", str(ckpt), "--tp-size", "2", "--tp-rank", "0"],
        capture_output=True, text=True, cpu=120,
        env={**os.environ, "WORLD_SIZE": "abc", "RANK": "9"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    env = {**os.environ, "WORLD_SIZE": "1", "RANK": "1"}
    proc = patience.run(
        [sys.executable, "-m", "specbind", "bind", str(ckpt)],
        capture_output=True, text=True, cpu=120, env=env,
    )  # fmt: skip
    assert "tp rank 1 is outside [0, 1) (from WORLD_SIZE/RANK)" in refused(proc, USAGE)


class _Writes:
    """A stderr that records each ``write`` call, as the kernel sees each one on a pipe."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, s: str) -> int:
        self.calls.append(s)
        return len(s)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(
    "args", [["bind", "/nonexistent/ckpt"], ["bind", "--from", "/nonexistent/f.safetensors"]]
)
def test_a_refusal_reaches_stderr_in_one_write_so_ranks_sharing_it_never_interleave(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from specbind.cli import main

    err = _Writes()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(args) == EXIT["usage"]
    assert len(err.calls) == 1 and err.calls[0].endswith("\n"), err.calls
    assert err.calls[0].startswith("specbind: error: ") and err.calls[0].count("\n") == 1


def test_a_synth_that_hits_a_file_size_limit_is_refused_naming_the_shard_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """A real kernel refusal (EFBIG under RLIMIT_FSIZE) while safetensors writes a shard: one
    line naming the shard as it would have been written, the refused status (not an internal
    error), and no checkpoint or temp directory left."""
    out = tmp_path / "ck"
    code = (
        "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000)); "
        f"sys.argv = ['specbind', 'synth', {str(out)!r}, '--model', 'llama']; "
        "from specbind.cli import entry; entry()"
    )
    proc = patience.run([sys.executable, "-c", code], capture_output=True, text=True, cpu=120)
    line = refused(proc)
    assert line.startswith(f"specbind: error: {out}/model-00001-of-00002.safetensors: writing ")
    assert "File too large" in line
    assert list(tmp_path.iterdir()) == []
