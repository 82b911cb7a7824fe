"""An engine layout binds only the tps its proof covers and its engine takes: the proof-tp gate
(``engine_ops.check_proven_tp``), GLM's split of its stored fused gate_up (vLLM's Transformers
backend, ``split:``), and the engine constraints vLLM's own constructors and loaders impose
(``constraints:``, flags included). The census against vLLM itself is tests/vllm/
test_vllm_census.py; these are the bind's side of each claim, at synth geometries."""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specbind.core.errors import BindError, SpecError
from specbind.engine import bind_for_engine
from specbind.generator.render import render_all

REPO = Path(__file__).resolve().parents[2]


def _specs(tmp: Path) -> Path:
    shutil.copytree(REPO / "specs", tmp / "specs")
    return tmp


def _edit(root: Path, file: str, old: str, new: str) -> None:
    p = root / "specs" / "engines" / "vllm" / file
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new, 1))


def _layout(root: Path, module: str) -> Any:
    """A layout rendered from the specs under ``root``, loaded as a module's ``LAYOUT``."""
    m = types.ModuleType(module)
    exec(compile(render_all(root)[f"engines/{module}.py"], module, "exec"), m.__dict__)
    return m.LAYOUT


def _synth(tmp: Path, model: str, *sets: str) -> Path:
    from specbind.cli import main

    out = tmp / model
    argv = ["synth", "--model", model, *(x for s in sets for x in ("--set", s)), str(out)]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _synth(tmp_path_factory.mktemp("ck"), "llama")


# -- the proof's tps --------------------------------------------------------------------------


def test_a_layout_proven_at_tp_1_alone_refuses_tp_2_in_one_line_naming_it_and_its_tps(
    tmp_path: Path, llama: Path
) -> None:
    root = _specs(tmp_path)
    _edit(root, "llama.yaml", "tp: [1, 2]}", "tp: [1]}")
    layout = _layout(root, "vllm_llama")
    bind_for_engine(llama, "vllm", tp_size=1, layout=layout)  # the proven tp binds
    for tp in (2, 4):
        with pytest.raises(BindError) as e:
            bind_for_engine(llama, "vllm", tp_size=tp, tp_rank=0, layout=layout)
        msg = str(e.value)
        assert "\n" not in msg
        assert msg.startswith(
            f"the vllm layout of llama is proven at tp 1 only (specs/engines/vllm/llama.yaml "
            f"proof.tp): tp {tp} is refused"
        ), msg


def test_a_layout_proven_at_tp_1_and_2_binds_the_larger_tps_its_rules_allow(llama: Path) -> None:
    # the shipped layout is proven at 1 and 2: tp 4 binds (the census keeps its constraints
    # equal to vLLM's constructors at every tp 1..8)
    name = "model.layers.0.self_attn.o_proj.weight"
    whole = bind_for_engine(llama, "vllm", tp_size=1)[name].array.shape
    assert bind_for_engine(llama, "vllm", tp_size=4, tp_rank=3)[name].array.shape == (
        whole[0],
        whole[1] // 4,
    )


# -- GLM: vLLM's Transformers backend splits the stored [gate; up] in contiguous rows ----------


def _f32(a: Any) -> Any:
    """BF16 bits (uint16 view) -> float32."""
    return (np.asarray(a).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _silu(x: Any) -> Any:
    return x / (1.0 + np.exp(-x))


def test_glms_bound_gate_up_computes_the_mlp_as_vllms_transformers_backend_does(
    tmp_path: Path,
) -> None:
    """GlmConfig.base_model_tp_plan: gate_up_proj colwise_gather_output (each rank's output
    rows gathered, then chunked into gate and up), down_proj rowwise_split_input (the gathered
    activation split into contiguous columns, the rank products summed): the MLP computed so
    from the bound fields of every rank is the MLP of the stored tensors."""
    ckpt = _synth(tmp_path, "glm")
    whole = bind_for_engine(ckpt, "vllm", tp_size=1)
    gate_up = _f32(whole["model.layers.0.mlp.gate_up_proj.weight"].array)  # [gate; up], stored
    down = _f32(whole["model.layers.0.mlp.down_proj.weight"].array)
    inter = down.shape[1]
    x = np.random.default_rng(0).standard_normal((3, gate_up.shape[1])).astype(np.float32)
    want = (_silu(x @ gate_up[:inter].T) * (x @ gate_up[inter:].T)) @ down.T
    for tp in (2, 4):
        ranks = [bind_for_engine(ckpt, "vllm", tp_size=tp, tp_rank=r) for r in range(tp)]
        gathered = np.concatenate(
            [x @ _f32(f["model.layers.0.mlp.gate_up_proj.weight"].array).T for f in ranks], -1
        )
        gate, up = np.split(gathered, 2, axis=-1)
        h = np.split(_silu(gate) * up, tp, axis=-1)
        got = sum(h[r] @ _f32(f["model.layers.0.mlp.down_proj.weight"].array).T
                  for r, f in enumerate(ranks))  # fmt: skip
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err < 1e-5, f"tp {tp}: the MLP is off by a relative {err:.3g}"


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ('split: {why: "', 'pad: {multiple: 64, why: w}\n        split: {why: "',
         "split and pad are two rules; give one"),
        ("shape: [2 * intermediate / tp, hidden]", "shape: [intermediate / tp, hidden]",
         "tp 1: the engine's shape is [13696, 4096], field 'gate_up' binds [27392, 4096]"),
    ],
)  # fmt: skip
def test_a_split_with_a_pad_or_the_wrong_share_is_refused_at_generate(
    tmp_path: Path, old: str, new: str, says: str
) -> None:
    root = _specs(tmp_path)
    _edit(root, "glm.yaml", old, new)
    with pytest.raises(SpecError) as e:
        render_all(root)
    assert "specs/engines/vllm/glm.yaml" in str(e.value) and says in str(e.value), str(e.value)


# -- engine constraints: the tps vLLM's constructors and loaders refuse -----------------------


@pytest.mark.parametrize(
    ("model", "file", "experts"),
    [("qwen2-moe", "qwen2-moe.yaml", "experts=2"), ("ernie4-5-moe", "ernie4-5-moe.yaml", "experts=2")],
)  # fmt: skip
def test_a_moe_at_tp_above_its_experts_is_refused_naming_vllms_check(
    tmp_path: Path, model: str, file: str, experts: str
) -> None:
    ckpt = _synth(tmp_path, model, experts)
    bind_for_engine(ckpt, "vllm", tp_size=2, tp_rank=1)  # tp = experts: vLLM builds it
    with pytest.raises(BindError) as e:
        bind_for_engine(ckpt, "vllm", tp_size=4, tp_rank=3)
    msg = str(e.value)
    assert msg.startswith(
        f"vllm refuses {model} at tp 4: constraint experts_per_rank (tp <= experts) fails at "
        "experts=2, tp=4"
    ), msg
    assert "is greater than the number of experts" in msg
    # the constraint is what refuses: the same layout without it binds tp 4
    root = _specs(tmp_path)
    p = root / "specs" / "engines" / "vllm" / file
    text = p.read_text()
    p.write_text(text[: text.index("constraints:")] + text[text.index("\nblocks:") + 1 :]
                 if "\nblocks:" in text[text.index("constraints:"):]
                 else text[: text.index("constraints:")])  # fmt: skip
    loose = _layout(root, f"vllm_{model.replace('-', '_')}")
    assert not loose.constraints
    bind_for_engine(ckpt, "vllm", tp_size=4, tp_rank=3, layout=loose)


@pytest.fixture(scope="module")
def cohere_qk_norm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cohere with use_qk_norm, 2 KV heads of 4 query heads, written by transformers' class."""
    pytest.importorskip("transformers", exc_type=ImportError)
    from vllm_proofs import write
    from vllm_rows import BY_MODEL

    row = BY_MODEL["cohere"]
    assert row.config["use_qk_norm"] is True and row.config["num_key_value_heads"] == 2
    out = tmp_path_factory.mktemp("cohere") / "ckpt"
    write(row, out)
    return out


def test_cohere_with_qk_norm_at_tp_above_its_kv_heads_is_refused_and_without_it_binds(
    tmp_path: Path, cohere_qk_norm: Path
) -> None:
    bind_for_engine(cohere_qk_norm, "vllm", tp_size=2, tp_rank=1)
    with pytest.raises(BindError) as e:
        bind_for_engine(cohere_qk_norm, "vllm", tp_size=4, tp_rank=3)
    msg = str(e.value)
    assert msg.startswith(
        "vllm refuses cohere at tp 4: constraint qk_norm_kv_rows (not use_qk_norm or tp <= "
        "kv_heads) fails at kv_heads=2, tp=4, use_qk_norm=1"
    ), msg
    # without the q/k norms (use_qk_norm false) vLLM's norm loader never runs: tp 4 binds
    plain = _synth(tmp_path, "cohere")
    assert json.loads((plain / "config.json").read_text())["use_qk_norm"] is False
    bind_for_engine(plain, "vllm", tp_size=4, tp_rank=3)


def test_a_constraint_on_a_flag_the_model_has_not_is_refused_at_generate(tmp_path: Path) -> None:
    root = _specs(tmp_path)
    _edit(root, "qwen2-moe.yaml", "check: tp <= experts", "check: not use_qk_norm or tp <= experts")
    with pytest.raises(SpecError) as e:
        render_all(root)
    assert "unknown symbol(s) use_qk_norm" in str(e.value), str(e.value)


def test_a_proof_that_names_no_tps_is_refused_at_generate(tmp_path: Path) -> None:
    """A proof covers the tps it lists: one listing none would gate nothing."""
    root = _specs(tmp_path)
    _edit(root, "llama.yaml", ", tp: [1, 2]}", "}")
    with pytest.raises(SpecError) as e:
        render_all(root)
    msg = str(e.value)
    assert "specs/engines/vllm/llama.yaml" in msg and "'tp' is a required property" in msg, msg
