"""GLM-5.3-Flash's MLPs, computed from bound-field layouts alone, equal transformers' modules.

transformers' ``Glm5Next`` model writes a tiny checkpoint (``whole_model.write_whole_checkpoint``)
and loads it back; its dense MLP and MoE modules, run in float32, are the ground truth. The
reference (``whole_model.dense_forward`` / ``moe_forward``) sees only per-rank fields in the
layout fused-MoE engines read: the fields specbind binds from the file at that (tp, ep) rank.
``split_dense`` / ``split_moe`` build the same fields by hand from the checkpoint tensors, and
the bound ones must equal them byte for byte. Claims:

* the dense partials summed over tp ranks equal the dense MLP, at tp = 1, 2 and 4;
* the MoE partials summed over every (tp, ep) rank, the shared experts counted once per tp rank,
  equal the MoE block, for tp in {1, 2} and ep in {1, 2, 3, 4, 6} (E = 6: ep = 4 splits 2,2,1,1),
  in every sparse layer, below, at and past the SwiGLU clamp;
* the router uses e_score_correction_bias to choose experts and never to weight them, and its
  group stage (n_group > 1, unused by the released model) matches transformers' too;
* the check has teeth: a [up; gate] order, or down_proj's contiguous row block where its column
  slice belongs, fail it by orders of magnitude. Both bugs are silent otherwise: gate and up have
  identical shapes, and the row block of a row-major [H, I] tensor reshapes to [H, I/tp].

Two checkpoints (``VARIANTS``): the VL model as released (S = 1 shared expert, top-2) and the
text model alone with S = 2, top-3 and Im = 40. The checkpoint itself is checked first: BF16
everywhere but the tensors the released checkpoint keeps in F32.

Tolerance: every comparison is ``max|ref - module| <= REL_TOL * max|ref|`` with REL_TOL = 1e-4.
The reference runs in float64 on BF16-exact inputs and weights (error ~1e-15); the module runs
in float32 (unit roundoff u = 6e-8). Its longest chain is two dot products of at most 96 terms,
whose rounding error is bounded by ~n*u ~ 6e-6 of the sum of |terms|, and that sum exceeds the
output scale by the cancellation factor ~sqrt(n) ~ 10: 1e-4 covers the bound with margin, while
any layout error tried here misses by > 0.3 (MUTATION_FLOOR = 1e-2 is asserted). Measured:
<= 6e-7. A scale-relative (not element-wise) bound, because outputs near zero from cancellation
have no meaningful relative error. The two routers agree only where no near-tie decides the
choice: tokens whose deciding score gap is under MIN_MARGIN = 1e-4 are left out (the float32
score error is ~1e-7 at O(1) logits and ~1e-5 at the largest input scale), and at least 75% of
the tokens must remain.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from whole_model import (
    DENSE_LAYERS,
    KDA_LAYERS,
    SPARSE_LAYERS,
    TEXT_CONFIG,
    Array,
    Routing,
    dense_forward,
    expert_range,
    load_whole_model,
    mlp_tensors,
    module_output,
    module_route,
    moe_forward,
    read_checkpoint,
    repair_dtypes,
    route,
    routing_margin,
    split_dense,
    split_moe,
    text_layers,
    text_prefix,
    write_safetensors,
    write_whole_checkpoint,
)

from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

# exc_type=ImportError: a present but broken install (not only a missing one) skips too.
torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)
if not hasattr(transformers, "Glm5NextForConditionalGeneration"):
    pytest.skip("this transformers has no glm5_next model", allow_module_level=True)

pytestmark = pytest.mark.interop

REL_TOL = 1e-4  # see the module docstring
MUTATION_FLOOR = 1e-2  # a broken layout must miss by >= 100x the tolerance
MIN_MARGIN = 1e-4
TOKENS = 48
H = TEXT_CONFIG["hidden_size"]
# Input scales. The checkpoint's MLP weights are N(0, 0.02) (transformers' init), so gate/up
# pre-activations have std ~0.16 * scale: "small" never reaches the clamp, "unit" is O(1), and
# "clamped" drives a large share past swiglu_limit = 10 (each case asserts which it is).
SCALES = {"small": 1.0, "unit": 8.0, "clamped": 64.0}
MOE_RANKS = [(tp, ep) for tp in (1, 2) for ep in (1, 2, 3, 4, 6)]
TABLE = MODELS["glm-5.3-flash"]


@dataclass(frozen=True)
class Whole:
    """A written checkpoint, its tensors as on disk, and transformers' model loaded from it."""

    tensors: dict[str, Array]
    model: Any
    routing: Routing
    config: dict[str, Any]  # TEXT_CONFIG with the variant's overrides
    path: Path
    binds: dict[tuple[int, int, int, int], BindResult] = field(default_factory=dict)

    def bound(self, layer: int, tp: int, r: int, ep: int = 1, e: int = 0) -> dict[str, Array]:
        """Layer ``layer``'s MLP fields as specbind binds them at tp rank r, ep rank e."""
        key = (tp, r, ep, e)
        if key not in self.binds:
            self.binds[key] = bind_checkpoint(
                CheckpointDir(self.path), TABLE, tp_size=tp, tp_rank=r, ep_size=ep, ep_rank=e,
                progress=False,
            )  # fmt: skip
        found = [x for x in self.binds[key].layers if x.index == layer]
        arrays: dict[str, Array] = found[0].slots["mlp"].weights.arrays()
        return arrays

    def mlp(self, layer: int) -> dict[str, Array]:
        return mlp_tensors(self.tensors, layer)

    def module(self, layer: int) -> Any:
        return text_layers(self.model)[layer].mlp


# Two checkpoints: the VL model as released (one shared expert, top-2), and the text model alone
# (names without the "model.language_model." prefix) with two shared experts, top-3 routing
# and Im = 40, so that S*Im = 80 (not H = 64) and S = 2 differs from top_k.
VARIANTS: dict[str, tuple[bool, dict[str, Any]]] = {
    "vl-shared1": (True, {}),
    "text-shared2": (
        False,
        {"n_shared_experts": 2, "num_experts_per_tok": 3, "moe_intermediate_size": 40},
    ),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def whole(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Whole:
    vision, overrides = VARIANTS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    tensors = write_whole_checkpoint(path, overrides, vision=vision, seed=len(overrides))
    model = load_whole_model(path)
    routing = Routing.from_config(model.config.get_text_config())
    return Whole(tensors, model, routing, {**TEXT_CONFIG, **overrides}, path)


def inputs(seed: int, scale: float, tokens: int = TOKENS) -> Array:
    """x [T, H] as BF16 (so float32 and float64 hold it exactly)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((tokens, H)) * scale).astype(ml_dtypes.bfloat16)


def rel_err(got: Any, ref: Any) -> float:
    """max|got - ref| / max|ref|."""
    ref = np.asarray(ref, dtype=np.float64)
    scale = float(np.abs(ref).max())
    assert scale > 0
    return float(np.abs(np.asarray(got, dtype=np.float64) - ref).max()) / scale


def clamped_share(x: Array, gate_up: Array, limit: float) -> float:
    """The share of gate (above limit) and up (|.| above limit) pre-activations the clamp cuts."""
    h = np.asarray(x, dtype=np.float64) @ np.asarray(gate_up, dtype=np.float64).T
    i = h.shape[1] // 2
    return float(((h[:, :i] > limit).sum() + (np.abs(h[:, i:]) > limit).sum()) / h.size)


def check_clamp_regime(name: str, x: Array, gate_up: Array, limit: float) -> None:
    share = clamped_share(x, gate_up, limit)
    if name == "clamped":
        assert share > 0.05, f"only {share:.1%} of pre-activations reach the clamp"
    elif name == "small":
        assert share == 0.0


def dense_fields(mlp: dict[str, Array], tp: int, r: int) -> dict[str, Array]:
    return split_dense(
        mlp["gate_proj.weight"], mlp["up_proj.weight"], mlp["down_proj.weight"], tp, r
    )


def dense_sum(whole: Whole, x: Array, tp: int, mutate: Any = None) -> Any:
    """The dense reference summed over tp ranks; ``mutate(fields, tp, r)`` may break a layout."""
    total = np.zeros((x.shape[0], H))
    for r in range(tp):
        f = whole.bound(DENSE_LAYERS[0], tp, r)
        if mutate is not None:
            f = mutate(f, tp, r)
        total += dense_forward(x, f["gate_up"], f["down"], whole.routing.swiglu_limit)
    return total


def decisive(whole: Whole, layer: int, x: Array) -> Array:
    """The rows of x whose routing is not decided by a near-tie (see the module docstring)."""
    mlp = whole.mlp(layer)
    margin = routing_margin(
        x, mlp["gate.weight"], mlp["gate.e_score_correction_bias"], whole.routing
    )
    keep = margin >= MIN_MARGIN
    assert keep.sum() >= 0.75 * len(keep), f"{(~keep).sum()} of {len(keep)} tokens are near-ties"
    return x[keep]


def moe_sum(whole: Whole, layer: int, x: Array, tp: int, ep: int, mutate: Any = None) -> Any:
    """The MoE reference summed over every (tp, ep) rank, shared experts on ep rank 0 only."""
    mlp = whole.mlp(layer)
    num_experts = mlp["gate.weight"].shape[0]
    total = np.zeros((x.shape[0], H))
    for r in range(tp):
        for e in range(ep):
            f = whole.bound(layer, tp, r, ep, e)
            if mutate is not None:
                f = mutate(f, tp, r)
            start, _ = expert_range(num_experts, ep, e)
            total += moe_forward(x, f, start, whole.routing, include_shared=e == 0)
    return total


def layers_and_inputs(whole: Whole, scale: str) -> Iterator[tuple[int, Array]]:
    for layer in SPARSE_LAYERS:
        yield layer, decisive(whole, layer, inputs(100 + layer, SCALES[scale]))


def test_checkpoint_holds_the_mlp_tensors_in_the_released_dtypes(whole: Whole) -> None:
    """Routed/shared/dense MLP weights and the router are BF16, the correction bias F32 with
    values BF16 cannot hold, and each MoE layer has E experts of [Im, H] / [H, Im]."""
    cfg = whole.config
    im, e = cfg["moe_intermediate_size"], cfg["n_routed_experts"]
    for layer in SPARSE_LAYERS:
        mlp = whole.mlp(layer)
        bias = mlp.pop("gate.e_score_correction_bias")
        assert bias.dtype == np.float32 and bias.shape == (e,)
        assert not np.array_equal(bias.astype(ml_dtypes.bfloat16).astype(np.float32), bias)
        assert {a.dtype for a in mlp.values()} == {np.dtype(ml_dtypes.bfloat16)}
        assert len(mlp) == 3 * e + 3 + 1
        for k in range(e):
            assert mlp[f"experts.{k}.gate_proj.weight"].shape == (im, H)
            assert mlp[f"experts.{k}.down_proj.weight"].shape == (H, im)
        assert mlp["shared_experts.down_proj.weight"].shape == (H, cfg["n_shared_experts"] * im)
    dense = whole.mlp(DENSE_LAYERS[0])
    assert dense["down_proj.weight"].shape == (H, cfg["intermediate_size"])
    assert {a.dtype for a in dense.values()} == {np.dtype(ml_dtypes.bfloat16)}


def test_checkpoint_is_bf16_but_for_the_released_f32_tensors(whole: Whole) -> None:
    """The whole file: F32 exactly for A_log / dt_bias (KDA layers), e_score_correction_bias
    (sparse layers) and the hyper-connections' base / scale (every layer); BF16 elsewhere, the
    KDA convolutions included. And the MLP geometry symbols are pairwise distinct."""
    prefix = text_prefix(whole.tensors)
    want = {
        f"{prefix}layers.{i}.hc_{hc}_{p}"
        for i in range(TEXT_CONFIG["num_hidden_layers"])
        for hc in ("attn", "ffn")
        for p in ("base", "scale")
    }
    want |= {f"{prefix}layers.{i}.self_attn.{p}" for i in KDA_LAYERS for p in ("A_log", "dt_bias")}
    want |= {f"{prefix}layers.{i}.mlp.gate.e_score_correction_bias" for i in SPARSE_LAYERS}
    f32 = {n for n, a in whole.tensors.items() if a.dtype == np.float32}
    assert f32 == want
    others = {a.dtype for n, a in whole.tensors.items() if n not in f32}
    assert others == {np.dtype(ml_dtypes.bfloat16)}
    assert whole.tensors[f"{prefix}layers.0.self_attn.q_conv1d.weight"].dtype == ml_dtypes.bfloat16
    assert any(n.startswith("model.visual.") for n in whole.tensors) == (prefix != "")

    cfg = whole.config
    symbols = ["hidden_size", "intermediate_size", "moe_intermediate_size", "n_routed_experts",
               "n_shared_experts", "num_experts_per_tok", "vocab_size"]  # fmt: skip
    assert len({cfg[k] for k in symbols}) == len(symbols)
    shared_width = cfg["n_shared_experts"] * cfg["moe_intermediate_size"]
    assert shared_width not in (H, cfg["intermediate_size"])


@pytest.mark.parametrize("scale", list(SCALES))
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_dense_reference_summed_over_tp_ranks_equals_transformers_mlp(
    whole: Whole, tp: int, scale: str
) -> None:
    """sum_r dense_forward(x, gate_up_r, down_r) == Glm5NextTextMLP(x), within REL_TOL."""
    x = inputs(tp, SCALES[scale])
    check_clamp_regime(
        scale,
        x,
        dense_fields(whole.mlp(DENSE_LAYERS[0]), 1, 0)["gate_up"],
        whole.routing.swiglu_limit,
    )
    want = module_output(whole.module(DENSE_LAYERS[0]), x)
    assert rel_err(dense_sum(whole, x, tp), want) <= REL_TOL


@pytest.mark.parametrize("scale", list(SCALES))
@pytest.mark.parametrize(("tp", "ep"), MOE_RANKS, ids=[f"tp{t}-ep{e}" for t, e in MOE_RANKS])
def test_moe_reference_summed_over_tp_and_ep_ranks_equals_transformers_moe(
    whole: Whole, tp: int, ep: int, scale: str
) -> None:
    """sum over (tp, ep) ranks of moe_forward == Glm5NextTextMoE(x) for every sparse layer.

    Every expert is chosen by some token, so every ep rank's shard contributes; the ranks hold
    contiguous expert ranges of sizes E // ep (+1 on the first E % ep ranks).
    """
    e_total = whole.config["n_routed_experts"]
    counts = [expert_range(e_total, ep, r)[1] for r in range(ep)]
    assert sum(counts) == e_total and max(counts) - min(counts) <= 1
    if ep == 4:
        assert counts == [2, 2, 1, 1]
    for layer, x in layers_and_inputs(whole, scale):
        mlp = whole.mlp(layer)
        idx, _ = route(x, mlp["gate.weight"], mlp["gate.e_score_correction_bias"], whole.routing)
        assert set(idx.ravel()) == set(range(e_total)), f"layer {layer}: an expert is never hit"
        shared = split_moe(mlp, 1, 1, 0, 0)["shared_gate_up"]
        check_clamp_regime(scale, x, shared, whole.routing.swiglu_limit)
        got = moe_sum(whole, layer, x, tp, ep)
        assert rel_err(got, module_output(whole.module(layer), x)) <= REL_TOL, f"layer {layer}"


def swap_dense(f: dict[str, Array], tp: int, r: int) -> dict[str, Array]:
    i = f["gate_up"].shape[0] // 2
    return {**f, "gate_up": np.concatenate([f["gate_up"][i:], f["gate_up"][:i]])}


def swap_experts(f: dict[str, Array], tp: int, r: int) -> dict[str, Array]:
    i = f["w13"].shape[1] // 2
    return {**f, "w13": np.concatenate([f["w13"][:, i:], f["w13"][:, :i]], axis=1)}


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_swapped_gate_up_order_fails_the_reference(whole: Whole, kind: str, tp: int) -> None:
    """[up; gate] in place of [gate; up] (same shape, so no shape check can see it) misses.

    At O(1) pre-activations ("unit"): for tiny ones silu(g)*u ~ g*u/2 is symmetric in g and u to
    first order, and the swap would hide in the second-order term.
    """
    x = inputs(7, SCALES["unit"])
    if kind == "dense":
        want = module_output(whole.module(DENSE_LAYERS[0]), x)
        right, wrong = dense_sum(whole, x, tp), dense_sum(whole, x, tp, swap_dense)
    else:
        layer = SPARSE_LAYERS[0]
        x = decisive(whole, layer, x)
        want = module_output(whole.module(layer), x)
        right = moe_sum(whole, layer, x, tp, 2)
        wrong = moe_sum(whole, layer, x, tp, 2, swap_experts)
    assert rel_err(right, want) <= REL_TOL
    assert rel_err(wrong, want) >= MUTATION_FLOOR


def row_block(down: Array, tp: int, r: int) -> Array:
    """Rank r's contiguous bytes of a row-major [H, I] down_proj, read as [H, I/tp]: its rows."""
    rows = down.shape[0] // tp
    return np.ascontiguousarray(down[r * rows : (r + 1) * rows]).reshape(down.shape[0], -1)


@pytest.mark.parametrize("tp", [2, 4])
def test_row_sliced_down_instead_of_column_sliced_fails_the_reference(
    whole: Whole, tp: int
) -> None:
    """down_proj's tp shard is a column slice; the row block, reshaped, binds silently and misses.

    The honest row slice [H/tp, I] is refused on shape; the same bytes read as [H, I/tp] are
    not, so only the numbers catch it, for the dense MLP and for the routed experts.
    """
    x = inputs(11, SCALES["unit"])
    limit = whole.routing.swiglu_limit
    mlp = whole.mlp(DENSE_LAYERS[0])
    down = mlp["down_proj.weight"]
    f = dense_fields(mlp, tp, 0)
    with pytest.raises(ValueError, match="down has shape"):
        dense_forward(x, f["gate_up"], down[: H // tp], limit)

    def dense_rows(f: dict[str, Array], tp: int, r: int) -> dict[str, Array]:
        return {**f, "down": row_block(down, tp, r)}

    want = module_output(whole.module(DENSE_LAYERS[0]), x)
    assert rel_err(dense_sum(whole, x, tp), want) <= REL_TOL
    assert rel_err(dense_sum(whole, x, tp, dense_rows), want) >= MUTATION_FLOOR

    layer = SPARSE_LAYERS[0]
    moe = whole.mlp(layer)
    x = decisive(whole, layer, x)

    def expert_rows(f: dict[str, Array], tp: int, r: int) -> dict[str, Array]:
        e_total = f["w2"].shape[0]  # ep = 1: the rank holds every expert
        blocks = [row_block(moe[f"experts.{e}.down_proj.weight"], tp, r) for e in range(e_total)]
        return {**f, "w2": np.stack(blocks)}

    want = module_output(whole.module(layer), x)
    assert rel_err(moe_sum(whole, layer, x, tp, 1), want) <= REL_TOL
    assert rel_err(moe_sum(whole, layer, x, tp, 1, expert_rows), want) >= MUTATION_FLOOR


@pytest.mark.parametrize(("n_group", "topk_group"), [(1, 1), (2, 1), (3, 2)])
def test_router_uses_correction_bias_for_choice_only(
    whole: Whole, n_group: int, topk_group: int
) -> None:
    """A bias that flips the top-k changes WHICH experts run, not HOW MUCH each one weighs.

    The bias lifts by +2 the pair of experts in one group that the un-biased router picks least;
    scores lie in (0, 1), so that pair (and its group) is now chosen for every token, by the bias
    alone (with top_k = 3 the scores pick the third). transformers' router, given the same bias
    and (on a copy) the same group settings, must agree with ``route``: the same experts,
    weighted by their UN-biased scores. At O(1) logits those weights spread widely, while
    weights from the biased scores would sit near uniform, so the comparison tells the two
    apart by far more than the tolerance.
    """
    layer = SPARSE_LAYERS[-1]
    mlp = whole.mlp(layer)
    router = mlp["gate.weight"]
    num_experts = router.shape[0]
    routing = replace(whole.routing, n_group=n_group, topk_group=topk_group)
    x = inputs(23, SCALES["unit"])

    unbiased, _ = route(x, router, np.zeros(num_experts, np.float32), routing)
    picks = np.bincount(unbiased.ravel(), minlength=num_experts)
    per_group = num_experts // n_group
    pair = min(
        ((a, b) for a in range(num_experts) for b in range(a + 1, num_experts)
         if a // per_group == b // per_group),
        key=lambda ab: picks[ab[0]] + picks[ab[1]],
    )  # fmt: skip
    bias = np.zeros(num_experts, np.float32)
    bias[list(pair)] = 2.0
    # The pair's lead is >= 1, but with topk_group = 2 the runner-up group is still picked by
    # (un-biased) scores: drop near-ties there too, as everywhere.
    keep = routing_margin(x, router, bias, routing) >= MIN_MARGIN
    assert keep.mean() >= 0.75
    x, unbiased = x[keep], unbiased[keep]

    idx, weights = route(x, router, bias, routing)
    assert all(set(pair) <= set(row) for row in idx)
    flipped = np.mean([set(a) != set(b) for a, b in zip(idx, unbiased, strict=True)])
    assert flipped >= 0.5, "the bias hardly changes the choice: the test has no teeth"

    module = copy.deepcopy(whole.module(layer))
    module.gate.e_score_correction_bias.copy_(torch.from_numpy(bias))
    module.gate.num_group, module.gate.topk_group = n_group, topk_group
    their_idx, their_w = module_route(module.gate, x)
    their_out = module_output(module, x)

    # transformers' top-k order is unspecified: compare per token after sorting by expert.
    mine, theirs = np.argsort(idx, axis=1), np.argsort(their_idx, axis=1)
    np.testing.assert_array_equal(
        np.take_along_axis(idx, mine, 1), np.take_along_axis(their_idx, theirs, 1)
    )
    my_w = np.take_along_axis(weights, mine, 1)
    their_w = np.take_along_axis(their_w, theirs, 1)
    assert rel_err(their_w, my_w) <= REL_TOL

    # The same choice, weighted by the BIASED scores: what a router adding the bias too early gives.
    logits = np.asarray(x, np.float64) @ np.asarray(router, np.float64).T
    biased = np.take_along_axis(1 / (1 + np.exp(-logits)) + bias, np.sort(idx, axis=1), 1)
    biased = biased / biased.sum(axis=1, keepdims=True) * routing.routed_scaling_factor
    assert rel_err(biased, my_w) >= MUTATION_FLOOR

    fields = {**split_moe(mlp, 1, 1, 0, 0), "router_bias": bias}
    assert rel_err(moe_forward(x, fields, 0, routing, include_shared=True), their_out) <= REL_TOL


@pytest.mark.parametrize(("n_group", "topk_group"), [(2, 1), (3, 1), (3, 2)])
def test_grouped_routing_equals_transformers_router(
    whole: Whole, n_group: int, topk_group: int
) -> None:
    """With expert groups (n_group > 1), ``route`` keeps the same groups as transformers.

    GLM-5.3-Flash ships n_group = 1, but the router's group stage (group score = sum of the
    group's top 2 biased scores, keep topk_group groups) is part of the contract; here it is set
    on a copy of the module and must change the choice for some tokens, or it is not tested.
    """
    routing = replace(whole.routing, n_group=n_group, topk_group=topk_group)
    if n_group * routing.top_k > whole.config["n_routed_experts"] * topk_group:
        # Fewer candidates than top_k: transformers would pick masked experts; route refuses.
        mlp = whole.mlp(SPARSE_LAYERS[0])
        with pytest.raises(ValueError, match="fewer than top_k"):
            route(inputs(0, 1.0), mlp["gate.weight"], mlp["gate.e_score_correction_bias"], routing)
        return
    changed: list[float] = []
    for layer in SPARSE_LAYERS:
        mlp = whole.mlp(layer)
        router, bias = mlp["gate.weight"], mlp["gate.e_score_correction_bias"]
        x = inputs(200 + layer, SCALES["unit"])
        keep = (routing_margin(x, router, bias, routing) >= MIN_MARGIN) & (
            routing_margin(x, router, bias, whole.routing) >= MIN_MARGIN
        )
        assert keep.mean() >= 0.75
        x = x[keep]
        idx, weights = route(x, router, bias, routing)
        ungrouped, _ = route(x, router, bias, whole.routing)
        changed.append(
            float(np.mean([set(a) != set(b) for a, b in zip(idx, ungrouped, strict=True)]))
        )
        assert changed[-1] > 0, f"layer {layer}: grouping changes no choice"

        module = copy.deepcopy(whole.module(layer))
        module.gate.num_group, module.gate.topk_group = n_group, topk_group
        their_idx, their_w = module_route(module.gate, x)
        mine, theirs = np.argsort(idx, axis=1), np.argsort(their_idx, axis=1)
        np.testing.assert_array_equal(
            np.take_along_axis(idx, mine, 1), np.take_along_axis(their_idx, theirs, 1)
        )
        their_w = np.take_along_axis(their_w, theirs, 1)
        assert rel_err(their_w, np.take_along_axis(weights, mine, 1)) <= REL_TOL

        got = sum(
            moe_forward(
                x, split_moe(mlp, 2, 3, r, e), expert_range(len(bias), 3, e)[0], routing, e == 0
            )
            for r in range(2)
            for e in range(3)
        )
        assert rel_err(got, module_output(module, x)) <= REL_TOL
    assert np.mean(changed) >= 0.1, f"grouping changes only {np.mean(changed):.0%} of choices"


def test_dtype_repair_narrows_an_upcast_bf16_tensor_exactly(tmp_path: Any) -> None:
    """If save_pretrained upcasts a BF16 tensor to F32, the writer narrows it back (exactly);
    an F32-only tensor written as BF16 has lost precision and is refused, not "repaired"."""
    exact = np.arange(6, dtype=np.float32).reshape(2, 3) / 4  # BF16-representable
    bias = np.array([0.1, 0.2], np.float32)
    write_safetensors(
        tmp_path / "model.safetensors",
        {"a.mlp.gate_proj.weight": exact, "a.mlp.gate.e_score_correction_bias": bias},
        {"format": "pt"},
    )
    assert repair_dtypes(tmp_path) == ["a.mlp.gate_proj.weight"]
    back = read_checkpoint(tmp_path)
    assert back["a.mlp.gate_proj.weight"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(back["a.mlp.gate_proj.weight"].astype(np.float32), exact)
    np.testing.assert_array_equal(back["a.mlp.gate.e_score_correction_bias"], bias)

    write_safetensors(
        tmp_path / "model.safetensors",
        {"a.mlp.gate.e_score_correction_bias": bias.astype(ml_dtypes.bfloat16)},
    )
    with pytest.raises(ValueError, match="precision is lost"):
        repair_dtypes(tmp_path)


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1), (2, 3), (1, 4)])
def test_bound_mlp_fields_equal_the_hand_split_of_the_checkpoint_tensors(
    whole: Whole, tp: int, ep: int
) -> None:
    """specbind's dense and MoE fields at every rank are byte for byte what split_dense and
    split_moe build by hand from the file: [gate_r; up_r], down's column slice, whole experts."""
    for r in range(tp):
        dense = whole.bound(DENSE_LAYERS[0], tp, r, ep, 0)
        want = dense_fields(whole.mlp(DENSE_LAYERS[0]), tp, r)
        assert {k: v.tobytes() for k, v in dense.items()} == {
            k: v.tobytes() for k, v in want.items()
        }
        for e in range(ep):
            for layer in SPARSE_LAYERS:
                got = whole.bound(layer, tp, r, ep, e)
                hand = split_moe(whole.mlp(layer), tp, ep, r, e)
                assert set(got) == set(hand)
                for k, v in hand.items():
                    assert (got[k].shape, got[k].dtype) == (v.shape, v.dtype), (layer, k)
                    assert got[k].tobytes() == v.tobytes(), (layer, k, r, e)
