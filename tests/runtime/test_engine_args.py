"""The Python entry points refuse what they cannot honour, in one line naming it: tp/ep
arguments that are not plain integers in range (``bind_for_engine``, ``Checkpoint.bind``,
``plan``, ``open_bound``), and ``fill`` into parameters that have no storage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import patience
import pytest

import specbind
from specbind.core.errors import BindError, GeometryError, SpecbindError
from specbind.engine import EngineField, bind_for_engine, fill


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specbind.cli import main

    out = tmp_path_factory.mktemp("llama") / "ckpt"
    assert main(["synth", "--model", "llama", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def fields(ckpt: Path) -> dict[str, EngineField]:
    return bind_for_engine(ckpt, "vllm")


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"tp_size": True}, r"bind_for_engine: tp_size=True is a bool; give an integer"),
        ({"tp_size": 2.0}, r"bind_for_engine: tp_size=2.0 is a float, not an integer"),
        ({"tp_rank": False}, r"bind_for_engine: tp_rank=False is a bool"),
        ({"tp_size": "2"}, r"bind_for_engine: tp_size='2' is a str, not an integer"),
        ({"tp_size": 0}, r"bind_for_engine: tp_size=0 must be >= 1"),
        ({"tp_size": 2, "tp_rank": 2}, r"bind_for_engine: tp_rank=2 is outside \[0, tp_size=2\)"),
    ],
)
def test_bind_for_engine_refuses_a_tp_argument_that_is_not_an_integer_in_range_naming_it(
    ckpt: Path, kwargs: dict[str, Any], said: str
) -> None:
    with pytest.raises(GeometryError, match=f"^{said}"):
        bind_for_engine(ckpt, "vllm", **kwargs)


def test_bind_for_engine_takes_a_numpy_integer_as_the_int_it_is(ckpt: Path) -> None:
    import numpy as np

    two = bind_for_engine(ckpt, "vllm", tp_size=np.int64(2), tp_rank=np.int32(1))
    want = bind_for_engine(ckpt, "vllm", tp_size=2, tp_rank=1)
    assert {n: f.array.shape for n, f in two.items()} == {n: f.array.shape for n, f in want.items()}


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda c: c.bind(tp_size=True), r"bind: tp_size=True is a bool"),
        (lambda c: c.bind(tp_size=2.0), r"bind: tp_size=2.0 is a float"),
        (lambda c: c.bind(ep_size=1, ep_rank=True), r"bind: ep_rank=True is a bool"),
        (lambda c: c.bind(ep_size=0.5), r"bind: ep_size=0.5 is a float"),
        (lambda c: c.bind(tp_size=2, tp_rank=-1), r"bind: tp_rank=-1 is outside \[0, tp_size=2\)"),
        (lambda c: c.plan(tp_size=True), r"plan: tp_size=True is a bool"),
        (lambda c: c.plan(ep_size=2.0), r"plan: ep_size=2.0 is a float"),
    ],
)
def test_the_python_api_refuses_a_tp_or_ep_argument_that_is_not_an_integer_naming_it(
    ckpt: Path, call: Any, said: str
) -> None:
    with pytest.raises(GeometryError, match=f"^{said}"):
        call(specbind.open(ckpt))


def test_open_bound_refuses_a_bool_rank_naming_it(tmp_path: Path) -> None:
    with pytest.raises(GeometryError, match=r"^open_bound: tp_size=True is a bool"):
        specbind.open_bound(tmp_path / "none.safetensors", tp_size=True)


def test_fill_refuses_meta_device_parameters_by_name_and_device(
    fields: dict[str, EngineField],
) -> None:
    import torch

    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
    params = {
        n: torch.zeros(f.array.shape, dtype=dtypes[f.dtype]) for n, f in sorted(fields.items())
    }
    meta = sorted(params)[-1]
    params[meta] = torch.empty(params[meta].shape, dtype=params[meta].dtype, device="meta")
    with pytest.raises(BindError, match=rf"^vllm: parameter '{meta}' is on device 'meta'"):
        fill("vllm", params, fields)
    assert not any(p.any() for n, p in params.items() if n != meta), "nothing is copied"


# -- inside vLLM, without vLLM: the parallel layouts accepted, the advice, the relay ---------


def test_expert_parallel_is_accepted_at_one_expert_rank_and_refused_over_more() -> None:
    from specbind.vllm_loader import check_parallel

    check_parallel(1, 1, 1, True)  # tp 1, dp 1: vLLM's own loader binds the unsplit layout
    check_parallel(1, 2, 2, False)
    with pytest.raises(SpecbindError, match=r"expert parallelism over 2 ranks \(tp 2 x dp 1\)"):
        check_parallel(1, 2, 1, True)
    with pytest.raises(SpecbindError, match=r"expert parallelism over 2 ranks \(tp 1 x dp 2\)"):
        check_parallel(1, 1, 2, True)
    with pytest.raises(SpecbindError, match=r"pipeline parallelism is not supported \(pp size 2\)"):
        check_parallel(2, 1, 1, False)


def test_the_vllm_loaders_extra_config_maps_by_default_and_refuses_what_it_does_not_read() -> None:
    from specbind.vllm_loader import loader_options

    assert loader_options(None) == {"mmap": True} == loader_options({})
    assert loader_options({"mmap": False}) == {"mmap": False}
    with pytest.raises(
        SpecbindError, match=r"key 'mmmap' is not one this loader reads \(it reads: mmap\)"
    ):
        loader_options({"mmmap": False})
    with pytest.raises(SpecbindError, match=r"\['mmap'\] must be true or false, got 'no'"):
        loader_options({"mmap": "no"})
    with pytest.raises(SpecbindError, match="must be a dict, got list"):
        loader_options(["mmap"])


def test_an_unclaimed_model_type_inside_vllm_gets_advice_a_vllm_user_can_follow(
    ckpt: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    from specbind.vllm_loader import bind_rank

    other = tmp_path / "other"
    shutil.copytree(ckpt, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config | {"model_type": "nonesuch"}))
    with pytest.raises(SpecbindError) as e:
        bind_rank(str(other), 1, 0)
    said = str(e.value)
    assert "model_type 'nonesuch': no generated model claims it" in said, said
    assert "model=" not in said and "load it with vLLM's own loader" in said, said


def test_a_refusal_in_an_engine_process_is_raised_where_vllm_waits_for_its_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's wait for its engine processes (stood in for here) raises only "Engine core
    initialization failed"; the refusing process's line, written through the relay file the
    first process named, is raised in its place, vLLM's error chained beneath it."""
    import os
    import sys
    import types

    from specbind import vllm_loader

    relay = tmp_path / "refusals"
    relay.write_text("")
    monkeypatch.setenv(vllm_loader.RELAY, f"{os.getpid()}:{relay}")
    child = (
        "from specbind.core.errors import BindError; from specbind import vllm_loader; "
        "vllm_loader._report(BindError('layer 1: missing mlp.up_proj.weight'))"
    )
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": repo}
    relay.write_text("BindError: an earlier engine's line, never raised\n")

    def wait_for_engine_startup(refuse: bool = True) -> None:
        if refuse:  # an engine process refuses while vLLM waits for it, then exits
            patience.run([sys.executable, "-c", child], check=True, env=env, cpu=60)
        raise RuntimeError("Engine core initialization failed. See root cause above.")

    utils = types.ModuleType("vllm.v1.engine.utils")
    utils.wait_for_engine_startup = wait_for_engine_startup  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.v1", "vllm.v1.engine"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.engine.utils", utils)
    vllm_loader._relay()
    vllm_loader._report(BindError("in the first process: raised as it is, never relayed"))
    with pytest.raises(SpecbindError) as e:
        utils.wait_for_engine_startup()  # type: ignore[attr-defined]
    assert str(e.value) == "BindError: layer 1: missing mlp.up_proj.weight"
    assert isinstance(e.value.__cause__, RuntimeError)
    with pytest.raises(RuntimeError, match="Engine core initialization failed"):
        utils.wait_for_engine_startup(refuse=False)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "kw", [{"tp_size": True}, {"tp_rank": True, "tp_size": 2}, {"ep_size": 2.0}]
)
def test_the_runtime_bind_every_entry_point_goes_through_refuses_a_bool_or_float_rank(
    kw: dict[str, object], tmp_path: Path
) -> None:
    """The check lives where every bind passes (``runtime.bind.bind.bind_checkpoint``), not only in
    the public entry points: ``tp_size=True`` would otherwise bind as tp 1 and say nothing."""
    from specbind.generated import MODELS
    from specbind.runtime.bind.bind import ReportOnly, bind_checkpoint
    from specbind.runtime.io.checkpoint import CheckpointDir
    from specbind.synth import synth, tiny_values

    table = MODELS["llama"]
    synth(table, tmp_path / "ck", tiny_values(table), layers=1, seed=0)
    with pytest.raises(GeometryError, match=r"^bind: (tp|ep)_(size|rank)="):
        bind_checkpoint(CheckpointDir(tmp_path / "ck"), table, sink=ReportOnly(), **kw)  # type: ignore[arg-type]
