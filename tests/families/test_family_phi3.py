"""Phi-3 binds from YAML alone, its fused projections read as sections: a checkpoint
transformers' ``Phi3ForCausalLM`` writes (one ``qkv_proj`` [q; k; v] with 8 heads and 4 KV
heads, one ``gate_up_proj`` [gate; up]) binds through ``specs/models/phi3.yaml``.

Claims:
* ``audit`` accounts for every tensor, the fused ones as their sections;
* at tp 1, 2 and 4 every rank's ``qkv_proj`` is exactly vLLM's ``QKVParallelLinear`` rank
  parameter and its ``gate_up`` vLLM's ``MergedColumnParallelLinear`` one (re-implemented below
  in NumPy from the stored fused tensors), never a contiguous slice of the fused rows;
* every bound field equals the loaded module's tensor;
* semantic: on every rank, the bound ``qkv_proj`` applied to an input is the module's
  ``qkv_proj`` output, q, k and v each cut to this rank's heads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from family_checks import same_values
from helpers import cached_binds
from hf_random import load_f64, write_random
from whole_model import read_checkpoint

from specbind.audit import audit
from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)

pytestmark = pytest.mark.interop

TABLE = MODELS["phi3"]
CONFIG: dict[str, Any] = dict(
    vocab_size=136, hidden_size=96, num_attention_heads=8, num_key_value_heads=4,
    intermediate_size=72, num_hidden_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False,
)  # fmt: skip
HD = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]  # 12
Q, KV = CONFIG["num_attention_heads"] * HD, CONFIG["num_key_value_heads"] * HD
NOTHING_F32 = re.compile(r"(?!)")


@pytest.fixture(scope="session")
def phi3_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("phi3")
    write_random(transformers.Phi3ForCausalLM, transformers.Phi3Config, CONFIG, path, NOTHING_F32)
    return path


@pytest.fixture(scope="module")
def bind_at(phi3_ckpt: Path) -> Callable[[int, int, int, int], BindResult]:
    return cached_binds(phi3_ckpt, TABLE)


def fields(b: BindResult) -> dict[str, Any]:
    return {k: a for k, (_, a) in b.fields().items()}


def vllm_qkv(fused: Any, tp: int, r: int) -> Any:
    """``QKVParallelLinear.weight_loader`` (vllm/model_executor/layers/linear.py) for a fused
    checkpoint tensor: q at [0, Q), k at [Q, Q + KV), v after; rank r takes its q rows, then
    the rows of KV head group r // replicas of k and of v (replicas = tp / kv_heads, or 1)."""
    q, k, v = fused[:Q], fused[Q : Q + KV], fused[Q + KV :]
    replicas = max(1, tp // CONFIG["num_key_value_heads"])
    qs, ks, kr = Q // tp, KV * replicas // tp, r // replicas
    return np.concatenate([q[r * qs : (r + 1) * qs], k[kr * ks : (kr + 1) * ks],
                           v[kr * ks : (kr + 1) * ks]])  # fmt: skip


def vllm_gate_up(fused: Any, tp: int, r: int) -> Any:
    """``MergedColumnParallelLinear.weight_loader``: rank r's rows of gate, then of up."""
    gate, up = np.split(fused, 2)
    n = gate.shape[0] // tp
    return np.concatenate([gate[r * n : (r + 1) * n], up[r * n : (r + 1) * n]])


def test_audit_accounts_for_every_tensor_the_fused_ones_as_their_sections(
    phi3_ckpt: Path,
) -> None:
    rep = audit(CheckpointDir(phi3_ckpt), TABLE, progress=False)
    stored = read_checkpoint(phi3_ckpt)
    assert "model.layers.0.self_attn.qkv_proj.weight" in stored
    layers = CONFIG["num_hidden_layers"]
    bound = len(stored) + layers * ((3 - 1) + (2 - 1))  # qkv -> 3, gate_up -> 2
    assert rep["coverage"] == {"bound": bound, "declared_unbound": 0, "unaccounted": 0}
    assert rep["problems"] == []


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_ranks_fused_fields_are_vllms_rank_parameters(
    phi3_ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult], tp: int
) -> None:
    stored = read_checkpoint(phi3_ckpt)
    for r in range(tp):
        f = fields(bind_at(tp, r, 1, 0))
        for i in range(CONFIG["num_hidden_layers"]):
            qkv = stored[f"model.layers.{i}.self_attn.qkv_proj.weight"]
            gu = stored[f"model.layers.{i}.mlp.gate_up_proj.weight"]
            got = f[f"layers.{i}.attention.qkv_proj"]
            assert got.tobytes() == vllm_qkv(qkv, tp, r).tobytes(), (i, r)
            assert f[f"layers.{i}.mlp.gate_up"].tobytes() == vllm_gate_up(gu, tp, r).tobytes()
            if tp > 1:
                contiguous = qkv[r * got.shape[0] : (r + 1) * got.shape[0]]
                assert got.tobytes() != contiguous.tobytes(), "not a slice of the fused rows"


def test_every_field_equals_the_loaded_modules(
    phi3_ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    model = load_f64(transformers.Phi3ForCausalLM, phi3_ckpt)
    f = fields(bind_at(1, 0, 1, 0))
    for i, layer in enumerate(model.model.layers):
        pairs = {"attention.qkv_proj": layer.self_attn.qkv_proj.weight,
                 "attention.o_proj": layer.self_attn.o_proj.weight,
                 "mlp.gate_up": layer.mlp.gate_up_proj.weight,
                 "mlp.down": layer.mlp.down_proj.weight,
                 "norms.input_norm": layer.input_layernorm.weight,
                 "norms.post_attention_norm": layer.post_attention_layernorm.weight}  # fmt: skip
        for name, theirs in pairs.items():
            assert same_values(f[f"layers.{i}.{name}"], theirs), (i, name)
    assert same_values(f["globals.embed_tokens"], model.model.embed_tokens.weight)
    assert same_values(f["globals.norm"], model.model.norm.weight)
    assert same_values(f["globals.lm_head"], model.lm_head.weight)


@pytest.mark.parametrize("tp", [2, 4])
def test_each_ranks_qkv_output_is_the_modules_q_k_v_cut_to_its_heads(
    phi3_ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult], tp: int
) -> None:
    model = load_f64(transformers.Phi3ForCausalLM, phi3_ckpt)
    x = np.random.default_rng(0).standard_normal((5, CONFIG["hidden_size"]))
    x = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    with torch.no_grad():
        theirs = model.model.layers[1].self_attn.qkv_proj(torch.from_numpy(x)).numpy()
    q, k, v = theirs[:, :Q], theirs[:, Q : Q + KV], theirs[:, Q + KV :]
    for r in range(tp):
        w = fields(bind_at(tp, r, 1, 0))["layers.1.attention.qkv_proj"].astype(np.float64)
        qs, ks = Q // tp, KV // tp
        want = np.concatenate([q[:, r * qs : (r + 1) * qs], k[:, r * ks : (r + 1) * ks],
                               v[:, r * ks : (r + 1) * ks]], axis=1)  # fmt: skip
        np.testing.assert_allclose(x @ w.T, want, rtol=1e-12, atol=1e-12)
