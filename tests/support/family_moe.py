"""Reference rules and the semantic check for the mixture-of-experts family rows.

Rules (over the LOADED module's tensors, written from vLLM's FusedMoE loader, never read back
from the spec): an ep rank holds the contiguous experts ``[e·base + min(e, rem), + base + (e <
rem))`` (``base, rem = divmod(E, ep)``), and within each expert tp rank r its r-th block of the
intermediate size, as vLLM's ``FusedMoE.weight_loader`` narrows w1/w3 by rows and w2 by columns.

* ``W13(t, inter)``: transformers' fused ``experts.gate_up_proj`` [E, 2·I, X] (gate first) as
  FusedMoE's w13 [E_r, 2·I/tp, X]: each of the rank's experts' [gate_r; up_r];
* ``W2(t, inter)``: ``experts.down_proj`` [E, X, I] as w2 [E_r, X, I/tp];
* ``Stacked(rule)``: a per-expert layout written as a rule over one expert ``[.., ..]`` (a
  stored ``[E, ...]`` tensor's member), stacked over the rank's experts.

Each has ``slice_ep`` (the harness passes the ep size and rank to a rule that has one).

The semantic check (``sparse_moe``) routes with a copy of the module's own router holding each
rank's bound router weight (so a family's routing formula, float32 softmax included, is the
module's own), then sums over every (tp, ep) rank the rank's experts' SwiGLU outputs from its
w13/w2 (the module's activation), scaled by the routing weights, plus the shared expert's tp
share (on ep rank 0 only), gated as the module gates it. The sum equals the module's output.
Trap: a routing decided by a near-tie could flip between two equal-looking computations;
routing through the module's own router with the bound weight (bit-equal to its own, as the
field proof shows) takes the same decisions.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from family_proof import ProofContext
from family_table import Units, units_of

REL_TOL = 1e-6
TOKENS = 23


def experts_of(n: int, ep: int, e: int) -> slice:
    base, rem = divmod(n, ep)
    lo = e * base + min(e, rem)
    return slice(lo, lo + base + (1 if e < rem else 0))


def _block(n: int, tp: int, r: int) -> slice:
    assert n % tp == 0, f"tp {tp} does not divide {n}"
    return slice(r * n // tp, (r + 1) * n // tp)


@dataclass(frozen=True)
class W13:
    tensor: str  # [E, 2·I, X], gate rows first
    inter: Units

    def slice_ep(
        self, t: Callable[[str], Any], cfg: Mapping[str, Any], tp: int, r: int, ep: int, e: int
    ) -> Any:
        a = t(self.tensor)
        i = units_of(cfg, self.inter)
        assert a.shape[1] == 2 * i, (self.tensor, a.shape, i)
        mine = a[experts_of(a.shape[0], ep, e)]
        rows = _block(i, tp, r)
        return np.concatenate([mine[:, :i][:, rows], mine[:, i:][:, rows]], axis=1)


@dataclass(frozen=True)
class W2:
    tensor: str  # [E, X, I]
    inter: Units

    def slice_ep(
        self, t: Callable[[str], Any], cfg: Mapping[str, Any], tp: int, r: int, ep: int, e: int
    ) -> Any:
        a = t(self.tensor)
        i = units_of(cfg, self.inter)
        assert a.shape[2] == i, (self.tensor, a.shape, i)
        return a[experts_of(a.shape[0], ep, e)][:, :, _block(i, tp, r)]


@dataclass(frozen=True)
class Stacked:
    """A per-expert rule (over one expert's ``[.., ..]``, named ``member``) stacked over the
    rank's experts of the stored ``[E, ...]`` tensor ``tensor``."""

    tensor: str
    rule: Any  # its tensor name is "member"

    def slice_ep(
        self, t: Callable[[str], Any], cfg: Mapping[str, Any], tp: int, r: int, ep: int, e: int
    ) -> Any:
        a = t(self.tensor)
        return np.stack(
            [
                self.rule.slice(lambda _, m=m: m, cfg, tp, r)
                for m in a[experts_of(a.shape[0], ep, e)]
            ]
        )


@dataclass(frozen=True)
class Flat:
    """A replicated tensor the module holds with extra size-1 axes (ERNIE's [1, E] correction
    bias), flattened to the bound field's shape."""

    tensor: str

    def slice(self, t: Callable[[str], Any], cfg: Mapping[str, Any], tp: int, r: int) -> Any:
        return t(self.tensor).reshape(-1)  # [1, E] -> [E]


def _t(a: Any) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def bf16_input(rows: int, cols: int, seed: int) -> Any:
    import ml_dtypes

    x = np.random.default_rng(seed).standard_normal((rows, cols))
    return x.astype(ml_dtypes.bfloat16).astype(np.float64)


def rel_err(got: Any, want: Any) -> float:
    return float(np.abs(got - want).max()) / float(np.abs(want).max())


def _route(module_gate: Any, weight: Any, bias: Any, x: Any) -> tuple[Any, Any]:
    """(top-k expert ids [T, k], their weights [T, k]) from a copy of the module's router with
    ``weight`` (a rank's bound router) and ``bias`` (its bound score-correction bias, or None)
    in place of its own."""
    import torch

    gate = copy.deepcopy(module_gate)
    with torch.no_grad():
        gate.weight.data = _t(weight)
        if bias is not None:  # in the module's own dtype and shape (F32; ERNIE's [1, E])
            holder = getattr(gate, "moe_statics", gate)
            own = holder.e_score_correction_bias
            own.data = _t(bias).to(own.dtype).reshape(own.shape)
        _, weights, index = gate(_t(x))
    return index.numpy(), weights.double().numpy()


def sparse_moe(
    slot: str = "mlp",
    module: str = "mlp",
    shared: Literal["plain", "sigmoid"] | None = None,
    router: str = "gate",
    plus: str | None = None,
) -> Any:
    """The summed per-(tp, ep)-rank MoE output equals the module's, every layer whose
    ``slot`` binds w13. ``shared``: the rank's shared expert (``shared_gate_up`` /
    ``shared_down``) added as is (``plain``: GLM-4.5, ERNIE-4.5) or scaled by
    ``sigmoid(shared_gate · x)`` from the bound, replicated gate (``sigmoid``: Qwen2-MoE).
    ``router``: the block's router module (PhiMoE's is ``router``); ``plus``: a module of the
    layer whose output the layer adds to the block's (Granite-4's ``shared_mlp``)."""

    def check(ctx: ProofContext, tp: int, ep: int) -> None:
        import torch

        cfg = ctx.config
        checked = 0
        for i in range(cfg["num_hidden_layers"]):
            block = ctx.layer(i).get_submodule(module)
            if f"layers.{i}.{slot}.w13" not in ctx.fields(tp, 0, ep, 0):
                continue  # a dense layer of a schedule
            act = block.experts.act_fn
            x = bf16_input(TOKENS, cfg["hidden_size"], seed=200 + i)
            with torch.no_grad():
                want = block(_t(x)[None]).numpy()[0]
                if plus is not None:
                    want = want + ctx.layer(i).get_submodule(plus)(_t(x)).numpy()
            got = np.zeros_like(want)
            for r in range(tp):
                for e in range(ep):
                    f = ctx.fields(tp, r, ep, e)
                    head = f"layers.{i}.{slot}."
                    w13, w2 = f[head + "w13"], f[head + "w2"]
                    first = experts_of(f[head + "router"].shape[0], ep, e).start
                    index, weights = _route(
                        block.get_submodule(router), f[head + "router"],
                        f.get(head + "router_bias"), x,
                    )  # fmt: skip
                    for j in range(w13.shape[0]):
                        hit = index == first + j  # [T, k]
                        scale = (weights * hit).sum(axis=-1)  # [T]
                        gate, up = np.split(w13[j], 2)  # [2·I_r, X] -> 2 x [I_r, X]
                        with torch.no_grad():
                            h = act(_t(x @ gate.T)).numpy() * (x @ up.T)
                        got += scale[:, None] * (h @ w2[j].T)
                    if shared is not None and e == 0:
                        sg, su = np.split(f[head + "shared_gate_up"], 2)
                        with torch.no_grad():
                            h = act(_t(x @ sg.T)).numpy() * (x @ su.T)
                        y = h @ f[head + "shared_down"].T
                        if shared == "sigmoid":
                            y = y / (1.0 + np.exp(-(x @ f[head + "shared_gate"].T)))
                        got += y
            assert rel_err(got, want) < REL_TOL, (ctx.row.model, i, tp, ep, rel_err(got, want))
            checked += 1
        assert checked, f"{ctx.row.model}: no layer binds {slot}.w13"

    check.per_ep = True  # type: ignore[attr-defined]
    return check


def whole_norm_attention() -> Any:
    """OLMoE in vLLM's native layout: q (split by heads) and k, v (split by KV heads, each
    replicated on tp / kv_heads ranks where tp exceeds them) gathered into the whole
    projections (one copy of each KV head), normed by the bound whole-projection q_norm /
    k_norm, attended over all heads; o_proj split by input columns, every rank's share of the
    output summed, equals the module's attention."""
    from family_semantics import _attend, _norm_with, _rotary

    def check(ctx: ProofContext, tp: int) -> None:
        import torch

        cfg = ctx.config
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        kv = cfg["num_key_value_heads"]
        x = bf16_input(TOKENS, cfg["hidden_size"], seed=tp)
        holders = range(0, tp, max(tp // kv, 1))  # one rank per distinct KV head share
        for i in range(cfg["num_hidden_layers"]):
            cos, sin = _rotary(ctx, x, i)
            attn = ctx.layer(i).self_attn
            with torch.no_grad():
                want = attn(_t(x)[None], (cos, sin), None)[0][0].numpy()
            ranks = [ctx.layer_fields(tp, r, i) for r in range(tp)]
            q = np.concatenate([x @ f["attention.q_proj"].T for f in ranks], axis=1)
            k, v = (
                np.concatenate([x @ ranks[r][f"attention.{p}_proj"].T for r in holders], axis=1)
                for p in "kv"
            )  # each [T, whole projection]
            q = _norm_with(attn.q_norm, ranks[0]["attention.q_norm"], _t(q))
            k = _norm_with(attn.k_norm, ranks[0]["attention.k_norm"], _t(k))
            o = _attend(attn, q, k, _t(v), (cos, sin, True), hd)  # [T, heads·hd]
            got = np.zeros_like(want)
            lo = 0
            for f in ranks:  # RowParallelLinear: rank r's input columns, summed
                cols = f["attention.o_proj"].shape[1]
                got += o[:, lo : lo + cols] @ f["attention.o_proj"].T
                lo += cols
            assert rel_err(got, want) < REL_TOL, (ctx.row.model, i, tp, rel_err(got, want))

    return check


def dense_layers(slot: str = "mlp") -> Any:
    """The dense layers of a MoE schedule (those whose ``slot`` binds ``gate_up``): Σ over tp
    ranks of down_r · act(gate_r x) * (up_r x) equals the module's MLP."""

    def check(ctx: ProofContext, tp: int) -> None:
        import torch

        cfg = ctx.config
        checked = 0
        for i in range(cfg["num_hidden_layers"]):
            if f"layers.{i}.{slot}.gate_up" not in ctx.fields(tp, 0):
                continue
            mlp = ctx.layer(i).mlp
            x = bf16_input(TOKENS, cfg["hidden_size"], seed=300 + i)
            with torch.no_grad():
                want = mlp(_t(x)).numpy()
            got = np.zeros_like(want)
            for r in range(tp):
                f = ctx.layer_fields(tp, r, i)
                gate, up = np.split(f[f"{slot}.gate_up"], 2)  # [2·I_r, X] -> 2 x [I_r, X]
                with torch.no_grad():
                    h = mlp.act_fn(_t(x @ gate.T)).numpy() * (x @ up.T)
                got += h @ f[f"{slot}.down"].T
            assert rel_err(got, want) < REL_TOL, (ctx.row.model, i, tp, rel_err(got, want))
            checked += 1
        assert checked, f"{ctx.row.model}: no dense layer"

    return check


def mamba2_projections(slot: str = "mixer", module: str = "mixer") -> Any:
    """Each tp rank's in_proj applied to x gives, section by section (z, x, B, C by heads or
    groups, dt by heads), its block of the module's own in_proj output; and out_proj split by
    input columns, summed over ranks, equals the module's out_proj (a Mamba2 layer's tp-split
    projections, as NemotronH's are proven; the scan itself is not recomputed here)."""

    def check(ctx: ProofContext, tp: int) -> None:
        import torch

        cfg = ctx.config
        heads, hd = cfg.get("num_heads") or cfg["mamba_n_heads"], cfg.get("mamba_d_head")
        hd = hd or cfg["head_dim"]
        groups = cfg.get("mamba_n_groups") or cfg["n_groups"]
        state = cfg.get("mamba_d_state") or cfg["state_size"]
        inner, gs = heads * hd, groups * state
        sections = [(inner, heads), (inner, heads), (gs, groups), (gs, groups), (heads, heads)]
        x = bf16_input(TOKENS, cfg["hidden_size"], seed=400 + tp)
        checked = 0
        for i in range(cfg["num_hidden_layers"]):
            mixer = getattr(ctx.layer(i), module, None)
            if mixer is None or not hasattr(mixer, "in_proj"):
                continue  # an attention layer of a hybrid
            checked += 1
            with torch.no_grad():
                whole = mixer.in_proj(_t(x)).numpy()  # [T, z + x + B + C + dt]
            ranks = [ctx.layer_fields(tp, r, i) for r in range(tp)]
            for r, f in enumerate(ranks):
                got = x @ f[f"{slot}.in_proj"].T
                want, lo = [], 0
                for size, units in sections:
                    part = whole[:, lo : lo + size]
                    # rank r's block: size / tp rows, or (tp > units) unit r // (tp / units)
                    per = size // tp if tp <= units else size // units
                    first = (r if tp <= units else r // (tp // units)) * per
                    want.append(part[:, first : first + per])
                    lo += size
                assert np.allclose(got, np.concatenate(want, axis=1), rtol=1e-12, atol=1e-12)
            y = bf16_input(TOKENS, inner, seed=500 + i)
            with torch.no_grad():
                want_out = mixer.out_proj(_t(y)).numpy()
            got_out, lo = np.zeros_like(want_out), 0
            for f in ranks:  # RowParallelLinear over the rank's inner channels (its heads)
                cols = f[f"{slot}.out_proj"].shape[1]
                got_out += y[:, lo : lo + cols] @ f[f"{slot}.out_proj"].T
                lo += cols
            assert rel_err(got_out, want_out) < REL_TOL, (ctx.row.model, i, tp)
        assert checked, f"{ctx.row.model}: no Mamba2 layer"

    return check
