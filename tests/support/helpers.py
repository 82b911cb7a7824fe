"""Shared builders for the tests: geometries, in-memory layers, Hypothesis strategies."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from safetensors.numpy import save_file

from specbind.core.dtypes import DTYPES, dtype_name
from specbind.core.ir import FieldRule, TensorRule
from specbind.core.planning import Ranks
from specbind.generated import MODELS, dsa, kda
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.binder.checks import Array
from specbind.runtime.binder.tables import BlockEntry
from specbind.runtime.bound.bound_format import BoundMeta, QuantMeta
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.io.source import DictSource, RawTensor
from specbind.runtime.layout.slots import fill_slot
from specbind.synth import tiny_values

TABLE = MODELS["glm-5.3-flash"]
# The DSA indexer's bound fields as DESIGN.md names them (written out, not read from the
# generated tables, so a test against them can fail).
INDEXER_FIELDS = (
    "wq_b",
    "wk",
    "k_norm_weight",
    "k_norm_bias",
    "weights_proj",
    "compress_gate",
    "ape",
)
REAL = TABLE.make_geometry(TABLE.default_values())
TINY = tiny_values(TABLE)  # the model spec's synth.tiny geometry


def classify(names: list[str], slot: str = "attention") -> BlockEntry[Any] | None:
    """The block that fills ``slot`` for a layer of these names (names only), or None."""
    return fill_slot(TABLE, slot, names).block


REAL_KDA = kda.KdaGeometry(
    hidden=4096, linear_heads=64, linear_head_dim=128, conv_kernel=4, scan_chunk=32
)
TINY_KDA = kda.KdaGeometry(
    hidden=8, linear_heads=2, linear_head_dim=64, conv_kernel=4, scan_chunk=16
)
TINY_DSA = dsa.DsaGeometry(
    hidden=8,
    heads=2,
    q_lora_rank=6,
    kv_lora_rank=4,
    qk_nope_head_dim=3,
    qk_rope_head_dim=0,
    v_head_dim=2,
    index_heads=2,
    index_head_dim=4,
    index_kpool=3,
)


def raw(a: Array) -> RawTensor:
    flat = np.ascontiguousarray(a).reshape(-1)  # shape -> [n]: raw row-major bytes
    return RawTensor(dtype_name(a), tuple(a.shape), memoryview(flat.view(np.uint8)))


def fill(rule: TensorRule, shape: tuple[int, ...], seed: int) -> Array:
    """Distinct, deterministic values per tensor (so a mix-up is visible)."""
    rng = np.random.default_rng(seed)
    vals = rng.standard_normal(size=shape).astype(np.float32)
    np_dtype = DTYPES[rule.dtype].numpy
    assert np_dtype is not None
    return vals.astype(np_dtype)


def layer_arrays(module: Any, g: Any, *, seed: int = 0, indexer: bool = True) -> dict[str, Array]:
    """Every tensor of one block at geometry ``g`` (family members expanded, optional groups
    included unless ``indexer`` is false), with distinct values."""
    shapes = module.expected_shapes(g)
    counts = module.counts(g)
    out: dict[str, Array] = {}
    for i, rule in enumerate(module.TENSORS):
        if rule.group is not None and not indexer:
            continue
        if rule.family is None:
            out[rule.name] = fill(rule, shapes[rule.name], seed * 1000 + i)
            continue
        for e in range(counts[rule.family]):
            out[rule.concrete(e).name] = fill(rule, shapes[rule.name], seed * 1000 + i * 97 + e)
    return out


@st.composite
def block_geometries(draw: st.DrawFn, module: Any, most: int = 6) -> Any:
    """Any block's geometry: each symbol drawn from 1..most, kept only if its constraints hold."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(_geo_class(module))]
    values = {n: draw(st.integers(1, most)) for n in names if n not in ("tp", "ep")}
    g = _geo_class(module)(**values)
    try:
        module.check_constraints(g)
    except Exception:  # GeometryError: not a geometry this block accepts
        from hypothesis import assume

        assume(False)
    return g


def _geo_class(module: Any) -> Any:
    return next(v for k, v in vars(module).items() if k.endswith("Geometry"))


def source(arrays: dict[str, Array], **extra: Array) -> DictSource:
    tensors = {n: raw(a) for n, a in arrays.items()}
    tensors |= {n.replace("__", "."): raw(a) for n, a in extra.items()}
    return DictSource(tensors)


def bf16(shape: tuple[int, ...]) -> Array:
    return np.zeros(shape, dtype=ml_dtypes.bfloat16)


@st.composite
def kda_geometries(draw: st.DrawFn) -> kda.KdaGeometry:
    """KDA geometries that meet the block's constraints at tp=1."""
    d = draw(st.sampled_from([16, 32, 64, 128]))
    h = (128 // d) * draw(st.integers(1, 3)) if d < 128 else draw(st.integers(1, 3))
    c = draw(st.integers(1, 32))
    return kda.KdaGeometry(
        hidden=draw(st.integers(1, 24)),
        linear_heads=h,
        linear_head_dim=d,
        conv_kernel=draw(st.integers(1, 5)),
        scan_chunk=c,
    )


@st.composite
def dsa_geometries(draw: st.DrawFn) -> dsa.DsaGeometry:
    small = st.integers(1, 6)
    return dsa.DsaGeometry(
        hidden=draw(small), heads=draw(st.integers(1, 4)), q_lora_rank=draw(small), kv_lora_rank=draw(small),
        qk_nope_head_dim=draw(small), qk_rope_head_dim=0, v_head_dim=draw(small), index_heads=draw(st.integers(1, 3)),
        index_head_dim=draw(small), index_kpool=draw(st.integers(1, 4)),
    )  # fmt: skip


@st.composite
def model_values(draw: st.DrawFn) -> dict[str, int]:
    """Model-level geometry (config.json values) that meets every block constraint."""
    k = draw(kda_geometries())
    d = draw(dsa_geometries())
    small = st.integers(1, 6)
    return {
        "hidden": draw(st.integers(1, 16)),
        "vocab": draw(st.integers(1, 24)),
        "intermediate": draw(small),
        "moe_intermediate": draw(small),
        "experts": draw(st.integers(1, 5)),
        "shared_experts": draw(st.integers(1, 2)),
        "hc_mult": draw(st.integers(1, 3)),
        "linear_heads": k.linear_heads,
        "linear_head_dim": k.linear_head_dim,
        "linear_conv": k.conv_kernel,
        "kda_chunk": k.scan_chunk,
        "heads": d.heads,
        "q_lora_rank": d.q_lora_rank,
        "kv_lora_rank": d.kv_lora_rank,
        "qk_nope_head_dim": d.qk_nope_head_dim,
        "qk_rope_head_dim": d.qk_rope_head_dim,
        "v_head_dim": d.v_head_dim,
        "index_heads": d.index_heads,
        "index_head_dim": d.index_head_dim,
        "index_kpool": d.index_kpool,
    }


TPS = st.sampled_from([1, 2, 4, 8])


@st.composite
def kda_tp_geometries(draw: st.DrawFn) -> kda.KdaGeometry:
    """KDA geometries that meet every constraint at a drawn tp in {1, 2, 4, 8}."""
    tp = draw(TPS)
    d = draw(st.sampled_from([16, 32, 64, 128]))
    local_heads = max(1, 128 // d) * draw(st.integers(1, 2))  # 2·(H/tp)·D % 256 == 0
    return kda.KdaGeometry(
        hidden=draw(st.integers(1, 12)), linear_heads=tp * local_heads, linear_head_dim=d, conv_kernel=draw(st.integers(1, 4)),
        scan_chunk=draw(st.integers(1, 16)), tp=tp,
    )  # fmt: skip


@st.composite
def dsa_tp_geometries(draw: st.DrawFn) -> dsa.DsaGeometry:
    tp = draw(TPS)
    g = draw(dsa_geometries())
    return dsa.DsaGeometry(**{**g.__dict__, "heads": tp * draw(st.integers(1, 2)), "tp": tp})


def read_file(path: Any) -> dict[str, Array]:
    """Every tensor of one .safetensors file, parsed by the safetensors library (not our reader)."""
    import safetensors

    out: dict[str, Array] = {}
    for n, t in safetensors.deserialize(path.read_bytes()):
        np_dtype = DTYPES[t["dtype"]].numpy
        out[n] = np.frombuffer(t["data"], dtype=np_dtype).reshape(t["shape"])
    return out


def field_rules(meta: dict[str, str]) -> dict[str, FieldRule]:
    """Each field of an ``--out`` file by name, with the rule of the block that bound it
    (from the file's own ``layers`` metadata: each layer's slots and their blocks)."""
    out: dict[str, FieldRule] = {}
    for index, layer in json.loads(meta["layers"]).items():
        for slot, block in layer["slots"].items():
            for field, rule in TABLE.block(block).fields.items():
                out[f"layers.{index}.{slot}.{field}"] = rule
    if TABLE.globals:
        for field, rule in TABLE.block(TABLE.globals).fields.items():
            out[f"globals.{field}"] = rule
    return out


def rejoin(rule: FieldRule, shares: dict[tuple[int, int], Array], tp: int, ep: int) -> Array:
    """The whole (tp = ep = 1) field from every (tp rank, ep rank)'s share of it.

    Within an ep rank the tp shares join along the rule's axis, part by part (a rank holds
    [gate_r; up_r], so the parts rejoin separately); a stacked family's ep shares then join
    on axis 0 (whole experts). Anything replicated must be equal on every rank.
    """
    per_ep = []
    for e in range(ep):
        ranks = [shares[(t, e)] for t in range(tp)]
        if rule.layout == "replicated":
            assert all(r.tobytes() == ranks[0].tobytes() for r in ranks), "replicated differs"
            per_ep.append(ranks[0])
            continue
        axis = rule.axis % ranks[0].ndim
        pieces = [np.split(r, rule.parts, axis=axis) for r in ranks]
        per_ep.append(
            np.concatenate(
                [np.concatenate([p[i] for p in pieces], axis=axis) for i in range(rule.parts)],
                axis=axis,
            )
        )
    if rule.family is not None:
        return np.concatenate(per_ep, axis=0)
    assert all(x.tobytes() == per_ep[0].tobytes() for x in per_ep), "differs across ep ranks"
    return per_ep[0]


def copy_with(
    ckpt: Path, dest: Path, edit: dict[str, Any] | None = None, config: dict[str, Any] | None = None
) -> Path:
    """A one-file copy: tensors edited ({name: array, or None to drop; a name ending in '.*'
    drops every tensor under that prefix}), config.json fields replaced."""
    dest.mkdir()
    tensors: dict[str, Any] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        tensors |= read_file(f)
    for n, v in (edit or {}).items():
        if n.endswith(".*"):
            tensors = {k: a for k, a in tensors.items() if not k.startswith(n[:-1])}
        elif v is None:
            tensors.pop(n)
        else:
            tensors[n] = v
    save_file(tensors, str(dest / "model.safetensors"))
    cfg = json.loads((ckpt / "config.json").read_text()) | (config or {})
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def cached_binds(
    ckpt: Path, table: Any, mtp: bool = True
) -> Callable[[int, int, int, int], BindResult]:
    """``get(tp, tp_rank, ep, ep_rank)``: the bind of ``ckpt`` at those ranks, each made once
    (``mtp=False``: the decoder alone, as ``--no-mtp``)."""
    cache: dict[tuple[int, int, int, int], BindResult] = {}

    def get(tp: int, r: int, ep: int, e: int) -> BindResult:
        if (tp, r, ep, e) not in cache:
            cache[tp, r, ep, e] = bind_checkpoint(
                CheckpointDir(ckpt), table, tp_size=tp, tp_rank=r, ep_size=ep, ep_rank=e,
                progress=False, mtp=mtp,
            )  # fmt: skip
        return cache[tp, r, ep, e]

    return get


# A bound-file metadata record with every field set: the format's round trip and its fuzzer.
FULL_META = BoundMeta(
    model="glm-5.3-flash",
    specs_sha256="ab" * 32,
    ranks=Ranks(2, 1, 4, 3),
    geometry={"hidden": 72, "experts": 8},
    overrides={"kda_chunk": 16},
    layers={0: ("decoder", {"attention": "kda", "mlp": "dense"}), 10: ("mtp", {"mtp": "mtp_head"})},
    tensors=42,
    quant=QuantMeta("nvfp4-modelopt", False, ("dequantized", "swizzled")),
    world=8,
    rank=7,
    digests={"layers.0.mlp.down": "0f" * 16, "globals.norm": "a1" * 16},
)
