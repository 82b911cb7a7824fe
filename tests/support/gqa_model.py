"""Tiny grouped-query-attention checkpoints written by transformers' own classes (Llama,
Qwen3-MoE), and references that read only bound fields, one tp rank at a time.

* ``write_llama`` / ``write_qwen3_moe``: ``save_pretrained`` of a seeded random model, in a
  geometry where no two symbols are equal and ``num_key_value_heads = 2``, so k and v are split
  at tp 2 and replicated at tp 4 and 8 (vLLM's QKVParallelLinear: rank r holds KV head
  ``r // (tp / 2)``).
* ``attention_rank``: one rank's attention output [T, hidden] from its bound q/k/v/o (and
  q_norm/k_norm) and the rotary cos/sin; summed over ranks it is the whole layer's attention
  (o_proj is column-split by query heads, so the ranks' partial products add up).
* ``moe_rank``: one (tp, ep) rank's softmax-routed MoE output from its router, w13 and w2.
* ``rejoin_replicated``: the whole field from every rank's share, where each unit of the share
  is held by ``replicas`` consecutive ranks (asserting those copies are equal).

torch and transformers are imported inside the functions, so a test module can
``importorskip`` them first.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from helpers import rejoin

from specbind.core.ir import FieldRule

# Pairwise-different sizes; q rows (heads * head_dim = 96) differ from every symbol too.
LLAMA: dict[str, Any] = {
    "vocab_size": 112,
    "hidden_size": 40,
    "intermediate_size": 72,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 12,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
# A Llama-2-style geometry: head_dim is hidden / heads (6), and config.json will not say it.
LLAMA2: dict[str, Any] = LLAMA | {"hidden_size": 48, "head_dim": 6}
QWEN3_MOE: dict[str, Any] = LLAMA | {
    "moe_intermediate_size": 24,
    "num_experts": 6,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "rms_norm_eps": 1e-6,
}


def _save(model: Any, path: Path, drop: tuple[str, ...] = ()) -> Path:
    import torch

    model = model.to(torch.bfloat16)
    model.save_pretrained(path)
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for k in drop:
        cfg.pop(k, None)
    cfg_path.write_text(json.dumps(cfg))
    return path


def write_llama(path: Path, seed: int = 0, **over: Any) -> Path:
    """A LlamaForCausalLM checkpoint of ``LLAMA | over``; ``drop_head_dim=True`` writes a
    Llama-2-style config.json without head_dim."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    drop = ("head_dim",) if over.pop("drop_head_dim", False) else ()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**(LLAMA | over)))
    return _save(model, path, drop)


def write_qwen3_moe(path: Path, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    return _save(Qwen3MoeForCausalLM(Qwen3MoeConfig(**QWEN3_MOE)), path)


def load(path: Path, cls: str) -> Any:
    """The checkpoint loaded by transformers' ``cls``, eager attention, float32 in eval mode."""
    import transformers

    model = getattr(transformers, cls).from_pretrained(path, attn_implementation="eager")
    return model.float().eval()


def rotary(model: Any, tokens: int) -> tuple[Any, Any]:
    """(cos, sin) [1, T, head_dim] of positions 0..T-1 from the model's own rotary embedding."""
    import torch

    x = torch.zeros(1, tokens, model.config.hidden_size)
    pos = torch.arange(tokens)[None]
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(x, pos)
    return cos.double(), sin.double()


def module_attention(attn: Any, x: Any, cos: Any, sin: Any) -> Any:
    """transformers' attention module on x [T, hidden] (no mask: every token sees every token)."""
    import torch

    m = copy.deepcopy(attn).float().eval()
    with torch.no_grad():
        out = m(torch.from_numpy(x.astype(np.float32))[None], (cos.float(), sin.float()), None)
    return out[0][0].double().numpy()


def _f64(a: Any) -> Any:
    import torch

    return torch.from_numpy(np.asarray(a).astype(np.float64))


def _rms(x: Any, w: Any, eps: float) -> Any:
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w


def attention_rank(f: dict[str, Any], x: Any, cos: Any, sin: Any, head_dim: int, eps: float) -> Any:
    """One tp rank's attention [T, hidden] in float64 from its bound fields alone."""
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    t = x.shape[0]
    xs = _f64(x)
    q = (xs @ _f64(f["q_proj"]).T).view(t, -1, head_dim)  # [T, heads_r, head_dim]
    k = (xs @ _f64(f["k_proj"]).T).view(t, -1, head_dim)  # [T, kv_heads_r, head_dim]
    v = (xs @ _f64(f["v_proj"]).T).view(t, -1, head_dim)
    if f.get("q_norm") is not None:
        q, k = _rms(q, _f64(f["q_norm"]), eps), _rms(k, _f64(f["k_norm"]), eps)
    q, k = q.transpose(0, 1)[None], k.transpose(0, 1)[None]  # [1, heads, T, head_dim]
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    group = q.shape[1] // k.shape[1]  # query heads per KV head on this rank
    k = k.repeat_interleave(group, dim=1)
    v = v.transpose(0, 1)[None].repeat_interleave(group, dim=1)
    w = torch.softmax(q @ k.transpose(-1, -2) * head_dim**-0.5, dim=-1)
    o = (w @ v)[0].transpose(0, 1).reshape(t, -1)  # [T, heads_r * head_dim]
    return (o @ _f64(f["o_proj"]).T).numpy()


def route(x: Any, router: Any, top_k: int, norm: bool) -> tuple[Any, Any, Any]:
    """Softmax top-k routing in float64: (indices [T, k], weights [T, k], margin [T])."""
    logits = np.asarray(x, np.float64) @ np.asarray(router).astype(np.float64).T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    w = np.take_along_axis(p, idx, -1)
    ranked = -np.sort(-p, axis=-1)
    margin = ranked[:, top_k - 1] - ranked[:, top_k]
    if norm:
        w = w / w.sum(-1, keepdims=True)
    return idx, w, margin


def moe_rank(
    x: Any, f: dict[str, Any], start: int, top_k: int, norm: bool
) -> Any:  # fmt: skip
    """One (tp, ep) rank's MoE output [T, hidden]: its experts ``start ..`` from w13/w2."""
    idx, w, _ = route(x, f["router"], top_k, norm)
    w13 = np.asarray(f["w13"]).astype(np.float64)  # [E_r, 2 * Im_r, hidden]
    w2 = np.asarray(f["w2"]).astype(np.float64)  # [E_r, hidden, Im_r]
    half = w13.shape[1] // 2
    out = np.zeros_like(x, dtype=np.float64)
    for i in range(w13.shape[0]):
        weight = (w * (idx == start + i)).sum(-1)[:, None]  # [T, 1]
        g, u = x @ w13[i, :half].T, x @ w13[i, half:].T
        out += weight * ((g / (1 + np.exp(-g)) * u) @ w2[i].T)
    return out


def rejoin_replicated(
    rule: FieldRule, shares: dict[tuple[int, int], Any], tp: int, ep: int, replicas: int
) -> Any:
    """The whole field from every rank's share where ranks ``k·replicas .. (k+1)·replicas - 1``
    hold the same unit (their shares must be equal, bit for bit)."""
    for (t, e), a in shares.items():
        first = shares[(t - t % replicas, e)]
        assert a.tobytes() == first.tobytes(), f"tp rank {t} differs from its replica group"
    distinct = {(t // replicas, e): a for (t, e), a in shares.items() if t % replicas == 0}
    return rejoin(rule, distinct, tp // replicas, ep)


def bf16(a: Any) -> Any:
    """BF16-exact float64 values of ``a``."""
    return np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float64)
