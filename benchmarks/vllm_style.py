"""The loader a vLLM user would write by hand for GLM-5.3-Flash attention and MoE (and Kimi
Linear's and DeepSeek-V3.2's MLA), as the baseline.

Per tensor, ``safetensors.safe_open(...).get_slice(name)[...]`` reads this rank's rows or
columns (vLLM's sharded ``weight_loader`` does the same), and NumPy does the rest: the conv
concat, the MLA absorbs with ``np.einsum(..., optimize=True)`` in F32, the scale, the casts;
for the MoE, each of this ep rank's experts' gate and up rows and down columns for this tp
rank, concatenated and stacked into w13 / w2 with ``np.concatenate`` / ``np.stack``, the shared
experts merged the same way, the router and its bias verbatim. It knows the layer layout and
vLLM's expert map by hand; it checks nothing. Its outputs are compared with specbind's before
anything is timed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

Arr = np.ndarray[Any, Any]


def _numpy(t: Any) -> Arr:
    """A torch tensor as a NumPy array of the same bits (BF16 as ml_dtypes.bfloat16)."""
    import torch

    if t.dtype == torch.bfloat16:
        out: Arr = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return out
    return np.asarray(t.numpy())


class Loader:
    def __init__(self, ckpt: Path) -> None:
        import json

        from safetensors import safe_open

        index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
        self._files = {
            fn: safe_open(str(ckpt / fn), framework="pt") for fn in sorted(set(index.values()))
        }
        self._where = index
        self.config = json.loads((ckpt / "config.json").read_text())

    def _slice(self, name: str) -> Any:
        handle: Any = self._files[self._where[name]]
        return handle.get_slice(name)

    def rows(self, name: str, tp: int, rank: int) -> Arr:
        s = self._slice(name)
        n = s.get_shape()[0] // tp
        return _numpy(s[rank * n : (rank + 1) * n])

    def cols(self, name: str, tp: int, rank: int) -> Arr:
        s = self._slice(name)
        n = s.get_shape()[-1] // tp
        return _numpy(s[:, rank * n : (rank + 1) * n])

    def full(self, name: str) -> Arr:
        return _numpy(self._slice(name)[:])

    def load(
        self, block: str, i: int, tp: int, rank: int, ep: int = 1, ep_rank: int = 0
    ) -> dict[str, Arr]:
        """Layer ``i``'s ``block`` ("kda", "dsa" or "moe") at (tp, rank) and (ep, ep_rank)."""
        if block == "moe":
            return self.moe(i, tp, rank, ep, ep_rank)
        if ep != 1:
            raise ValueError(f"{block} has no experts to split over ep={ep}")
        if block == "kda":
            return self.kda(i, tp, rank)
        if block == "dsa":
            return self.dsa(i, tp, rank)
        if block == "mla":
            return self.mla(i, tp, rank)
        if block == "mla_indexed":
            return self.mla_indexed(i, tp, rank)
        raise ValueError(f"no hand-written loader for {block!r}")

    def kda(self, i: int, tp: int, rank: int) -> dict[str, Arr]:
        p = f"layers.{i}.self_attn."
        rows = {f: self.rows(p + n, tp, rank) for f, n in [
            ("q_proj", "q_proj.weight"), ("k_proj", "k_proj.weight"), ("v_proj", "v_proj.weight"),
            ("f_b", "f_b_proj.weight"), ("g_b", "g_b_proj.weight"), ("b_proj", "b_proj.weight"),
            ("a_log", "A_log"), ("dt_bias", "dt_bias")]}  # fmt: skip
        convs = [self.rows(p + f"{x}_conv1d.weight", tp, rank) for x in "qkv"]
        return rows | {
            "conv": np.concatenate(convs, axis=0).squeeze(1),
            "f_a": self.full(p + "f_a_proj.weight"),
            "g_a": self.full(p + "g_a_proj.weight"),
            "o_norm": self.full(p + "o_norm.weight"),
            "o_proj": self.cols(p + "o_proj.weight", tp, rank),
        }

    def dsa(self, i: int, tp: int, rank: int) -> dict[str, Arr]:
        c = self.config
        heads = c["num_attention_heads"] // tp
        nope, v, kvl, ql = (
            c["qk_nope_head_dim"],
            c["v_head_dim"],
            c["kv_lora_rank"],
            c["q_lora_rank"],
        )
        p = f"layers.{i}.self_attn."
        kv_b = (
            self.rows(p + "kv_b_proj.weight", tp, rank)
            .astype(np.float32)
            .reshape(heads, nope + v, kvl)
        )
        q_b = self.rows(p + "q_b_proj.weight", tp, rank).astype(np.float32).reshape(heads, nope, ql)
        o = self.cols(p + "o_proj.weight", tp, rank).astype(np.float32).reshape(-1, heads, v)
        q_absorb = np.einsum("hrc,hrk->hck", kv_b[:, :nope], q_b, optimize=True)
        o_absorb = np.einsum("ihr,hrc->ihc", o, kv_b[:, nope:], optimize=True)
        scale = np.float32(c["index_n_heads"] ** -0.5)
        ix = p + "indexer."
        return {
            "q_a_proj": self.full(p + "q_a_proj.weight"),
            "q_a_layernorm": self.full(p + "q_a_layernorm.weight"),
            "q_absorb": q_absorb.reshape(heads * kvl, ql).astype(ml_dtypes.bfloat16),
            "kv_a_proj": self.full(p + "kv_a_proj_with_mqa.weight"),
            "kv_a_layernorm": self.full(p + "kv_a_layernorm.weight"),
            "o_absorb": o_absorb.reshape(o.shape[0], heads * kvl).astype(ml_dtypes.bfloat16),
            "wq_b": self.full(ix + "wq_b.weight"),
            "wk": self.full(ix + "wk.weight"),
            "k_norm_weight": self.full(ix + "k_norm.weight"),
            "k_norm_bias": self.full(ix + "k_norm.bias"),
            "weights_proj": (
                self.full(ix + "weights_proj.weight").astype(np.float32) * scale
            ).astype(ml_dtypes.bfloat16),
            "compress_gate": self.full(ix + "index_kpool_compress_gate"),
            "ape": self.full(ix + "index_kpool_compress_ape").astype(np.float32),
        }

    def mla(self, i: int, tp: int, rank: int) -> dict[str, Arr]:
        """Kimi Linear's MLA: a direct q_proj whose rope rows stay as they are."""
        c = self.config
        heads = c["num_attention_heads"] // tp
        nope, rope, v, kvl = (
            c["qk_nope_head_dim"],
            c["qk_rope_head_dim"],
            c["v_head_dim"],
            c["kv_lora_rank"],
        )
        p = f"layers.{i}.self_attn."
        kv_b = (
            self.rows(p + "kv_b_proj.weight", tp, rank)
            .astype(np.float32)
            .reshape(heads, nope + v, kvl)
        )
        q_bf16 = self.rows(p + "q_proj.weight", tp, rank)
        hidden = q_bf16.shape[-1]
        q = q_bf16.reshape(heads, nope + rope, hidden)
        o = self.cols(p + "o_proj.weight", tp, rank).astype(np.float32).reshape(-1, heads, v)
        q_absorb = np.einsum("hrc,hrk->hck", kv_b[:, :nope], q[:, :nope].astype(np.float32))
        o_absorb = np.einsum("ihr,hrc->ihc", o, kv_b[:, nope:], optimize=True)
        return {
            "q_absorb": q_absorb.reshape(heads * kvl, hidden).astype(ml_dtypes.bfloat16),
            "q_rope": np.ascontiguousarray(q[:, nope:]).reshape(heads * rope, hidden),
            "kv_a_proj": self.full(p + "kv_a_proj_with_mqa.weight"),
            "kv_a_layernorm": self.full(p + "kv_a_layernorm.weight"),
            "o_absorb": o_absorb.reshape(o.shape[0], heads * kvl).astype(ml_dtypes.bfloat16),
        }

    def mla_indexed(self, i: int, tp: int, rank: int) -> dict[str, Arr]:
        """DeepSeek-V3.2's MLA: q LoRA, the rope rows and the rope key kept as they are, and
        the indexer (no k-pool)."""
        c = self.config
        heads = c["num_attention_heads"] // tp
        nope, rope, v, kvl, ql = (
            c["qk_nope_head_dim"],
            c["qk_rope_head_dim"],
            c["v_head_dim"],
            c["kv_lora_rank"],
            c["q_lora_rank"],
        )
        p = f"layers.{i}.self_attn."
        kv_b = (
            self.rows(p + "kv_b_proj.weight", tp, rank)
            .astype(np.float32)
            .reshape(heads, nope + v, kvl)
        )
        q = self.rows(p + "q_b_proj.weight", tp, rank).reshape(heads, nope + rope, ql)
        o = self.cols(p + "o_proj.weight", tp, rank).astype(np.float32).reshape(-1, heads, v)
        q_absorb = np.einsum("hrc,hrk->hck", kv_b[:, :nope], q[:, :nope].astype(np.float32))
        o_absorb = np.einsum("ihr,hrc->ihc", o, kv_b[:, nope:], optimize=True)
        kv_a = self.full(p + "kv_a_proj_with_mqa.weight")
        ix = p + "indexer."
        scale = np.float32(c["index_n_heads"] ** -0.5)
        return {
            "q_a_proj": self.full(p + "q_a_proj.weight"),
            "q_a_layernorm": self.full(p + "q_a_layernorm.weight"),
            "q_absorb": q_absorb.reshape(heads * kvl, ql).astype(ml_dtypes.bfloat16),
            "q_rope": np.ascontiguousarray(q[:, nope:]).reshape(heads * rope, ql),
            "kv_a_latent": kv_a[:kvl],
            "k_rope": kv_a[kvl:],
            "kv_a_layernorm": self.full(p + "kv_a_layernorm.weight"),
            "o_absorb": o_absorb.reshape(o.shape[0], heads * kvl).astype(ml_dtypes.bfloat16),
            "wq_b": self.full(ix + "wq_b.weight"),
            "wk": self.full(ix + "wk.weight"),
            "k_norm_weight": self.full(ix + "k_norm.weight"),
            "k_norm_bias": self.full(ix + "k_norm.bias"),
            "weights_proj": self.full(ix + "weights_proj.weight").astype(np.float32) * scale,
        }

    def moe(self, i: int, tp: int, rank: int, ep: int, ep_rank: int) -> dict[str, Arr]:
        p = f"layers.{i}.mlp."
        c = self.config
        n = c["n_routed_experts"] if "n_routed_experts" in c else c["num_experts"]
        base, rem = divmod(n, ep)  # vLLM's contiguous expert map
        first = ep_rank * base + min(ep_rank, rem)
        mine = range(first, first + base + (1 if ep_rank < rem else 0))
        e = p + "experts.{}."
        w13 = np.stack([
            np.concatenate([
                self.rows(e.format(j) + "gate_proj.weight", tp, rank),
                self.rows(e.format(j) + "up_proj.weight", tp, rank),
            ], axis=0)
            for j in mine
        ])  # fmt: skip
        w2 = np.stack([self.cols(e.format(j) + "down_proj.weight", tp, rank) for j in mine])
        s = p + "shared_experts."
        return {
            "router": self.full(p + "gate.weight"),
            "router_bias": self.full(p + "gate.e_score_correction_bias"),
            "w13": w13,
            "w2": w2,
            "shared_gate_up": np.concatenate(
                [
                    self.rows(s + "gate_proj.weight", tp, rank),
                    self.rows(s + "up_proj.weight", tp, rank),
                ],
                axis=0,
            ),
            "shared_down": self.cols(s + "down_proj.weight", tp, rank),
        }
