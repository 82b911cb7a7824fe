"""Llama 4 text binds from YAML alone (specs/models/llama4-text.yaml, specs/blocks/llama4_moe.yaml),
from checkpoints written by transformers' own classes at a geometry where no two sizes are equal:
``Llama4ForCausalLM`` (layers under ``model.``) and ``Llama4ForConditionalGeneration`` (the text
model under ``language_model.``, its geometry nested under ``text_config``, a vision tower).

Claims:
* ``audit`` accounts for every tensor of both writers (the vision tower declared unbound), and
  the MoE layers are config.json's ``moe_layers`` (dense and MoE interleaved); a ``moe_layers``
  that disagrees with the tensors is refused naming the layer;
* each (tp, ep) rank's routed experts are ``[gate_r | up_r]`` of the stored halves (computed
  here with numpy from the stored ``gate_up_proj``), never a contiguous share of the stored axis;
* semantic: the MoE (sigmoid router, routed experts, shared expert), the dense MLP and the
  attention projections computed from every rank's fields, summed over ranks, equal what
  transformers' own Llama 4 modules compute;
* both writers' checkpoints of one model bind to the same fields.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import cached_binds
from whole_model import expert_range, read_checkpoint

from specbind.core.errors import SpecbindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)
if not hasattr(transformers, "Llama4ForCausalLM"):
    pytest.skip("this transformers has no llama4 model", allow_module_level=True)

pytestmark = pytest.mark.interop

TABLE = MODELS["llama4-text"]
# no two sizes equal: hidden 48, q rows 80, kv rows 20, head_dim 10, experts 5, expert
# intermediate 36 (gate_up 72), dense intermediate 64, vocab 112, 8 heads, 2 KV heads
TEXT: dict[str, Any] = {
    "vocab_size": 112,
    "hidden_size": 48,
    "intermediate_size": 36,
    "intermediate_size_mlp": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 10,
    "num_local_experts": 5,
    "num_experts_per_tok": 2,
    "interleave_moe_layer_step": 2,  # MoE layers 1 and 3, dense 0 and 2
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "use_qk_norm": True,
    "no_rope_layer_interval": 2,
    "attention_chunk_size": 16,
}
VISION: dict[str, Any] = {
    "hidden_size": 24,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 40,
    "image_size": 28,
    "patch_size": 14,
    "vision_output_dim": 32,
    "projector_input_dim": 32,
    "projector_output_dim": 48,
    "pixel_shuffle_ratio": 0.5,
}
E, X, INTER = TEXT["num_local_experts"], TEXT["hidden_size"], TEXT["intermediate_size"]
DENSE, H, KV, D = TEXT["intermediate_size_mlp"], 8, 2, 10
RANKS = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (2, 3)]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    """(the text model in float64, its Llama4ForCausalLM checkpoint, the same text model's
    Llama4ForConditionalGeneration checkpoint)."""
    root = tmp_path_factory.mktemp("llama4")
    torch.manual_seed(0)
    text = transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(**TEXT))
    with torch.no_grad():
        for p in text.parameters():  # every element different and not the init's zeros/ones
            p.copy_(torch.randn(p.shape) * 0.5)
    text = text.to(torch.bfloat16)
    text.save_pretrained(root / "text")
    config = transformers.Llama4Config(text_config=TEXT, vision_config=VISION)
    vlm = transformers.Llama4ForConditionalGeneration(config).to(torch.bfloat16)
    vlm.language_model.load_state_dict(text.state_dict())
    vlm.save_pretrained(root / "vlm")
    for p in text.parameters():  # float64 parameters; the rotary buffer stays complex
        p.data = p.data.double()
    return text.eval(), root / "text", root / "vlm"


@pytest.fixture(scope="module")
def bind_at(written: tuple[Any, Path, Path]) -> Callable[[int, int, int, int], BindResult]:
    return cached_binds(written[1], TABLE)


def _f(result: BindResult) -> dict[str, Any]:
    return {k: np.asarray(a, np.float64) for k, (_, a) in result.fields().items()}


def _np(t: Any) -> Any:
    return t.detach().double().numpy()


def test_audit_accounts_for_every_tensor_of_both_writers(written: tuple[Any, Path, Path]) -> None:
    from specbind.audit import audit

    _, text, vlm = written
    for path, unbound in ((text, 0), (vlm, None)):
        rep = audit(CheckpointDir(path), TABLE, progress=False)
        assert rep["problems"] == [], rep["problems"]
        cov = rep["coverage"]
        # each MoE layer's gate_up_proj is bound as two sections (gate, up): 2 names more
        assert cov["unaccounted"] == 0 and cov["bound"] == len(read_checkpoint(text)) + 2, cov
        if unbound is not None:
            assert cov["declared_unbound"] == unbound
        else:  # the vision tower and projector, declared unbound by prefix
            stored = len(read_checkpoint(vlm)) - len(read_checkpoint(text))
            assert cov["declared_unbound"] == stored > 0, cov
        mlp = [r["slots"]["mlp"]["block"] for r in rep["layers"]]
        assert mlp == ["dense", "llama4_moe", "dense", "llama4_moe"], mlp
    nested = json.loads((vlm / "config.json").read_text())
    assert "hidden_size" not in nested and nested["text_config"]["hidden_size"] == X


def test_a_moe_layers_list_that_disagrees_with_the_tensors_is_refused_naming_the_layer(
    written: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(written[1], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["moe_layers"] = [1, 2]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecbindError) as e:
        bind_checkpoint(CheckpointDir(bad), TABLE, progress=False)
    assert "layer 2" in str(e.value) and "moe_layers" in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("use_qk_norm", [True, False])
def test_a_qk_norm_weight_is_refused_whatever_use_qk_norm_says(
    written: tuple[Any, Path, Path], tmp_path: Path, use_qk_norm: bool
) -> None:
    """Llama4TextL2Norm has no weight (nor has vLLM's qk_norm): a q_norm in a Llama 4 layer is
    no Llama 4 tensor, with use_qk_norm true or false."""
    from helpers import copy_with

    norm = np.ones(D, dtype=read_checkpoint(written[1])["model.norm.weight"].dtype)
    extra = {f"model.layers.0.self_attn.{n}_norm.weight": norm for n in "qk"}
    bad = copy_with(written[1], tmp_path / "bad", extra, {"use_qk_norm": use_qk_norm})
    with pytest.raises(SpecbindError) as e:
        bind_checkpoint(CheckpointDir(bad), TABLE, progress=False)
    assert "layer 0" in str(e.value) and "use_qk_norm" in str(e.value), str(e.value)
    assert "q_norm" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("tp", "ep"), RANKS, ids=[f"tp{t}-ep{e}" for t, e in RANKS])
def test_each_ranks_experts_are_gate_r_then_up_r_of_the_stored_halves(
    written: tuple[Any, Path, Path],
    bind_at: Callable[[int, int, int, int], BindResult],
    tp: int,
    ep: int,
) -> None:
    """Transformers' Llama4TextExperts: gate, up = (x @ gate_up_proj).chunk(2, dim=-1). Rank r
    holds columns [r·I/tp, (r+1)·I/tp) of each half; a contiguous share of the stored axis
    (rank 0 all of gate at tp 2) would fail here."""
    stored = read_checkpoint(written[1])
    for index in (1, 3):
        pre = f"model.layers.{index}.feed_forward."
        gu = stored[pre + "experts.gate_up_proj"].astype(np.float64)
        down = stored[pre + "experts.down_proj"].astype(np.float64)
        assert gu.shape == (E, X, 2 * INTER)
        gate, up = gu[..., :INTER], gu[..., INTER:]
        per = INTER // tp
        for e in range(ep):
            lo, count = expert_range(E, ep, e)
            mine = slice(lo, lo + count)
            for r in range(tp):
                f = _f(bind_at(tp, r, ep, e))
                cols = slice(r * per, (r + 1) * per)
                want = np.concatenate([gate[mine][..., cols], up[mine][..., cols]], axis=-1)
                assert np.array_equal(f[f"layers.{index}.mlp.gate_up"], want), (index, e, r)
                assert np.array_equal(f[f"layers.{index}.mlp.down"], down[mine][:, cols])


def _silu(a: Any) -> Any:
    return a / (1.0 + np.exp(-a))


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1), (4, 1), (2, 2), (1, 3)])
def test_the_moe_from_every_ranks_fields_equals_transformers_llama4_moe(
    written: tuple[Any, Path, Path],
    bind_at: Callable[[int, int, int, int], BindResult],
    tp: int,
    ep: int,
) -> None:
    model = written[0]
    x = np.random.default_rng(1).standard_normal((7, X))
    for index in (1, 3):
        moe = model.model.layers[index].feed_forward
        with torch.no_grad():
            want = _np(moe(torch.from_numpy(x))[0])
        got = np.zeros_like(want)
        for e in range(ep):
            lo, count = expert_range(E, ep, e)
            for r in range(tp):
                f = _f(bind_at(tp, r, ep, e))
                p = f"layers.{index}.mlp."
                logits = x @ f[p + "router"].T  # [T, E]: Llama4Router, sigmoid of the top k
                top = np.argsort(-logits, axis=1, kind="stable")[:, : TEXT["num_experts_per_tok"]]
                score = np.zeros_like(logits)
                np.put_along_axis(
                    score, top, 1 / (1 + np.exp(-np.take_along_axis(logits, top, 1))), 1
                )
                gu, dn = f[p + "gate_up"], f[p + "down"]
                half = gu.shape[-1] // 2
                for j in range(count):
                    h = (x * score[:, lo + j : lo + j + 1]) @ gu[j]  # routed_in @ [gate | up]
                    got += (h[:, half:] * _silu(h[:, :half])) @ dn[j]
                if e == 0:  # the shared expert: once per token, on ep rank 0's tp ranks
                    h = x @ f[p + "shared_gate_up"].T  # [gate_r; up_r] rows
                    s = h.shape[1] // 2
                    got += (_silu(h[:, :s]) * h[:, s:]) @ f[p + "shared_down"].T
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err < 1e-6, (index, err)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_dense_mlp_and_attention_projections_from_the_ranks_fields_equal_the_modules(
    written: tuple[Any, Path, Path], bind_at: Callable[[int, int, int, int], BindResult], tp: int
) -> None:
    model = written[0]
    x = np.random.default_rng(2).standard_normal((5, X))
    ranks = [_f(bind_at(tp, r, 1, 0)) for r in range(tp)]
    layer = model.model.layers[0]
    with torch.no_grad():
        want = _np(layer.feed_forward(torch.from_numpy(x)))
    got = np.zeros_like(want)
    for f in ranks:
        h = x @ f["layers.0.mlp.gate_up"].T
        s = h.shape[1] // 2
        got += (_silu(h[:, :s]) * h[:, s:]) @ f["layers.0.mlp.down"].T
    assert float(np.abs(got - want).max() / np.abs(want).max()) < 1e-9
    attn = layer.self_attn
    q, k, v, o = (_np(getattr(attn, f"{n}_proj").weight) for n in "qkvo")
    # each rank's o columns pair with its own q rows (whole heads): the sum is o @ q
    paired = sum(f["layers.0.attention.o_proj"] @ f["layers.0.attention.q_proj"] for f in ranks)
    assert np.allclose(paired, o @ q, rtol=0, atol=1e-9)
    for r, f in enumerate(ranks):  # rank r's KV head is that of its query heads
        kv = r * KV // tp if tp <= KV else r // (tp // KV)
        n = max(KV // tp, 1) * D
        rows = slice(kv * D, kv * D + n)
        assert np.array_equal(f["layers.0.attention.k_proj"], k[rows])
        assert np.array_equal(f["layers.0.attention.v_proj"], v[rows])


def test_both_writers_checkpoints_of_one_model_bind_to_the_same_fields(
    written: tuple[Any, Path, Path],
) -> None:
    _, text, vlm = written
    for tp, r in ((1, 0), (2, 1)):
        a = bind_checkpoint(CheckpointDir(text), TABLE, tp_size=tp, tp_rank=r, progress=False)
        b = bind_checkpoint(CheckpointDir(vlm), TABLE, tp_size=tp, tp_rank=r, progress=False)
        fa, fb = a.fields(), b.fields()
        assert set(fa) == set(fb)
        for k in fa:
            assert fa[k][1].tobytes() == fb[k][1].tobytes(), k
