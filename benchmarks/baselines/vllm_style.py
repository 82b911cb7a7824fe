"""The loader a vLLM user would write by hand for every block of the GLM-5.3-Flash slice
(KDA and DSA attention, the dense and MoE MLPs, the layer norms, mHC, the embedding, final norm
and LM head), Kimi Linear's and DeepSeek-V3.2's MLA and grouped-query attention, as the baseline.

Per tensor, a slice of the shard's memmap copied out reads this rank's rows or columns (what
``safe_open(...).get_slice(name)`` and vLLM's sharded ``weight_loader`` do; NumPy only, no
torch import, no specbind import: ``process`` loads this file by path), sharded as vLLM's
layers shard: column-parallel linears by rows, row-parallel ones by columns, norms and mHC
replicated, the embedding and head by vocabulary rows (``VocabParallelEmbedding`` /
``ParallelLMHead``, without vLLM's padding of the vocabulary to a multiple of 64: specbind splits
it evenly, and the two are compared). NumPy does the rest: the MLA absorbs as batched matmuls
over this rank's heads only, in F32, the scale, the casts. A field merged from several
tensors (the KDA conv, a dense or shared ``gate_up``, the MoE ``w13`` / ``w2``) is allocated
once with ``np.empty`` and each source slice is copied straight from the map into its rows,
as vLLM's ``MergedColumnParallelLinear`` and ``FusedMoE`` weight loaders copy into their
preallocated parameters: no ``np.concatenate`` / ``np.stack`` of temporaries. It knows the
layer layout and vLLM's expert map by hand; it checks nothing. Its outputs are compared with
specbind's before anything is timed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

Arr = np.ndarray[Any, Any]


_DTYPES: dict[str, Any] = {
    "BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "I64": np.int64,
    "U8": np.uint8, "F8_E4M3": ml_dtypes.float8_e4m3fn,
}  # fmt: skip


class _Shard:
    """One shard: its header (safetensors' JSON) and its data buffer as a read-only map.

    Why not ``safe_open(framework="numpy").get_slice``: with safetensors 0.8 it cannot hand out
    BF16 (``TypeError: data type 'bfloat16' not understood``), and every weight here is BF16;
    slicing a memmap and copying the slice is what ``get_slice`` does, in NumPy only."""

    def __init__(self, path: Path) -> None:
        import json
        import mmap

        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            self.head: dict[str, Any] = json.loads(f.read(n))
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.head.pop("__metadata__", None)
        self.data: Arr = np.frombuffer(self._map, dtype=np.uint8, offset=8 + n)

    def release(self) -> None:
        """Drop this process's pages of the map (the page cache keeps them; a later read maps
        them again), as closing a ``safe_open`` handle does."""
        import mmap

        if hasattr(mmap, "MADV_DONTNEED"):  # Linux and most Unixes
            self._map.madvise(mmap.MADV_DONTNEED)

    def view(self, name: str) -> Arr:
        t = self.head[name]
        dtype = _DTYPES[t["dtype"]]
        b, e = t["data_offsets"]
        flat: Arr = self.data[b:e].view(dtype)
        return flat.reshape(t["shape"])  # [n] -> the tensor's shape, row-major


class Loader:
    def __init__(self, ckpt: Path) -> None:
        import json

        index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
        self._files = {fn: _Shard(ckpt / fn) for fn in sorted(set(index.values()))}
        self._where = index
        self.config = json.loads((ckpt / "config.json").read_text())

    def _slice(self, name: str) -> Arr:
        return self._files[self._where[name]].view(name)

    def release(self) -> None:
        """Drop the map pages read so far from this process's memory (between blocks, so a
        whole-model load does not hold every page it has read)."""
        for f in self._files.values():
            f.release()

    def row_view(self, name: str, tp: int, rank: int) -> Arr:
        """This rank's rows of ``name`` as a view of the map (read when copied)."""
        s = self._slice(name)
        n = s.shape[0] // tp
        return s[rank * n : (rank + 1) * n]

    def col_view(self, name: str, tp: int, rank: int) -> Arr:
        s = self._slice(name)
        n = s.shape[-1] // tp
        return s[:, rank * n : (rank + 1) * n]

    def rows(self, name: str, tp: int, rank: int) -> Arr:
        return np.array(self.row_view(name, tp, rank))  # a copy, as get_slice makes

    def cols(self, name: str, tp: int, rank: int) -> Arr:
        return np.array(self.col_view(name, tp, rank))

    def merged_rows(self, names: list[str], tp: int, rank: int) -> Arr:
        """This rank's rows of each of ``names``, one after another, in one preallocated array
        (``MergedColumnParallelLinear``: rank r holds [a_r; b_r; ...])."""
        views = [self.row_view(n, tp, rank) for n in names]
        out = np.empty((sum(v.shape[0] for v in views), *views[0].shape[1:]), views[0].dtype)
        at = 0
        for v in views:
            out[at : at + v.shape[0]] = v  # straight from the map, no temporary
            at += v.shape[0]
        return out

    def full(self, name: str) -> Arr:
        return np.array(self._slice(name))

    def load(
        self, block: str, i: int, tp: int, rank: int, ep: int = 1, ep_rank: int = 0
    ) -> dict[str, Arr]:
        """Layer ``i``'s ``block`` (a block name of the specs: "kda", "dsa", "moe", "dense",
        "layer_norms", "mhc", "lm_globals" (``i`` unused), "mla", "mla_indexed", "gqa") at
        (tp, rank) and (ep, ep_rank), its fields named as specbind names them."""
        if block == "moe":
            return self.moe(i, tp, rank, ep, ep_rank)
        # every other block is the same on each ep rank (vLLM: attention, dense MLPs, norms
        # and the vocabulary are split over tp only)
        if block == "dense":
            return self.dense(i, tp, rank)
        if block == "layer_norms":
            return self.layer_norms(i)
        if block == "mhc":
            return self.mhc(i)
        if block == "lm_globals":
            return self.lm_globals(tp, rank)
        if block == "kda":
            return self.kda(i, tp, rank)
        if block == "dsa":
            return self.dsa(i, tp, rank)
        if block == "mla":
            return self.mla(i, tp, rank)
        if block == "mla_indexed":
            return self.mla_indexed(i, tp, rank)
        if block == "gqa":
            return self.gqa(i, tp, rank)
        raise ValueError(f"no hand-written loader for {block!r}")

    def gqa(self, i: int, tp: int, rank: int) -> dict[str, Arr]:
        """q and o by query heads; k and v by KV heads, each replicated on tp / kv_heads ranks
        when tp exceeds them (vLLM's QKVParallelLinear: rank r holds KV head r // (tp / kv))."""
        p = f"layers.{i}.self_attn."
        kv = self.config["num_key_value_heads"]
        kv_tp, kv_rank = (tp, rank) if kv >= tp else (kv, rank // (tp // kv))
        out = {
            "q_proj": self.rows(p + "q_proj.weight", tp, rank),
            "k_proj": self.rows(p + "k_proj.weight", kv_tp, kv_rank),
            "v_proj": self.rows(p + "v_proj.weight", kv_tp, kv_rank),
            "o_proj": self.cols(p + "o_proj.weight", tp, rank),
        }
        if p + "q_norm.weight" in self._where:
            out |= {
                "q_norm": self.full(p + "q_norm.weight"),
                "k_norm": self.full(p + "k_norm.weight"),
            }
        return out

    def kda(self, i: int, tp: int, rank: int) -> dict[str, Arr]:
        p = f"layers.{i}.self_attn."
        rows = {f: self.rows(p + n, tp, rank) for f, n in [
            ("q_proj", "q_proj.weight"), ("k_proj", "k_proj.weight"), ("v_proj", "v_proj.weight"),
            ("f_b", "f_b_proj.weight"), ("g_b", "g_b_proj.weight"), ("b_proj", "b_proj.weight"),
            ("a_log", "A_log"), ("dt_bias", "dt_bias")]}  # fmt: skip
        # [q_r; k_r; v_r] of the [n, 1, K] convs, then [3 n_r, 1, K] -> [3 n_r, K]
        conv = self.merged_rows([p + f"{x}_conv1d.weight" for x in "qkv"], tp, rank)
        return rows | {
            "conv": conv.reshape(conv.shape[0], conv.shape[-1]),
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
        # batched matmul over this rank's heads only: [h, c, r] @ [h, r, k] -> [h, c, k]
        q_absorb = np.matmul(kv_b[:, :nope].transpose(0, 2, 1), q_b)
        # [h, i, r] @ [h, r, c] -> [h, i, c] -> [i, h, c]
        o_absorb = np.matmul(o.transpose(1, 0, 2), kv_b[:, nope:]).transpose(1, 0, 2)
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
        n = next(c[k] for k in ("n_routed_experts", "num_experts", "num_local_experts") if k in c)
        base, rem = divmod(n, ep)  # vLLM's contiguous expert map
        first = ep_rank * base + min(ep_rank, rem)
        mine = range(first, first + base + (1 if ep_rank < rem else 0))
        e = p + "experts.{}."
        gate = self.row_view(e.format(first) + "gate_proj.weight", tp, rank)  # [n_r, hidden]
        down = self.col_view(e.format(first) + "down_proj.weight", tp, rank)  # [hidden, n_r]
        n_r = gate.shape[0]
        # vLLM's FusedMoE parameters, allocated once; each expert's shards copied into them
        w13 = np.empty((len(mine), 2 * n_r, gate.shape[1]), gate.dtype)
        w2 = np.empty((len(mine), *down.shape), down.dtype)
        for k, j in enumerate(mine):
            w13[k, :n_r] = self.row_view(e.format(j) + "gate_proj.weight", tp, rank)
            w13[k, n_r:] = self.row_view(e.format(j) + "up_proj.weight", tp, rank)
            w2[k] = self.col_view(e.format(j) + "down_proj.weight", tp, rank)
        s = p + "shared_experts."
        out = {"router": self.full(p + "gate.weight"), "w13": w13, "w2": w2}
        if p + "gate.e_score_correction_bias" in self._where:  # a sigmoid router's bias
            out["router_bias"] = self.full(p + "gate.e_score_correction_bias")
        if s + "gate_proj.weight" not in self._where:  # no shared experts (Qwen3-MoE)
            return out
        return out | {
            "shared_gate_up": self.merged_rows(
                [s + "gate_proj.weight", s + "up_proj.weight"], tp, rank
            ),
            "shared_down": self.cols(s + "down_proj.weight", tp, rank),
        }

    def dense(self, i: int, tp: int, rank: int) -> dict[str, Arr]:
        """A dense SwiGLU MLP: gate and up merged by rows (column-parallel), down by columns
        (row-parallel)."""
        p = f"layers.{i}.mlp."
        return {
            "gate_up": self.merged_rows([p + "gate_proj.weight", p + "up_proj.weight"], tp, rank),
            "down": self.cols(p + "down_proj.weight", tp, rank),
        }

    def layer_norms(self, i: int) -> dict[str, Arr]:
        p = f"layers.{i}."
        return {
            "input_norm": self.full(p + "input_layernorm.weight"),
            "post_attention_norm": self.full(p + "post_attention_layernorm.weight"),
        }

    def mhc(self, i: int) -> dict[str, Arr]:
        """mHC, replicated: the projections widened to F32 (the engine keeps them F32), the
        bases and scales as stored (F32)."""
        p = f"layers.{i}.hc_"
        out = {}
        for at in ("attn", "ffn"):
            out[f"{at}_fn"] = self._slice(f"{p}{at}_fn").astype(np.float32)
            out[f"{at}_base"] = self.full(f"{p}{at}_base")
            out[f"{at}_scale"] = self.full(f"{p}{at}_scale")
        return out

    def lm_globals(self, tp: int, rank: int) -> dict[str, Arr]:
        """The embedding and the LM head by vocabulary rows, the final norm replicated; a tied
        head is the embedding's rows."""
        tied = self.config.get("tie_word_embeddings", False)
        return {
            "embed_tokens": self.rows("embed_tokens.weight", tp, rank),
            "norm": self.full("norm.weight"),
            "lm_head": self.rows("embed_tokens.weight" if tied else "lm_head.weight", tp, rank),
        }
