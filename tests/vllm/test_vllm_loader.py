"""``vllm.LLM(model=CKPT, load_format="specbind")`` against vLLM's own loader, in a real vLLM.

Tiny checkpoints written by transformers' own classes (tests/support/vllm_checkpoints.py) run through
vLLM's CPU build (the venv .ci/vllm-venv builds) once with the default loader and once with
specbind's, each engine started by tests/support/vllm_scenario.py in that venv. These are the claims
that need a started engine; that every parameter is identical, for every family at tp 1 and on
each rank of tp 2, is tests/vllm/test_vllm_proofs.py's (in process, no engine), and that every
proven layout generates the default loader's tokens and logprobs at tp 1 is
tests/vllm/test_vllm_tokens.py's (tp 2 is compared by parameters only: on CPU two tp 2 runs of
vLLM's own loader differ in logprobs). Claims:
- a checkpoint with a tensor cast to F32 (tp 1), and one missing one expert tensor (tp 2, under
  the multi-process executor), stop the engine's start with specbind's one-line message naming
  the tensor, and that line is what the caller gets (vLLM's default loader starts on the
  second one);
- ``enable_expert_parallel`` at tp 1 binds the parameters vLLM's own loader does (specbind's
  tp 1 Qwen3-MoE engine runs with it).
Engine starts are the cost (tens of seconds each, minutes at tp 2), so each scenario starts
its engines in one process and every claim reads its recorded results; at tp 2 only the
refusal's engine starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import vllm_venv

pytestmark = pytest.mark.interop

MODELS = ("deepseek-v3", "qwen3-moe")  # the refusals' source, and the expert-parallel run
MISSING = "model.layers.1.mlp.experts.2.up_proj.weight"
CAST = "model.layers.0.self_attn.kv_b_proj.weight"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    why = vllm_venv.why_missing()
    if why is not None:
        pytest.skip(why)
    import torch
    from vllm_checkpoints import WRITERS, with_cast, without_tensor

    root = tmp_path_factory.mktemp("vllm")
    out = {}
    for model in MODELS:
        WRITERS[model](root / model)
        out[model] = root / model
    without_tensor(out["deepseek-v3"], root / "missing-expert", MISSING)
    with_cast(out["deepseek-v3"], root / "cast", CAST, torch.float32)
    return out | {"missing": root / "missing-expert", "cast": root / "cast"}


def _scenario(root: Path, tp: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    spec, out = root / f"tp{tp}.json", root / f"tp{tp}-result.json"
    spec.write_text(json.dumps({"tp": tp, "runs": runs}))
    # CPU, not wall: the old 2400 s wall bound on each of the machine's two cores
    proc = vllm_venv.run_scenario(spec, out, cpu=4800)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join((proc.stderr or "").splitlines()[-30:])
        raise AssertionError(f"the vLLM scenario failed (exit {proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


# Engine starts are the cost: at tp 1 specbind's Qwen3-MoE engine runs with
# enable_expert_parallel (one expert rank), so the tp 1 claims cover expert parallelism too.
EP_AT_TP1 = "qwen3-moe"


def _pairs(ckpts: dict[str, Path]) -> list[dict[str, Any]]:
    """Qwen3-MoE's engine at tp 1 with vLLM's loader, then with specbind's and expert
    parallelism (the tokens of every layout are tests/vllm/test_vllm_tokens.py's)."""
    return [
        {"name": f"{EP_AT_TP1}/{fmt}", "ckpt": str(ckpts[EP_AT_TP1]), "load_format": fmt,
         "expert_parallel": fmt == "specbind"}
        for fmt in ("auto", "specbind")
    ]  # fmt: skip


@pytest.fixture(scope="module")
def tp1(ckpts: dict[str, Path]) -> dict[str, Any]:
    return _scenario(ckpts["missing"].parent, 1, [
        *_pairs(ckpts),
        {"name": "cast", "ckpt": str(ckpts["cast"]), "load_format": "specbind"},
    ])  # fmt: skip


@pytest.fixture(scope="module")
def tp2(ckpts: dict[str, Path]) -> dict[str, Any]:
    return _scenario(ckpts["missing"].parent, 2, [
        {"name": "missing", "ckpt": str(ckpts["missing"]), "load_format": "specbind"},
    ])  # fmt: skip


def _started(run: dict[str, Any]) -> dict[str, Any]:
    assert "error" not in run, run["error"]
    return run


def test_a_checkpoint_with_a_tensor_cast_to_f32_fails_engine_start_naming_it(
    tp1: dict[str, Any],
) -> None:
    err = tp1["cast"].get("error", "")
    assert "self_attn.kv_b_proj.weight" in err and "F32" in err, err


def _by_name(run: dict[str, Any]) -> list[dict[str, tuple[Any, ...]]]:
    return [{n: (tuple(s), d, h) for n, s, d, h in rank} for rank in _started(run)["params"]]


def test_expert_parallel_at_tp1_binds_every_parameter_as_the_default_loader_does(
    tp1: dict[str, Any],
) -> None:
    """``enable_expert_parallel`` at tp 1 is one expert rank: vLLM's own loader starts, and so
    does specbind's, with the same parameters (the tp 1 run of specbind's Qwen3-MoE engine)."""
    ours = tp1[f"{EP_AT_TP1}/specbind"]
    assert ours["expert_parallel"] is True
    assert _by_name(ours) == _by_name(tp1[f"{EP_AT_TP1}/auto"])


def test_a_checkpoint_missing_one_expert_tensor_fails_engine_start_naming_it_to_the_caller(
    tp2: dict[str, Any],
) -> None:
    """vLLM's default loader starts on it; specbind's refuses. Under the multi-process
    executor (tp 2: workers below the engine core process) the caller gets specbind's line, not
    only vLLM's "Engine core initialization failed" with the line left in a worker's log."""
    err = tp2["missing"].get("error", "")
    assert err.startswith("SpecbindError: "), err
    assert "mlp.experts.2.up_proj.weight" in err and "missing" in err, err
