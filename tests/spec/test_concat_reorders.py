"""A concat's declared reorders (generator/output_spec.py, runtime/binder/ops.py), on a spec root
of one block and one model:

* a source read with ``pairs_to_halves``: each unit's rows of the source (a head's), stored as
  rotary pairs, reordered into halves, as vLLM's ``Llama4ForCausalLM.permute_qk_weight_for_rotary``
  reorders q and k at load; rank r's field is ``[q_r; k_r; v_r]`` with q_r and k_r so reordered,
  checked against vLLM's own formula transcribed here (view, transpose, reshape) at tp 1, 2, 4
  (KV heads replicated at 4);
* a concat's ``permute``: the joined field's axes reordered, its layout axis following (FusedMoE
  w13 ``[E_r, 2·I/tp, hidden]`` from x @ W halves ``[E_r, hidden, I/tp]``);
* refused at generate, naming where: a reorder of a source that does not shard its rows by a
  unit, a unit of an odd number of rows, a reorder without its ``why``, a permute that is not
  an order of the field's axes.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from specbind.core.errors import SpecError
from specbind.generator.render import generate, load_specs

H, KV, D, X = 4, 2, 6, 5  # heads, KV heads, head dim, hidden: no two equal

BLOCK = """\
block: attn
prefix: self_attn.
symbols:
  hidden: hidden size
  heads: query heads
  kv_heads: key/value heads
  head_dim: head dim
markers: {all_required: true}
tensors:
  q_proj.weight: {dtype: BF16, shape: [heads * head_dim, hidden], shard: {rows: heads}}
  k_proj.weight: {dtype: BF16, shape: [kv_heads * head_dim, hidden], shard: {rows: kv_heads}}
  v_proj.weight: {dtype: BF16, shape: [kv_heads * head_dim, hidden], shard: {rows: kv_heads}}
outputs:
  qkv:
    concat:
      - {tensor: q_proj.weight, pairs_to_halves: true, why: vLLM permute_qk_weight_for_rotary}
      - {tensor: k_proj.weight, pairs_to_halves: true, why: vLLM permute_qk_weight_for_rotary}
      - v_proj.weight
    axis: 0
"""

MODEL = f"""\
model: attn-test
layers:
  pattern: "layers.{{index}}."
  slots: {{attention: {{blocks: [attn]}}}}
geometry:
  hidden:   {{config: hidden_size,         value: {X}}}
  heads:    {{config: num_attention_heads, value: {H}}}
  kv_heads: {{config: num_key_value_heads, value: {KV}}}
  head_dim: {{config: head_dim,            value: {D}}}
blocks:
  - block: attn
"""

E, INTER = 3, 4  # experts, expert intermediate
EXPERTS = """\
block: attn
prefix: mlp.
symbols:
  hidden: hidden size
  experts: experts
  inter: expert intermediate
families:
  e: {count: experts, shard: experts}
markers: {all_required: true}
tensors:
  gate: {dtype: BF16, shape: [experts, hidden, inter], stacked: e, shard: {cols: inter}}
  up: {dtype: BF16, shape: [experts, hidden, inter], stacked: e, shard: {cols: inter}}
outputs:
  w13: {concat: [gate, up], axis: 2, permute: [0, 2, 1]}
"""

EXPERTS_MODEL = f"""\
model: attn-test
layers:
  pattern: "layers.{{index}}."
  slots: {{mlp: {{blocks: [attn]}}}}
geometry:
  hidden:  {{config: hidden_size,       value: {X}}}
  experts: {{config: num_local_experts, value: {E}}}
  inter:   {{config: intermediate_size, value: {INTER}}}
blocks:
  - block: attn
"""


def _root(tmp_path: Path, block: str, model: str) -> Path:
    root = tmp_path / "root"
    (root / "specs" / "blocks").mkdir(parents=True)
    (root / "specs" / "models").mkdir()
    (root / "specs" / "blocks" / "attn.yaml").write_text(block)
    (root / "specs" / "models" / "attn-test.yaml").write_text(model)
    return root


def _refusal(tmp_path: Path, block: str, model: str = MODEL) -> SpecError:
    with pytest.raises(SpecError) as e:
        load_specs(_root(tmp_path, block, model))
    assert "\n" not in str(e.value)
    return e.value


def _module(root: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    generate(root, root / "generated")
    spec = importlib.util.spec_from_file_location("attn_gen", root / "generated" / "attn.py")
    assert spec is not None and spec.loader is not None
    mod: Any = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "attn_gen", mod)
    spec.loader.exec_module(mod)
    return mod


def _bind(mod: Any, src: Any, tp: int, rank: int, ep: int = 1, ep_rank: int = 0, **g: int) -> Any:
    import dataclasses

    from specbind.runtime.layout.slots import LayerSource

    names = [n.removeprefix("layers.0.") for n in src.names()]
    fields = {f.name for f in dataclasses.fields(mod.AttnGeometry)}
    geo = mod.AttnGeometry(**{k: v for k, v in (g | {"tp": tp, "ep": ep}).items() if k in fields})
    kw = {"ep_rank": ep_rank} if "ep" in fields else {}
    got, _ = mod.bind_attn(geo, 0, LayerSource(src, "layers.0.", names), rank, **kw)
    return got


def _vllm_permute(w: Any, n_heads: int) -> Any:
    """vllm/model_executor/models/llama4.py, Llama4ForCausalLM.permute_qk_weight_for_rotary,
    transcribed: view(n_heads, f_out // n_heads // 2, 2, f_in).transpose(1, 2).reshape."""
    f_out, f_in = w.shape
    return w.reshape(n_heads, f_out // n_heads // 2, 2, f_in).transpose(0, 2, 1, 3).reshape(w.shape)


def _weights() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        n: rng.standard_normal((rows, X)).astype(ml_dtypes.bfloat16)
        for n, rows in (("q", H * D), ("k", KV * D), ("v", KV * D))
    }


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_ranks_q_and_k_rows_are_vllms_rotary_reorder_of_its_heads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tp: int
) -> None:
    from helpers import raw

    from specbind.runtime.io.source import DictSource

    w = _weights()
    src = DictSource({f"layers.0.self_attn.{n}_proj.weight": raw(a) for n, a in w.items()})
    mod = _module(_root(tmp_path, BLOCK, MODEL), monkeypatch)
    # vLLM reorders the whole stored q and k, then QKVParallelLinear takes the rank's heads
    q, k = _vllm_permute(w["q"].astype(np.float64), H), _vllm_permute(w["k"].astype(np.float64), KV)
    v = w["v"].astype(np.float64)
    for r in range(tp):
        qh = slice(r * H // tp * D, (r + 1) * H // tp * D)
        kv = r * KV // tp if tp <= KV else r // (tp // KV)
        kh = slice(kv * D, kv * D + max(KV // tp, 1) * D)
        want = np.concatenate([q[qh], k[kh], v[kh]])
        got = np.asarray(_bind(mod, src, tp, r, hidden=X, heads=H, kv_heads=KV, head_dim=D).qkv)
        assert np.array_equal(got.astype(np.float64), want), (tp, r)
    assert not np.array_equal(q, w["q"].astype(np.float64)), "the reorder moves rows"


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1), (4, 1), (2, 2)])
def test_a_permuted_concat_binds_fused_moes_w13_gate_r_then_up_r_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tp: int, ep: int
) -> None:
    from helpers import raw

    from specbind.runtime.io.source import DictSource

    rng = np.random.default_rng(1)
    gate, up = (rng.standard_normal((E, X, INTER)).astype(ml_dtypes.bfloat16) for _ in range(2))
    src = DictSource({"layers.0.mlp.gate": raw(gate), "layers.0.mlp.up": raw(up)})
    mod = _module(_root(tmp_path, EXPERTS, EXPERTS_MODEL), monkeypatch)
    per = INTER // tp
    for e in range(ep):
        lo, n = e * (E // ep) + min(e, E % ep), E // ep + (e < E % ep)
        for r in range(tp):
            cols = slice(r * per, (r + 1) * per)
            want = np.concatenate([gate[lo : lo + n, :, cols], up[lo : lo + n, :, cols]], 2)
            got = _bind(mod, src, tp, r, ep, e, hidden=X, experts=E, inter=INTER)
            assert np.array_equal(np.asarray(got.w13), want.transpose(0, 2, 1)), (tp, r, e)
    assert mod.FIELDS["w13"].layout == "axis" and mod.FIELDS["w13"].axis == 1


@pytest.mark.parametrize(
    ("old", "new", "path", "fragment"),
    [
        ("shape: [kv_heads * head_dim, hidden], shard: {rows: kv_heads}}\n  v_proj",
         "shape: [kv_heads * head_dim, hidden], shard: replicated}\n  v_proj",
         "outputs.qkv.concat", "does not shard its rows by a unit"),
        ("pairs_to_halves: true, why: vLLM permute_qk_weight_for_rotary}\n      - {tensor: k",
         "pairs_to_halves: true}\n      - {tensor: k", "outputs.qkv.concat[0]", "why"),
    ],
    ids=["replicated-source", "no-why"],
)  # fmt: skip
def test_a_bad_rotary_reorder_is_refused_at_generate_naming_where(
    tmp_path: Path, old: str, new: str, path: str, fragment: str
) -> None:
    assert old in BLOCK
    err = _refusal(tmp_path, BLOCK.replace(old, new))
    assert err.file == "specs/blocks/attn.yaml" and err.path.startswith(path), err
    assert fragment in err.message, err


def test_a_unit_of_an_odd_number_of_rows_is_refused_at_generate(tmp_path: Path) -> None:
    err = _refusal(tmp_path, BLOCK, MODEL.replace(f"value: {D}}}", "value: 7}"))
    assert err.path == "outputs.qkv.concat" and "an odd number" in err.message, err


def test_a_permute_that_is_not_an_order_of_the_axes_is_refused(tmp_path: Path) -> None:
    err = _refusal(tmp_path, EXPERTS.replace("permute: [0, 2, 1]", "permute: [0, 2, 2]"),
                   EXPERTS_MODEL)  # fmt: skip
    assert err.path == "outputs.w13.permute" and "not an order of 3 axes" in err.message, err
