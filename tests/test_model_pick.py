"""A checkpoint names its model, or is told it: a config.json with no ``model_type``, a
non-string one, or one no generated model claims is refused in one line naming the known model
types and how to choose one (``--model``, ``model=``), never bound as the default model; the
choice given by hand still works; with no checkpoint at all (``synth``) the default stays."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import TABLE, TINY

import specbind
from specbind.cli import main
from specbind.core.errors import CheckpointError, SpecbindError
from specbind.generated import MODELS
from specbind.synth import synth

KNOWN = [t for m in MODELS.values() for t in m.model_types]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pick") / "ck"
    synth(TABLE, out, dict(TINY), layers=2, seed=5)
    return out


def with_model_type(src: Path, dest: Path, value: Any) -> Path:
    """A copy of ``src`` whose config.json ``model_type`` is ``value`` (dropped for ``...``)."""
    dest.mkdir()
    for f in src.iterdir():
        if f.name != "config.json":
            os.link(f, dest / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("model_type", None)
    if value is not ...:
        cfg["model_type"] = value
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``specbind ARGS`` in this process (the CLI's ``main``: its exit status and its stderr):
    a Python start per case would cost more than the case."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return subprocess.CompletedProcess(list(args), rc, out.getvalue(), err.getvalue())


CASES = [(..., "no model_type"), (5, "model_type is 5 (int), not a string"),
         (None, "model_type is None (NoneType), not a string"), ("xlnet", "model_type 'xlnet': no generated model")]  # fmt: skip


@pytest.mark.parametrize(("value", "said"), CASES)
@pytest.mark.parametrize("cmd", ["bind", "audit", "plan"])
def test_a_checkpoint_naming_no_known_model_is_refused_naming_the_choices(
    ckpt: Path, tmp_path: Path, value: Any, said: str, cmd: str
) -> None:
    d = with_model_type(ckpt, tmp_path / "c", value)
    proc = cli(cmd, str(d))
    assert proc.returncode == 1, proc.stderr  # refused: the checkpoint names no model
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specbind: error: config.json: "), lines
    msg = lines[0]
    assert said in msg and "choose the model with --model NAME" in msg
    assert all(t in msg for t in KNOWN) and all(n in msg for n in MODELS)


@pytest.mark.parametrize(("value", "said"), CASES)
def test_the_api_refuses_it_too_naming_model_equals(
    ckpt: Path, tmp_path: Path, value: Any, said: str
) -> None:
    d = with_model_type(ckpt, tmp_path / "c", value)
    with pytest.raises(CheckpointError) as e:
        specbind.open(d)
    assert said in str(e.value) and "choose the model with model=NAME" in str(e.value)


def test_choosing_the_model_by_hand_still_binds_it(ckpt: Path, tmp_path: Path) -> None:
    d = with_model_type(ckpt, tmp_path / "c", ...)
    assert cli("bind", "--model", TABLE.name, str(d)).returncode == 0
    ck = specbind.open(d, model=TABLE.name)
    assert ck.model == TABLE.name and ck.bind().tensors()


def test_synth_without_a_checkpoint_still_writes_the_default_model(tmp_path: Path) -> None:
    proc = cli("synth", str(tmp_path / "d"))
    assert proc.returncode == 0, proc.stderr
    default = next(t for t in MODELS.values() if t.default)
    model_type = json.loads((tmp_path / "d" / "config.json").read_text())["model_type"]
    assert model_type in default.model_types


def other_model(name: str) -> str:
    """A generated model other than ``name`` that claims some model type."""
    return next(n for n, t in MODELS.items() if n != name and t.model_types)


@pytest.mark.parametrize("cmd", ["bind", "audit", "plan"])
def test_a_model_chosen_by_hand_that_the_checkpoint_says_is_another_is_refused_naming_both(
    ckpt: Path, cmd: str
) -> None:
    wrong = other_model(TABLE.name)
    kind = json.loads((ckpt / "config.json").read_text())["model_type"]
    proc = cli(cmd, "--model", wrong, str(ckpt))
    assert proc.returncode == 1, proc.stderr  # refused: the checkpoint says it is another
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"--model {wrong}" in lines[0] and repr(kind) in lines[0] and TABLE.name in lines[0]
    with pytest.raises(CheckpointError, match=f"model={wrong}.*{kind}.*{TABLE.name}"):
        specbind.open(ckpt, model=wrong)


def test_a_model_chosen_by_hand_for_a_model_type_no_model_claims_still_binds(
    ckpt: Path, tmp_path: Path
) -> None:
    d = with_model_type(ckpt, tmp_path / "c", "my_finetune")
    assert cli("bind", "--model", TABLE.name, str(d)).returncode == 0
    assert specbind.open(d, model=TABLE.name).model == TABLE.name


@pytest.mark.parametrize("value", ["48", 48.0, True, None])
def test_an_api_override_that_is_not_an_integer_is_refused_naming_it(
    ckpt: Path, value: Any
) -> None:
    with pytest.raises(SpecbindError, match=f"hidden={value!r}.*not an integer"):
        specbind.open(ckpt, overrides={"hidden": value}).bind()
