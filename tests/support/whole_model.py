"""A whole GLM-5.3-Flash checkpoint written by transformers, and a NumPy reference for its MLPs.

Two halves, kept apart on purpose:

* ``write_whole_checkpoint`` has transformers' own ``Glm5Next`` model write a tiny checkpoint with
  ``save_pretrained``: the tensor names, the per-expert split of the fused expert weights and the
  F32 tensors are what transformers' conversion mapping puts on disk, not what specbind expects.
* The reference (``dense_forward``, ``route``, ``moe_forward``) reads ONLY the fields a binder
  hands an inference engine, in the layout fused-MoE kernels read, one tensor-parallel (tp) and
  expert-parallel (ep) rank at a time. It never sees a checkpoint name or a torch module, so
  "the sum over ranks of the reference equals transformers' module" is a claim about the field
  layout itself. ``split_dense`` and ``split_moe`` build those fields from the checkpoint tensors
  and stand in for the binder until specbind's bound fields replace them.

Layout contract (one rank; I the dense intermediate size, Im the expert one, S shared experts):

====================  =====================  ================================================
field                 shape                  contents
====================  =====================  ================================================
``gate_up``           [2*I/tp, H]            [gate rows of rank r ; up rows of rank r]
``down``              [H, I/tp]              columns of rank r of down_proj
``router``            [E, H]                 gate.weight, replicated
``router_bias``       [E] F32                e_score_correction_bias, replicated
``w13``               [E_rank, 2*Im/tp, H]   per local expert: [gate_r ; up_r]
``w2``                [E_rank, H, Im/tp]     per local expert: columns of rank r of down_proj
``shared_gate_up``    [2*S*Im/tp, H]         shared experts' [gate_r ; up_r]
``shared_down``       [H, S*Im/tp]           shared experts' down_proj columns of rank r
====================  =====================  ================================================

Traps the layout hides: gate and up have identical shapes, so a [up; gate] order binds without a
shape error and only the numbers are wrong; and down_proj's rank shard is a strided COLUMN slice,
whereas the rank's contiguous bytes of the row-major [H, I] tensor are a ROW slice, which
reshapes to [H, I/tp] just as silently.

torch and transformers are imported only inside the functions that need them, so a test module
can ``importorskip`` them before anything here touches them.
"""

from __future__ import annotations

import copy
import importlib
import json
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import safetensors

Array = npt.NDArray[Any]
F64 = npt.NDArray[np.float64]
Indices = npt.NDArray[np.int64]

# The tiny text geometry. The MLP symbols are pairwise distinct, so a transposed or mis-split
# MLP tensor cannot keep its shape: H=64, I=96, Im=32, E=6, S=1 (or 2), top_k=2, vocab=160.
# Layers: 0 is the one dense MLP; 3 (full indexer) and 5 (shared indexer) are DSA, the rest KDA.
TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "n_routed_experts": 6,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "vocab_size": 160,
    "hc_mult": 2,
    "num_hidden_layers": 6,
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse", "sparse"],
    "layer_types": [
        "linear_attention",
        "linear_attention",
        "linear_attention",
        "indexed_attention",
        "linear_attention",
        "indexed_attention",
    ],
    "index_topk_pattern": "FFFFFS",
    "linear_num_heads": 8,
    "linear_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "v_head_dim": 24,
    "qk_rope_head_dim": 0,
    "index_n_heads": 8,
    "index_head_dim": 16,
    "index_kpool": 4,
    "index_topk": 8,
    "pad_token_id": 0,
}
VISION_CONFIG: dict[str, Any] = {
    "depth": 1,
    "hidden_size": 32,
    "num_heads": 2,
    "intermediate_size": 64,
    "out_hidden_size": 64,
    "projection_intermediate_size": 64,
}
DENSE_LAYERS = (0,)
SPARSE_LAYERS = (1, 2, 3, 4, 5)
KDA_LAYERS = (0, 1, 2, 4)
DSA_LAYERS = (3, 5)
FULL_DSA, SHARED_DSA = DSA_LAYERS

DENSE_FIELDS = ("gate_up", "down")
MOE_FIELDS = ("router", "router_bias", "w13", "w2", "shared_gate_up", "shared_down")

# The tensors the released checkpoint stores in F32; everything else is BF16 (the KDA convolution
# too, although transformers lists conv1d among its keep-in-fp32 modules). On-disk names first,
# then the same parameters as transformers' module tree names them.
F32_ON_DISK = re.compile(r".*\.(A_log|dt_bias|e_score_correction_bias|hc_(attn|ffn)_(base|scale))")
F32_IN_MODULE = re.compile(
    r".*\.(forget_gate\.(A_log|dt_bias)|gate\.e_score_correction_bias|(attn|ffn)_hc\.(base|scale))"
)

_NUMPY_DTYPES: dict[str, Any] = {
    "BF16": ml_dtypes.bfloat16,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_SAFETENSORS_DTYPES = {np.dtype(v): k for k, v in _NUMPY_DTYPES.items()}
# safetensors ships no annotation for deserialize: name -> {"dtype", "shape", "data"} per tensor.
_deserialize: Callable[[bytes], list[tuple[str, dict[str, Any]]]] = safetensors.deserialize


def _module(name: str) -> Any:
    return importlib.import_module(name)


# --------------------------------------------------------------------------- the checkpoint


def read_checkpoint_file(shard: Path) -> dict[str, Array]:
    """The tensors of one ``.safetensors`` file, in the dtype written (BF16 as ml_dtypes')."""
    return {
        name: np.frombuffer(t["data"], dtype=_NUMPY_DTYPES[t["dtype"]]).reshape(t["shape"])
        for name, t in _deserialize(Path(shard).read_bytes())
    }


def read_checkpoint(path: Path) -> dict[str, Array]:
    """Every tensor of every ``*.safetensors`` file under ``path``, in the dtype it was written.

    Parsed by the safetensors library (not specbind's reader); BF16 comes back as
    ``ml_dtypes.bfloat16``, F32 as ``float32``.
    """
    out: dict[str, Array] = {}
    for shard in sorted(Path(path).glob("*.safetensors")):
        for name, a in read_checkpoint_file(shard).items():
            if name in out:
                raise ValueError(f"{name} is in two shards")
            out[name] = a
    return out


def _want_f32(name: str) -> bool:
    return F32_ON_DISK.fullmatch(name) is not None


def repair_dtypes(path: Path) -> list[str]:
    """Rewrite any shard whose tensors are not in the released checkpoint's dtypes.

    An F32 tensor that should be BF16 is narrowed only if that is exact (the model held BF16
    values, so an upcast by ``save_pretrained`` loses nothing); a BF16 tensor that should be F32
    lost its precision before it reached the file, and that cannot be repaired. Returns the
    names rewritten.
    """
    fixed: list[str] = []
    for shard in sorted(Path(path).glob("*.safetensors")):
        with safetensors.safe_open(str(shard), "np") as f:
            metadata = f.metadata()
        tensors = read_checkpoint_file(shard)
        changed = False
        for name, a in tensors.items():
            want = np.dtype(np.float32) if _want_f32(name) else np.dtype(ml_dtypes.bfloat16)
            if a.dtype == want:
                continue
            if want == np.float32:
                raise ValueError(f"{name} was written as {a.dtype}, not F32: precision is lost")
            narrow = a.astype(want)
            if not np.array_equal(narrow.astype(np.float64), a.astype(np.float64)):
                raise ValueError(f"{name} holds values BF16 cannot represent")
            tensors[name] = narrow
            fixed.append(name)
            changed = True
        if changed:
            write_safetensors(shard, tensors, metadata)
    return fixed


def write_safetensors(
    path: Path, tensors: Mapping[str, Array], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``tensors`` as one ``.safetensors`` file (the format's header + raw bytes)."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    pos = 0
    for name, a in tensors.items():
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[np.dtype(a.dtype)],
            "shape": list(a.shape),
            "data_offsets": [pos, pos + a.nbytes],
        }
        pos += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data buffer starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())


def write_whole_checkpoint(
    path: Path,
    text_overrides: Mapping[str, Any] | None = None,
    vision: bool = True,
    seed: int = 0,
    *,
    cls: Any = None,
) -> dict[str, Array]:
    """Have transformers write a tiny GLM-5.3-Flash checkpoint; return its tensors as written.

    ``cls`` defaults to ``Glm5NextForConditionalGeneration`` (text + tiny vision tower) when
    ``vision`` and to ``Glm5NextTextModel`` otherwise; a class that takes the text config alone
    (a future ``Glm5NextForCausalLM``) works too, with ``vision=False``.

    Values: transformers' random init (seeded), except that every tensor the init leaves
    constant (norms at 1, hyper-connection base/scale, biases at 0) is randomised away from
    that constant, and ``e_score_correction_bias`` gets non-zero F32 values (not BF16-exact), so
    routing depends on it and a binder that narrows it changes bits. Dtypes as in the released
    checkpoint: F32 for ``F32_ON_DISK``, BF16 for everything else, checked in the file itself
    after ``save_pretrained`` (and repaired where an exact repair exists).
    """
    torch = _module("torch")
    transformers = _module("transformers")
    text = {**TEXT_CONFIG, **(text_overrides or {})}
    if cls is None:
        cls = (
            transformers.Glm5NextForConditionalGeneration
            if vision
            else transformers.Glm5NextTextModel
        )
    multimodal = issubclass(cls.config_class, transformers.Glm5NextConfig)
    if multimodal and not vision:
        raise ValueError(f"{cls.__name__} always has a vision tower: pass vision=True")
    if vision and not multimodal:
        raise ValueError(f"{cls.__name__} has no vision tower: pass vision=False")
    config = (
        transformers.Glm5NextConfig(text_config=text, vision_config=dict(VISION_CONFIG))
        if multimodal
        else transformers.Glm5NextTextConfig(**text)
    )

    torch.manual_seed(seed)
    model = cls(config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        tensors = [*model.named_parameters()]
        tensors += [
            (n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")
        ]
        for name, t in tensors:
            v = t.detach().float()
            if name.endswith("e_score_correction_bias"):
                v = torch.randn(v.shape, generator=gen) * 0.02
            elif v.numel() > 0 and bool((v == v.reshape(-1)[0]).all()):
                v = v + (torch.rand(v.shape, generator=gen) - 0.5)  # 1 -> U(0.5, 1.5)
            t.data = v if F32_IN_MODULE.fullmatch(name) else v.to(torch.bfloat16)
    model.save_pretrained(path)
    repair_dtypes(Path(path))

    written = read_checkpoint(Path(path))
    for name, a in written.items():
        want = np.dtype(np.float32) if _want_f32(name) else np.dtype(ml_dtypes.bfloat16)
        if a.dtype != want:
            raise AssertionError(f"{name} is {a.dtype} in the file, not {want}")
    return written


def load_whole_model(path: Path, cls: Any = None) -> Any:
    """transformers' model loaded back from ``path`` in float32 (an exact widening of the file).

    ``cls`` defaults to the class named in config.json's ``architectures``.
    """
    torch = _module("torch")
    transformers = _module("transformers")
    if cls is None:
        arch = json.loads((Path(path) / "config.json").read_text())["architectures"][0]
        cls = getattr(transformers, arch)
    return cls.from_pretrained(path, dtype=torch.float32).eval()


def text_layers(model: Any) -> Any:
    """The decoder layers of a Glm5Next text model, whichever class wraps them."""
    if hasattr(model, "layers"):
        return model.layers
    inner = model.model
    return inner.language_model.layers if hasattr(inner, "language_model") else inner.layers


def text_prefix(tensors: Mapping[str, Array]) -> str:
    """The name prefix of the text model's tensors ("model.language_model." for the VL model)."""
    (embed,) = [n for n in tensors if n.endswith("embed_tokens.weight")]
    return embed[: -len("embed_tokens.weight")]


def mlp_tensors(tensors: Mapping[str, Array], layer: int) -> dict[str, Array]:
    """Layer ``layer``'s MLP tensors as stored on disk, named relative to ``...layers.N.mlp.``."""
    head = f"{text_prefix(tensors)}layers.{layer}.mlp."
    out = {n[len(head) :]: a for n, a in tensors.items() if n.startswith(head)}
    if not out:
        raise KeyError(f"no tensors under {head}")
    return out


def module_output(module: Any, x: Array) -> F64:
    """``module(x)`` for x [T, H], run on a float32 copy of the module, as float64 [T, H]."""
    torch = _module("torch")
    m = copy.deepcopy(module).float().eval()
    with torch.no_grad():
        y = m(torch.from_numpy(np.asarray(x, dtype=np.float32)[None]))
    return np.asarray(y[0].double().numpy(), dtype=np.float64)


def module_route(gate: Any, x: Array) -> tuple[Indices, F64]:
    """A float32 copy of transformers' router on x [T, H]: (expert indices, weights), [T, k]."""
    torch = _module("torch")
    g = copy.deepcopy(gate).float().eval()
    with torch.no_grad():
        _, weights, indices = g(torch.from_numpy(np.asarray(x, dtype=np.float32)))
    return (
        np.asarray(indices.numpy(), dtype=np.int64),
        np.asarray(weights.double().numpy(), dtype=np.float64),
    )


# --------------------------------------------------------------------------- the reference


@dataclass(frozen=True)
class Routing:
    """The MoE hyper-parameters the reference needs, all read from the config (no defaults)."""

    top_k: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    swiglu_limit: float

    @classmethod
    def from_config(cls, text_config: Any) -> Routing:
        """From a transformers ``Glm5NextTextConfig`` or a mapping with the same keys."""

        def get(key: str) -> Any:
            if isinstance(text_config, Mapping):
                return text_config[key]
            return getattr(text_config, key)

        return cls(
            top_k=int(get("num_experts_per_tok")),
            n_group=int(get("n_group")),
            topk_group=int(get("topk_group")),
            norm_topk_prob=bool(get("norm_topk_prob")),
            routed_scaling_factor=float(get("routed_scaling_factor")),
            swiglu_limit=float(get("swiglu_limit")),
        )


def widen(a: Array) -> F64:
    """BF16 / F32 / F64 -> float64: exact for all three."""
    return np.asarray(a, dtype=np.float64)


def sigmoid(z: F64) -> F64:
    """1 / (1 + e^-z), written with tanh so no exponent overflows for large |z|."""
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * z)), dtype=np.float64)


def swiglu(gate: F64, up: F64, limit: float) -> F64:
    """silu(min(gate, limit)) * clip(up, -limit, limit), as transformers' Glm5Next MLPs clamp."""
    g = np.minimum(gate, limit)
    u = np.clip(up, -limit, limit)
    return np.asarray(g * sigmoid(g) * u, dtype=np.float64)


def _shape(name: str, a: Array, want: tuple[int, ...]) -> None:
    if tuple(a.shape) != want:
        raise ValueError(f"{name} has shape {tuple(a.shape)}, expected {want}")


def dense_forward(x: Array, gate_up: Array, down: Array, swiglu_limit: float) -> F64:
    """One tp rank's partial MLP output, float64 [T, H], from its merged column-parallel shard.

    ``gate_up`` [2*I_r, H] is [gate rows ; up rows] of the rank, ``down`` [H, I_r] its columns of
    down_proj; the partials of all tp ranks sum to the MLP output (the row-parallel all-reduce).
    """
    x64 = widen(x)
    if x64.ndim != 2:
        raise ValueError(f"x has shape {x64.shape}, expected [T, H]")
    hidden = x64.shape[1]
    if gate_up.ndim != 2 or gate_up.shape[0] % 2:
        raise ValueError(f"gate_up has shape {tuple(gate_up.shape)}, expected [2*I_r, H]")
    inter = gate_up.shape[0] // 2
    _shape("gate_up", gate_up, (2 * inter, hidden))
    _shape("down", down, (hidden, inter))
    h = x64 @ widen(gate_up).T
    return np.asarray(swiglu(h[:, :inter], h[:, inter:], swiglu_limit) @ widen(down).T)


def _choice(
    x: Array, router: Array, router_bias: Array, routing: Routing
) -> tuple[F64, F64, F64 | None]:
    """(un-biased scores [T, E], biased scores with masked groups at -inf, group scores)."""
    x64 = widen(x)
    num_experts = router.shape[0]
    _shape("router", router, (num_experts, x64.shape[1]))
    _shape("router_bias", router_bias, (num_experts,))
    scores = sigmoid(x64 @ widen(router).T)
    choice = scores + widen(router_bias)
    groups = routing.n_group
    if num_experts % groups or num_experts // groups < 2:
        raise ValueError(f"{num_experts} experts do not split into {groups} groups of >= 2")
    if num_experts // groups * routing.topk_group < routing.top_k:
        # transformers would then pick masked (-inf) experts, in an unspecified order.
        raise ValueError(f"{routing.topk_group} of {groups} groups hold fewer than top_k experts")
    if groups == 1:
        return scores, choice, None
    per = num_experts // groups
    tokens = choice.shape[0]
    group_scores = np.sort(choice.reshape(tokens, groups, per), axis=-1)[..., -2:].sum(axis=-1)
    kept = np.argsort(-group_scores, axis=-1, kind="stable")[:, : routing.topk_group]
    mask = np.zeros((tokens, groups), dtype=bool)
    np.put_along_axis(mask, kept, True, axis=-1)
    masked = np.where(np.repeat(mask, per, axis=-1), choice, -np.inf)
    return scores, np.asarray(masked, dtype=np.float64), np.asarray(group_scores)


def route(x: Array, router: Array, router_bias: Array, routing: Routing) -> tuple[Indices, F64]:
    """transformers' Glm5NextTextTopkRouter in float64: (expert indices, weights), each [T, k].

    sigmoid scores; + router_bias for the CHOICE only (group scores = sum of each group's top 2,
    keep topk_group groups, top_k experts among them); the weights are the UN-biased scores of
    the chosen experts, normalised to sum 1 (norm_topk_prob), times routed_scaling_factor.
    Indices come highest-first; transformers' order is unspecified, so compare them as sets.
    """
    scores, choice, _ = _choice(x, router, router_bias, routing)
    idx = np.argsort(-choice, axis=-1, kind="stable")[:, : routing.top_k].astype(np.int64)
    weights = np.take_along_axis(scores, idx, axis=-1)
    if routing.norm_topk_prob:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
    return idx, np.asarray(weights * routing.routed_scaling_factor, dtype=np.float64)


def routing_margin(x: Array, router: Array, router_bias: Array, routing: Routing) -> F64:
    """Per token, the smallest score gap that decides the choice ([T]; +inf if none does).

    The gap between the k-th and (k+1)-th candidate expert, and with groups the one between the
    topk_group-th and next group. Where it is tiny, two correct routers in different precisions
    may pick different experts: a discontinuity, not an error of either.
    """
    _, choice, group_scores = _choice(x, router, router_bias, routing)
    k = routing.top_k
    ranked = -np.sort(-choice, axis=-1)
    margin = np.full(choice.shape[0], np.inf)
    if ranked.shape[1] > k:
        gap = ranked[:, k - 1] - ranked[:, k]
        margin = np.where(np.isfinite(gap), gap, np.inf)
    if group_scores is not None and group_scores.shape[1] > routing.topk_group:
        g = -np.sort(-group_scores, axis=-1)
        margin = np.minimum(margin, g[:, routing.topk_group - 1] - g[:, routing.topk_group])
    return np.asarray(margin, dtype=np.float64)


def expert_range(num_experts: int, ep: int, rank: int) -> tuple[int, int]:
    """(start, count) of ep rank ``rank``'s contiguous experts; the first E % ep ranks get one more."""
    if not 0 <= rank < ep:
        raise ValueError(f"ep rank {rank} is not in [0, {ep})")
    base, rem = divmod(num_experts, ep)
    return rank * base + min(rank, rem), base + (rank < rem)


def moe_forward(
    x: Array,
    fields: Mapping[str, Array],
    expert_start: int,
    config: Routing,
    include_shared: bool,
) -> F64:
    """One (tp, ep) rank's partial MoE output, float64 [T, H], from its bound fields alone.

    Routes over all E experts (router and bias are replicated), then runs only the rank's experts
    ``expert_start .. expert_start + w13.shape[0]``, each as the rank's tp shard of a SwiGLU MLP
    scaled by its routing weight; adds the shared experts' tp shard when ``include_shared``.
    Summed over every (tp, ep) rank, with the shared experts included on one ep rank per tp
    rank, the partials equal the module's output.
    """
    x64 = widen(x)
    w13, w2 = fields["w13"], fields["w2"]
    count = w13.shape[0]
    num_experts = fields["router"].shape[0]
    if expert_start < 0 or expert_start + count > num_experts:
        raise ValueError(f"experts {expert_start}..{expert_start + count} exceed E={num_experts}")
    if w2.shape[0] != count:
        raise ValueError(f"w13 holds {count} experts but w2 holds {w2.shape[0]}")
    idx, weights = route(x64, fields["router"], fields["router_bias"], config)
    out = np.zeros_like(x64)
    for j in range(count):
        hit = idx == expert_start + j  # [T, k]: at most one True per token
        tokens = hit.any(axis=-1)
        if not tokens.any():
            continue
        y = dense_forward(x64[tokens], w13[j], w2[j], config.swiglu_limit)
        out[tokens] += (weights * hit).sum(axis=-1)[tokens, None] * y
    if include_shared:
        out += dense_forward(
            x64, fields["shared_gate_up"], fields["shared_down"], config.swiglu_limit
        )
    return out


# --------------------------------------------------------------------------- the stand-in binder


def _rank_slice(size: int, tp: int, rank: int) -> slice:
    if size % tp or not 0 <= rank < tp:
        raise ValueError(f"{size} does not split into {tp} tp ranks, or rank {rank} is outside")
    part = size // tp
    return slice(rank * part, (rank + 1) * part)


def split_dense(gate: Array, up: Array, down: Array, tp: int, r: int) -> dict[str, Array]:
    """tp rank r's ``gate_up`` and ``down`` fields from gate_proj / up_proj / down_proj as stored.

    gate/up [I, H] (row = output feature), down [H, I]; slicing keeps the stored dtype.
    """
    if gate.shape != up.shape or down.shape != gate.shape[::-1]:
        raise ValueError(f"gate {gate.shape}, up {up.shape}, down {down.shape} do not fit")
    rows = _rank_slice(gate.shape[0], tp, r)
    return {
        "gate_up": np.ascontiguousarray(np.concatenate([gate[rows], up[rows]], axis=0)),
        "down": np.ascontiguousarray(down[:, rows]),
    }


def num_experts_of(mlp: Mapping[str, Array]) -> int:
    """E, the number of routed experts among a layer's MLP tensors (names from mlp_tensors)."""
    found = {int(m.group(1)) for n in mlp if (m := re.fullmatch(r"experts\.(\d+)\..*", n))}
    if found != set(range(len(found))):
        raise ValueError(f"experts {sorted(found)} are not 0..E-1")
    return len(found)


def split_moe(
    mlp: Mapping[str, Array], tp: int, ep: int, tp_rank: int, ep_rank: int
) -> dict[str, Array]:
    """The (tp_rank, ep_rank) MoE fields from one layer's checkpoint tensors (``mlp_tensors``).

    The router and its F32 bias are replicated verbatim; the rank's experts are
    ``expert_range(E, ep, ep_rank)``, each split like a dense MLP; the shared experts are split
    over tp only (every ep rank holds the same shard).
    """
    num_experts = num_experts_of(mlp)
    start, count = expert_range(num_experts, ep, ep_rank)
    if count == 0:
        raise ValueError(
            f"ep={ep} leaves ep rank {ep_rank} without any of the {num_experts} experts"
        )
    experts = [
        split_dense(
            mlp[f"experts.{e}.gate_proj.weight"],
            mlp[f"experts.{e}.up_proj.weight"],
            mlp[f"experts.{e}.down_proj.weight"],
            tp,
            tp_rank,
        )
        for e in range(start, start + count)
    ]
    shared = split_dense(
        mlp["shared_experts.gate_proj.weight"],
        mlp["shared_experts.up_proj.weight"],
        mlp["shared_experts.down_proj.weight"],
        tp,
        tp_rank,
    )
    return {
        "router": mlp["gate.weight"],
        "router_bias": mlp["gate.e_score_correction_bias"],
        "w13": np.stack([f["gate_up"] for f in experts]),
        "w2": np.stack([f["down"] for f in experts]),
        "shared_gate_up": shared["gate_up"],
        "shared_down": shared["down"],
    }
