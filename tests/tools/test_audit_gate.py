"""``specbind audit`` is a gate: its last line is a one-line verdict, ``--json`` says the same
(``ok``, ``verdict``, ``problems``), and the exit status is 1 whenever ``bind`` would refuse
the checkpoint (the census's problems, and what only a bind sees: a shape, a geometry that
does not fit the tensors), 0 when it binds, 2 on a usage error; ``plan`` and ``bind`` share
the scheme (``specbind.cli.EXIT``).

Fixtures are tiny synthesized Llama and DeepSeek-V3 checkpoints (one of each per module), run
in-process through ``specbind.cli.main``: no subprocess per case.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import copy_with, read_file

from specbind.cli import EXIT, main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main([*args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gate") / "llama"
    assert main(["synth", str(out), "--model", "llama", "--seed", "5"]) == 0
    return out


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DeepSeek-V3 checkpoint without its MTP layer whose config.json counts one."""
    base = tmp_path_factory.mktemp("gate")
    assert main(["synth", str(base / "ds"), "--model", "deepseek-v3", "--no-mtp"]) == 0
    return copy_with(base / "ds", base / "counted", config={"num_nextn_predict_layers": 1})


def tensors(ckpt: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        out |= read_file(f)
    return out


def test_a_clean_checkpoint_passes_audit_with_the_ok_line_in_text_and_json(
    llama: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = len(tensors(llama))
    rc, out, _ = run(capsys, "audit", str(llama))
    assert rc == EXIT["ok"] == 0
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"OK: {n} of {n} tensors bound in 2 layer(s)"), last
    rc, out, _ = run(capsys, "audit", str(llama), "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["ok"] is True and rep["problems"] == [] and rep["verdict"] == last


def test_audit_fails_a_llama_missing_up_proj_with_the_refused_status_and_verdict(
    llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = copy_with(llama, tmp_path / "bad", {"layers.0.mlp.up_proj.weight": None})
    rc, out, _ = run(capsys, "audit", str(bad))
    assert rc == EXIT["refused"] == 1
    last = out.strip().splitlines()[-1]
    assert last.startswith("REFUSED: 1 problem(s): layer 0: ") and "mlp.up_proj.weight" in last
    rc, out, _ = run(capsys, "audit", str(bad), "--json")
    rep = json.loads(out)
    assert rc == 1 and rep["ok"] is False and rep["verdict"] == last
    assert len(rep["problems"]) == 1 and "mlp.up_proj.weight" in rep["problems"][0]
    assert run(capsys, "bind", str(bad))[0] == EXIT["refused"], "bind refuses it too"


def test_audit_fails_a_deepseek_v3_whose_config_counts_an_mtp_layer_the_file_lacks(
    deepseek: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in ((), ("--json",)):
        rc, out, _ = run(capsys, "audit", str(deepseek), *extra)
        verdict = json.loads(out)["verdict"] if extra else out.strip().splitlines()[-1]
        assert rc == EXIT["refused"], out
        assert verdict.startswith("REFUSED: 1 problem(s): layer 4: config.json "
                                  "num_nextn_predict_layers is 1"), verdict  # fmt: skip
    assert run(capsys, "bind", str(deepseek))[0] == EXIT["refused"]
    rc, out, _ = run(capsys, "audit", str(deepseek), "--no-mtp")
    assert rc == 0 and out.strip().splitlines()[-1].startswith("OK: "), "the decoder alone binds"


Mutation = tuple[dict[str, object], dict[str, object], str]


def _mutations(t: dict[str, np.ndarray]) -> dict[str, Mutation]:
    """(tensors edited, config.json fields replaced, the name the refusal must give)."""
    q = t["layers.1.self_attn.q_proj.weight"]
    norm = np.ones(q.shape[1], np.float32)
    return {
        "a row short": ({"layers.1.self_attn.q_proj.weight": q[:-1]}, {}, "q_proj.weight"),
        "one head fewer in config.json": ({}, {"num_attention_heads": 7}, "q_proj.weight"),
        "a float32 norm": ({"layers.1.input_layernorm.weight": norm}, {}, "input_layernorm"),
        "an extra tensor": (
            {"layers.0.self_attn.rotary.inv_freq": np.ones(4, np.float32)},
            {},
            "inv_freq",
        ),
        "a missing model-level tensor": ({"norm.weight": None}, {}, "norm.weight"),
    }


@pytest.mark.parametrize(
    "what",
    [
        "a row short",
        "one head fewer in config.json",
        "a float32 norm",
        "an extra tensor",
        "a missing model-level tensor",
    ],
)
def test_audit_fails_exactly_what_bind_refuses_including_what_only_a_bind_sees(
    what: str, llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit, config, named = _mutations(tensors(llama))[what]
    bad = copy_with(llama, tmp_path / "bad", edit, config)
    bind_rc, _, bind_err = run(capsys, "bind", str(bad))
    assert bind_rc == EXIT["refused"] and named in bind_err, (what, bind_err)
    rc, out, _ = run(capsys, "audit", str(bad), "--json")
    rep = json.loads(out)
    assert rc == EXIT["refused"] and rep["ok"] is False, (what, rep["problems"])
    assert any(named in p for p in rep["problems"]) and named in rep["verdict"], rep["problems"]


def test_audit_names_only_skips_the_bind_and_its_verdict_says_shapes_went_unchecked(
    llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    q = tensors(llama)["layers.1.self_attn.q_proj.weight"]
    bad = copy_with(llama, tmp_path / "bad", {"layers.1.self_attn.q_proj.weight": q[:-1]})
    rc, out, _ = run(capsys, "audit", str(bad), "--names-only", "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["checked"] == "names"
    assert "shapes and values not (--names-only)" in rep["verdict"]
    assert run(capsys, "audit", str(bad))[0] == EXIT["refused"]


@pytest.mark.parametrize("command", ["audit", "plan", "bind"])
def test_a_refused_checkpoint_and_a_usage_error_get_distinct_statuses_in_each_command(
    command: str, llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = copy_with(llama, tmp_path / "bad", {"layers.0.mlp.up_proj.weight": None})
    rc, _, err = run(capsys, command, str(bad))
    assert rc == EXIT["refused"], err
    rc, _, err = run(capsys, command, str(tmp_path / "absent"))
    assert rc == EXIT["usage"] and "no such directory" in err
    rc, _, err = run(capsys, command, str(llama), "--set", "hidden=x")
    assert rc == EXIT["usage"] and "'x' is not an integer" in err
    rc, _, err = run(capsys, command, str(llama), "--model", "no-such-model")
    assert rc == EXIT["usage"] and "unknown model 'no-such-model'" in err


@pytest.mark.parametrize("command", ["audit", "plan", "bind"])
def test_a_set_naming_no_geometry_symbol_is_a_usage_error_in_each_command(
    command: str, llama: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in ([], ["--json"]) if command == "audit" else ([],):
        rc, out, err = run(capsys, command, str(llama), "--set", "bogus=3", *extra)
        assert rc == EXIT["usage"], (out, err)
        assert "unknown geometry symbol 'bogus'" in err and "REFUSED" not in out
        assert "overrides config.json" not in err  # nothing was overridden
