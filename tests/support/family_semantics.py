"""Semantic checks for the family proofs: a layer's output computed from every rank's bound
fields alone, summed over the ranks as the engine's all-reduce sums them, against the loaded
transformers module on the same input.

Each check is a factory returning ``(ctx, tp) -> None`` (a row's ``semantics`` entry). The
module runs in float64 on BF16-exact inputs; transformers' eager attention takes its softmax
in float32, so the two sides differ by float32 rounding there (about 1e-7 relative), and by
float64 rounding elsewhere. A wrong slice, order or section is off by order 1.

Traps:
* norms are applied through a copy of the module's own norm with the bound weight in it, so a
  family's norm formula (Gemma's ``1 + w``) is the module's, while the weight is the field's;
* attention runs without a mask (every token sees every token) on both sides; the module's
  ``scaling`` and logit soft-capping are runtime values, read from the module, not weights.
"""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
from family_proof import ProofContext
from family_table import Semantic

TOKENS = 7
REL_TOL = 1e-6  # float32 softmax inside the module (see the docstring)


def rel_err(got: Any, want: Any) -> float:
    return float(np.abs(got - want).max()) / float(np.abs(want).max())


def bf16_input(rows: int, cols: int, seed: int) -> Any:
    x = np.random.default_rng(seed).standard_normal((rows, cols))
    return x.astype(ml_dtypes.bfloat16).astype(np.float64)


def _t(a: Any) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def _norm_with(module_norm: Any, weight: Any, x: Any) -> Any:
    """The module's own norm formula with ``weight`` (a bound field) in place of its own."""
    import torch

    norm = copy.deepcopy(module_norm)
    with torch.no_grad():  # the field's own shape: a rank's rows of a [heads, hd] weight stay so
        norm.weight.data = _t(weight)
        return norm(x)


def swiglu_mlp(slot: str = "mlp") -> Semantic:
    """Σ over tp ranks of down_r · act(gate_r x) * (up_r x), from each rank's ``gate_up``
    ([gate_r; up_r]) and ``down``, equals the module's MLP (the act is the module's)."""

    def check(ctx: ProofContext, tp: int) -> None:
        import torch

        cfg = ctx.config
        for i in range(cfg["num_hidden_layers"]):
            mlp = ctx.layer(i).mlp
            act = getattr(mlp, "act_fn", None) or mlp.activation_fn  # GLM-4 names it so
            x = bf16_input(TOKENS, cfg["hidden_size"], seed=100 + i)
            with torch.no_grad():
                want = mlp(_t(x)).numpy()
            got = np.zeros_like(want)
            for r in range(tp):
                f = ctx.layer_fields(tp, r, i)
                gate, up = np.split(f[f"{slot}.gate_up"], 2)  # [2·I_r, H] -> 2 x [I_r, H]
                with torch.no_grad():
                    h = act(_t(x @ gate.T)).numpy() * (x @ up.T)
                got += h @ f[f"{slot}.down"].T
            assert rel_err(got, want) < REL_TOL, (ctx.row.model, i, tp, rel_err(got, want))

    return check


def _always(attn: Any) -> bool:
    return True


def attention(
    qk_norm: str | None = None, rotates: Callable[[Any], bool] = _always, rotary: bool = True
) -> Semantic:
    """Σ over tp ranks of each rank's attention through its o_proj columns equals the module's
    attention: q/k/v from the rank's ``q_proj``/``k_proj``/``v_proj`` (or one fused
    ``qkv_proj`` [q_r; k_r; v_r]) and their biases where bound; ``qk_norm="head"``: the bound
    q_norm/k_norm over each head (Qwen3), ``"head_after_rope"``: the same after the rotary
    (Hunyuan); rotary from the module's own rotary embedding
    (``rotates(module)``: whether the layer rotates at all, as the module decides: Cohere2's and
    EXAONE-4's global layers do not; ``rotary=False``: a model with no rotary embedding at all,
    OPT's learned positions)."""

    def check(ctx: ProofContext, tp: int) -> None:
        import torch

        cfg = ctx.config
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        x = bf16_input(TOKENS, cfg["hidden_size"], seed=tp)
        for i in range(cfg["num_hidden_layers"]):
            cos, sin = _rotary(ctx, x, i) if rotary else (None, None)
            attn = getattr(ctx.layer(i), "self_attn", None) or ctx.layer(i).self_attention
            pos = {"position_embeddings": (cos, sin)} if rotary else {}
            if "alibi" in inspect.signature(attn.forward).parameters:  # Falcon: rotary, no alibi
                pos |= {"alibi": None, "attention_mask": torch.zeros(1, 1, TOKENS, TOKENS)}
            else:
                pos |= {"attention_mask": None}
            with torch.no_grad():
                want = attn(hidden_states=_t(x)[None], **pos)[0][0].numpy()
            rope = rotary and rotates(attn)
            got = sum(
                _attention_rank(ctx.layer_fields(tp, r, i), attn, x, (cos, sin, rope), hd, qk_norm)
                for r in range(tp)
            )
            if "attention.o_bias" in ctx.layer_fields(tp, 0, i):
                got = got + ctx.layer_fields(tp, 0, i)["attention.o_bias"]  # added once
            assert rel_err(got, want) < REL_TOL, (ctx.row.model, i, tp, rel_err(got, want))

    return check


def _rotary(ctx: ProofContext, x: Any, i: int) -> tuple[Any, Any]:
    """(cos, sin) of positions 0..T-1 for layer ``i`` from the model's own rotary embedding
    (Gemma 3's takes the layer's type: local and global layers rotate with other bases)."""
    import torch

    rotary = ctx.model.base_model.rotary_emb  # .model, or .gpt_neox
    args: tuple[Any, ...] = (_t(x)[None], torch.arange(x.shape[0])[None])
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        args = (*args, ctx.config["layer_types"][i])
    with torch.no_grad():
        cos, sin = rotary(*args)
    return cos, sin


def _attention_rank(
    f: dict[str, Any], attn: Any, x: Any, rotary: tuple[Any, Any, bool], hd: int,
    qk_norm: str | None,
) -> Any:  # fmt: skip
    t = x.shape[0]
    if "attention.qkv_proj" in f:
        w = f["attention.qkv_proj"]
        b = f.get("attention.qkv_bias")
    else:
        w = np.concatenate([f[f"attention.{p}_proj"] for p in "qkv"])
        bias = [f.get(f"attention.{p}_bias") for p in "qkv"]
        b = None if bias[0] is None else np.concatenate(bias)
    # this rank's heads: q rows h_r·hd, then k and v kv_r·hd each
    q_rows = f["attention.o_proj"].shape[1]
    kv_rows = (w.shape[0] - q_rows) // 2
    y = x @ w.T + (0 if b is None else b)  # [T, (h_r + 2·kv_r)·hd]
    q = _t(y[:, :q_rows]).view(t, -1, hd)  # [T, h_r, hd]
    k = _t(y[:, q_rows : q_rows + kv_rows]).view(t, -1, hd)  # [T, kv_r, hd]
    v = _t(y[:, q_rows + kv_rows :]).view(t, -1, hd)
    post = None
    if qk_norm == "head":
        q = _norm_with(attn.q_norm, f["attention.q_norm"], q)
        k = _norm_with(attn.k_norm, f["attention.k_norm"], k)
    elif qk_norm == "head_after_rope":  # Hunyuan: query_/key_layernorm after the rotary

        def post(q: Any, k: Any) -> tuple[Any, Any]:
            return (_norm_with(attn.query_layernorm, f["attention.q_norm"], q),
                    _norm_with(attn.key_layernorm, f["attention.k_norm"], k))  # fmt: skip

    return _attend(attn, q, k, v, rotary, hd, post) @ f["attention.o_proj"].T


def _attend(
    attn: Any, q: Any, k: Any, v: Any, rotary: tuple[Any, Any, bool], hd: int,
    post_rope: Callable[[Any, Any], tuple[Any, Any]] | None = None,
) -> Any:  # fmt: skip
    """softmax(rope(q) rope(k)^T * scaling) v for q [T, h·hd], k and v [T, kv·hd] (or already
    [T, h, hd]), with the module's scaling, soft-cap and rotary (``rotary``: cos, sin, and
    whether this layer rotates at all); [T, h·hd] as NumPy."""
    import torch

    t = q.shape[0]
    q, k, v = (a.reshape(t, -1, hd).transpose(0, 1)[None] for a in (q, k, v))  # [1, n, T, hd]
    cos, sin, rotates = rotary
    if rotates:
        rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb  # the module's own
        rd = cos.shape[-1]  # partial rotary (StableLM, Nemotron): the first rd dims of each head
        q_rot, k_rot = rope(q[..., :rd], k[..., :rd], cos, sin)
        q, k = torch.cat([q_rot, q[..., rd:]], -1), torch.cat([k_rot, k[..., rd:]], -1)
    if post_rope is not None:
        q, k = post_rope(q, k)
    group = q.shape[1] // k.shape[1]  # query heads per KV head
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scaling = getattr(attn, "scaling", None) or attn.inv_norm_factor  # Falcon's name for it
    logits = q @ k.transpose(-1, -2) * scaling
    cap = getattr(attn, "attn_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    o = (torch.softmax(logits, dim=-1) @ v)[0].transpose(0, 1).reshape(t, -1)  # [T, h·hd]
    return o.numpy()


def gathered_attention() -> Semantic:
    """OLMo-2 under vLLM's Transformers backend: every rank's q, k and v outputs gathered
    (concatenated in rank order) into the whole projections, normed by the bound whole-
    projection q_norm/k_norm, attended over all heads; then o_proj split by input columns,
    each rank's share of the output summed, equals the module's attention."""

    def check(ctx: ProofContext, tp: int) -> None:
        import torch

        cfg = ctx.config
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        x = bf16_input(TOKENS, cfg["hidden_size"], seed=tp)
        for i in range(cfg["num_hidden_layers"]):
            cos, sin = _rotary(ctx, x, i)
            attn = ctx.layer(i).self_attn
            with torch.no_grad():
                want = attn(
                    hidden_states=_t(x)[None], position_embeddings=(cos, sin), attention_mask=None
                )[0][0].numpy()
            ranks = [ctx.layer_fields(tp, r, i) for r in range(tp)]
            q, k, v = (
                np.concatenate([x @ f[f"attention.{p}_proj"].T for f in ranks], axis=1)
                for p in "qkv"
            )  # each [T, whole projection]
            q = _norm_with(attn.q_norm, ranks[0]["attention.q_norm"], _t(q))
            k = _norm_with(attn.k_norm, ranks[0]["attention.k_norm"], _t(k))
            o = _attend(attn, q, k, _t(v), (cos, sin, True), hd)  # [T, heads·hd], every head
            got = np.zeros_like(want)
            lo = 0
            for f in ranks:  # RowParallelLinear: rank r's input columns, summed
                cols = f["attention.o_proj"].shape[1]
                got += o[:, lo : lo + cols] @ f["attention.o_proj"].T
                lo += cols
            assert rel_err(got, want) < REL_TOL, (ctx.row.model, i, tp, rel_err(got, want))

    return check


def fc_mlp() -> Semantic:
    """A non-gated MLP with biases (Starcoder2, Phi, GPT-NeoX): Σ over tp ranks of
    act(x c_fc_r^T + b_r) c_proj_r^T, plus the replicated c_proj bias once, equals the
    module's MLP (the act is the module's)."""

    def module(layer: Any) -> tuple[Any, Any]:
        mlp = layer.mlp
        return mlp, getattr(mlp, "act", None) or mlp.activation_fn  # Phi's name for it

    return _fc_check(module)


def opt_mlp() -> Semantic:
    """OPT's MLP, fc1 and fc2 at the layer's root: fc2(act(fc1(x))) as its decoder layer
    computes it, against the ranks' c_fc / c_proj fields as ``fc_mlp``."""

    def module(layer: Any) -> tuple[Any, Any]:
        return (lambda x: layer.fc2(layer.activation_fn(layer.fc1(x)))), layer.activation_fn

    return _fc_check(module)


def _fc_check(module: Callable[[Any], tuple[Any, Any]]) -> Semantic:
    def check(ctx: ProofContext, tp: int) -> None:
        import torch

        cfg = ctx.config
        for i in range(cfg["num_hidden_layers"]):
            forward, act = module(ctx.layer(i))
            x = bf16_input(TOKENS, cfg["hidden_size"], seed=200 + i)
            with torch.no_grad():
                want = forward(_t(x)).numpy()
            got = ctx.layer_fields(tp, 0, i)["mlp.c_proj_bias"] + np.zeros_like(want)
            for r in range(tp):
                f = ctx.layer_fields(tp, r, i)
                with torch.no_grad():
                    h = act(_t(x @ f["mlp.c_fc"].T + f["mlp.c_fc_bias"])).numpy()
                got += h @ f["mlp.c_proj"].T
            assert rel_err(got, want) < REL_TOL, (ctx.row.model, i, tp, rel_err(got, want))

    return check


def up_down_mlp() -> Semantic:
    """A non-gated MLP (Nemotron, Arcee, Falcon): Σ over tp ranks of down_r · act(up_r x) equals the
    module's MLP (the act is the module's)."""

    def check(ctx: ProofContext, tp: int) -> None:
        import torch

        cfg = ctx.config
        for i in range(cfg["num_hidden_layers"]):
            mlp = ctx.layer(i).mlp
            act = getattr(mlp, "act_fn", None) or mlp.act  # Falcon's name for it
            x = bf16_input(TOKENS, cfg["hidden_size"], seed=300 + i)
            with torch.no_grad():
                want = mlp(_t(x)).numpy()
            got = np.zeros_like(want)
            for r in range(tp):
                f = ctx.layer_fields(tp, r, i)
                with torch.no_grad():
                    got += act(_t(x @ f["mlp.up"].T)).numpy() @ f["mlp.down"].T
            assert rel_err(got, want) < REL_TOL, (ctx.row.model, i, tp, rel_err(got, want))

    return check


def neox_attention() -> Semantic:
    """GPT-NeoX: each rank's fused qkv rows are whole heads, each head's [q; k; v] in turn;
    Σ over tp ranks of each rank's attention through its dense columns, plus the dense bias
    once, equals the module's attention."""

    def check(ctx: ProofContext, tp: int) -> None:
        import torch

        cfg = ctx.config
        hd = cfg["hidden_size"] // cfg["num_attention_heads"]
        x = bf16_input(TOKENS, cfg["hidden_size"], seed=tp)
        for i in range(cfg["num_hidden_layers"]):
            cos, sin = _rotary(ctx, x, i)
            attn = ctx.layer(i).attention
            with torch.no_grad():
                want = attn(
                    hidden_states=_t(x)[None], position_embeddings=(cos, sin), attention_mask=None
                )[0][0].numpy()
            got = ctx.layer_fields(tp, 0, i)["attention.o_bias"] + np.zeros_like(want)
            for r in range(tp):
                f = ctx.layer_fields(tp, r, i)
                y = x @ f["attention.qkv_proj"].T + f["attention.qkv_bias"]  # [T, h_r·3·hd]
                q, k, v = np.split(y.reshape(TOKENS, -1, 3 * hd), 3, axis=-1)  # [T, h_r, hd]
                o = _attend(attn, _t(q), _t(k), _t(v), (cos, sin, True), hd)
                got += o @ f["attention.o_proj"].T
            assert rel_err(got, want) < REL_TOL, (ctx.row.model, i, tp, rel_err(got, want))

    return check


def gated_attention() -> Semantic:
    """Qwen3-Next's full-attention layers: each rank's q_proj rows viewed as its heads'
    [q_h; gate_h] ([T, h_r, 2·hd], chunked as the module chunks them), q and k normed per head
    by the bound q_norm/k_norm, rotated, attended over the rank's KV heads, scaled by
    sigmoid(gate) and put through the rank's o_proj columns; Σ over tp ranks equals the module's
    attention. Layers without ``self_attn`` (linear attention) are skipped; at least one runs."""

    def check(ctx: ProofContext, tp: int) -> None:
        import torch

        cfg = ctx.config
        hd = cfg["head_dim"]
        x = bf16_input(TOKENS, cfg["hidden_size"], seed=tp)
        checked = 0
        for i in range(cfg["num_hidden_layers"]):
            attn = getattr(ctx.layer(i), "self_attn", None)
            if attn is None:
                continue
            cos, sin = _rotary(ctx, x, i)
            with torch.no_grad():
                want = attn(_t(x)[None], (cos, sin), None)[0][0].numpy()
            got = np.zeros_like(want)
            for r in range(tp):
                f = ctx.layer_fields(tp, r, i)
                qg = (x @ f["attention.q_proj"].T).reshape(TOKENS, -1, 2 * hd)  # [T, h_r, 2·hd]
                q, gate = qg[..., :hd], qg[..., hd:]  # each [T, h_r, hd]
                k = (x @ f["attention.k_proj"].T).reshape(TOKENS, -1, hd)  # [T, kv_r, hd]
                v = x @ f["attention.v_proj"].T  # [T, kv_r·hd]
                qn = _norm_with(attn.q_norm, f["attention.q_norm"], _t(q))
                kn = _norm_with(attn.k_norm, f["attention.k_norm"], _t(k))
                o = _attend(attn, qn, kn, _t(v), (cos, sin, True), hd)  # [T, h_r·hd]
                o = o / (1.0 + np.exp(-gate.reshape(TOKENS, -1)))  # · sigmoid(gate)
                got += o @ f["attention.o_proj"].T
            assert rel_err(got, want) < REL_TOL, (ctx.row.model, i, tp, rel_err(got, want))
            checked += 1
        assert checked, f"{ctx.row.model}: no full-attention layer"

    return check


def gated_deltanet(slot: str = "attention", module: str = "linear_attn") -> Semantic:
    """Qwen3-Next's Gated DeltaNet layers, whole (projections, conv, scan, gated norm): a copy
    of the module holding one rank's fields and k_heads / tp key heads, v_heads / tp value
    heads, run forward on the same input; Σ over tp ranks of those outputs (out_proj is
    row-parallel) equals the module's output. The mixer is separable by key-head group (the
    conv is depthwise, each value head's recurrence its own), so a rank's fields give exactly
    its groups' share; a rank holding another rank's rows, or a section of another order, is
    off by order 1."""

    def check(ctx: ProofContext, tp: int) -> None:
        import torch

        cfg = ctx.config
        x = bf16_input(TOKENS, cfg["hidden_size"], seed=600 + tp)
        checked = 0
        for i in range(cfg["num_hidden_layers"]):
            gdn = getattr(ctx.layer(i), module, None)
            if gdn is None:
                continue
            with torch.no_grad():
                want = gdn(_t(x)[None])[0].numpy()
            got = np.zeros_like(want)
            for r in range(tp):
                f = ctx.layer_fields(tp, r, i)
                mine = copy.deepcopy(gdn)
                mine.num_k_heads, mine.num_v_heads = gdn.num_k_heads // tp, gdn.num_v_heads // tp
                mine.key_dim = mine.num_k_heads * gdn.head_k_dim
                mine.value_dim = mine.num_v_heads * gdn.head_v_dim
                with torch.no_grad():
                    for name, field in (
                        ("in_proj_qkvz.weight", "in_proj_qkvz"), ("in_proj_ba.weight", "in_proj_ba"),
                        ("conv1d.weight", "conv1d"), ("A_log", "a_log"), ("dt_bias", "dt_bias"),
                        ("norm.weight", "norm"), ("out_proj.weight", "out_proj"),
                    ):  # fmt: skip
                        mine.get_parameter(name).data = _t(f[f"{slot}.{field}"])
                    got += mine(_t(x)[None])[0].numpy()
            # the module's scan runs in float32 per head, as each rank's copy does (measured:
            # 0 at tp 1, about 3e-9 at tp 2)
            assert rel_err(got, want) < REL_TOL, (ctx.row.model, i, tp, rel_err(got, want))
            checked += 1
        assert checked, f"{ctx.row.model}: no Gated DeltaNet layer"

    return check
