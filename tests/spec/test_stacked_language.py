"""The language constructs gpt-oss's stacked experts needed, each accepted or
refused on its own (the family's own test is test_family_gpt_oss.py):

* ``stacked: e`` on a tensor: axis 0 of one stored tensor is the family ``e`` (its count
  symbol exactly); tp may split any other axis, never axis 0; an undeclared family, an axis 0
  that is not the count, a placeholder in the name are refused at generate time;
* ``permute`` in a unary transform: the layout axis follows it; a stacked family's axis 0
  stays first; a permute that is not an order of the axes is refused;
* de-interleaving: ``view [E, X, I, 2]`` then ``permute [0, 3, 2, 1]`` binds gpt-oss's
  interleaved gate/up as [E_r, 2, I_r, X], whose row-major bytes are each expert's
  [gate_r; up_r]; in a stacked operand's view the count means this ep rank's members;
* ``--ep-size > 1`` on a model whose layers have no expert family is refused in one line (a
  MoE model's checkpoint of dense layers alone still binds: ep ranks replicate dense layers).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from specbind.core.errors import BindError, SpecError
from specbind.core.ir import ShardRule, TensorRule
from specbind.core.planning import member_range, plan_block
from specbind.generated import MODELS
from specbind.generator.render import load_specs, render_all
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.binder.tp import shard_raw
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.io.source import DictSource, RawTensor

REPO = Path(__file__).resolve().parents[2]
MOE = "blocks/stacked_moe.yaml"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    return tmp_path


def edit(root: Path, rel: str, old: str, new: str) -> None:
    p = root / "specs" / rel
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new", "path", "fragment"),
    [
        ("shard: {cols: expert_inter, interleave: true}  # whole", "shard: {rows: experts}  #",
         "tensors.experts.gate_up_proj.shard", "tp splits another axis"),
        ("shape: [experts, hidden, 2 * expert_inter]\n    stacked: e",
         "shape: [hidden, experts, 2 * expert_inter]\n    stacked: e",
         "tensors.experts.gate_up_proj.stacked", "axis 0 must be the family count 'experts'"),
        ("shape: [experts, hidden, 2 * expert_inter]\n    stacked: e",
         "shape: [experts, hidden, 2 * expert_inter]\n    stacked: f",
         "tensors.experts.gate_up_proj.stacked", "family 'f' is not declared"),
        ("permute: [0, 2, 1]}\n  w13_bias", "permute: [2, 0, 1]}\n  w13_bias",
         "outputs.w13.permute", "axis 0 must stay first"),
        ("permute: [0, 2, 1]}\n  w13_bias", "permute: [0, 2, 2]}\n  w13_bias",
         "outputs.w13.permute", "is not an order of 3 axes"),
    ],
    ids=["tp-on-axis-0", "axis-0-not-the-count", "undeclared-family", "permute-moves-axis-0",
         "not-a-permutation"],
)  # fmt: skip
def test_a_bad_stacked_tensor_or_permute_is_refused_at_generate_naming_where(
    root: Path, old: str, new: str, path: str, fragment: str
) -> None:
    edit(root, MOE, old, new)
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert e.value.file == f"specs/{MOE}" and e.value.path == path, (e.value.path, str(e.value))
    assert fragment in e.value.message and "\n" not in str(e.value)


DEINTERLEAVE = """
  # [E_r, X, I_r, 2] -> [E_r, 2, I_r, X]: each expert's [gate_r; up_r], de-interleaved
  w13_halves:
    tensor: experts.gate_up_proj
    view: [experts, hidden, expert_inter, 2]
    permute: [0, 3, 2, 1]
"""


def _module(root: Path, name: str) -> Any:
    """A block module rendered from the specs under ``root``, imported from its source."""
    source = render_all(root)[f"{name}.py"]
    mod = types.ModuleType(f"specbind_test_{name}")
    sys.modules[mod.__name__] = mod
    exec(compile(source, f"{name}.py", "exec"), mod.__dict__)
    return mod


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1), (2, 2), (4, 3)])
def test_view_and_permute_de_interleave_gate_and_up_on_every_rank(
    root: Path, tp: int, ep: int
) -> None:
    edit(root, MOE, "outputs:\n", "outputs:" + DEINTERLEAVE)
    mod = _module(root, "stacked_moe")
    assert mod.FIELDS["w13_halves"].layout == "axis" and mod.FIELDS["w13_halves"].axis == 2
    e, x, i = 5, 6, 8
    rng = np.random.default_rng(0)
    arrays = {
        "mlp.router.weight": rng.standard_normal((e, x)),
        "mlp.router.bias": rng.standard_normal(e),
        "mlp.experts.gate_up_proj": rng.standard_normal((e, x, 2 * i)),
        "mlp.experts.gate_up_proj_bias": rng.standard_normal((e, 2 * i)),
        "mlp.experts.down_proj": rng.standard_normal((e, i, x)),
        "mlp.experts.down_proj_bias": rng.standard_normal((e, x)),
    }
    raw = {
        n: RawTensor("BF16", a.shape, memoryview(a.astype(ml_dtypes.bfloat16).tobytes()))
        for n, a in arrays.items()
    }
    g = mod.StackedMoeGeometry(hidden=x, experts=e, expert_inter=i, tp=tp, ep=ep)
    gate_up = arrays["mlp.experts.gate_up_proj"].astype(ml_dtypes.bfloat16)
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]  # transformers' reading of the halves
    base, rem = divmod(e, ep)
    for er in range(ep):
        lo = er * base + min(er, rem)
        hi = lo + base + (er < rem)
        for r in range(tp):
            w, _ = mod.bind_stacked_moe(g, 0, DictSource(raw), r, ep_rank=er)
            cols = slice(r * i // tp, (r + 1) * i // tp)
            want = np.stack([gate[lo:hi, :, cols], up[lo:hi, :, cols]], axis=1)  # [E_r, 2, X, I_r]
            want = want.transpose(0, 1, 3, 2)  # -> [E_r, 2, I_r, X]
            assert w.w13_halves.shape == (hi - lo, 2, i // tp, x)
            assert w.w13_halves.tobytes() == np.ascontiguousarray(want).tobytes(), (tp, ep, r)


def _without_experts(table: Any) -> Any:
    """GLM-5.3-Flash as a model of dense MLPs only: the moe block gone from its blocks and
    slots (a model spec whose layers declare no expert family, as a dense Llama's)."""
    slots = tuple(
        dataclasses.replace(
            s, blocks=tuple(b for b in s.blocks if b != "moe"),
            values=tuple((b, v) for b, v in s.values if b != "moe"),
        )
        for s in table.slots
    )  # fmt: skip
    blocks = tuple(b for b in table.blocks if b.name != "moe")
    return dataclasses.replace(table, blocks=blocks, slots=slots)


def test_ep_over_one_on_a_model_without_an_expert_family_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    from specbind.synth import synth, tiny_values

    table = MODELS["glm-5.3-flash"]
    synth(table, tmp_path, tiny_values(table), layers=2, mtp=False)  # KDA + dense layers only
    dense = _without_experts(table)
    with pytest.raises(BindError) as e:
        bind_checkpoint(CheckpointDir(tmp_path), dense, ep_size=2, ep_rank=1, progress=False)
    assert "--ep-size 2" in str(e.value) and "no expert family" in str(e.value)
    assert "\n" not in str(e.value)
    bind_checkpoint(CheckpointDir(tmp_path), dense, ep_size=1, progress=False)  # ep 1 binds
    # a MoE model's checkpoint of dense layers only binds at ep 2: ep ranks replicate them
    bind_checkpoint(CheckpointDir(tmp_path), table, ep_size=2, ep_rank=1, progress=False)


@st.composite
def _stacked_cases(draw: st.DrawFn) -> tuple[int, int, int, int, int, int]:
    """(members, ep, tp, a, units, per unit) of a stacked [E, a, units·per] split on axis 2."""
    members = draw(st.integers(1, 7))
    ep = draw(st.integers(1, members))
    tp = draw(st.sampled_from([1, 2, 3, 4]))
    units = tp * draw(st.integers(1, 3))
    return members, ep, tp, draw(st.integers(1, 3)), units, draw(st.integers(1, 3))


@settings(max_examples=examples(2), deadline=None)
@given(_stacked_cases(), st.sampled_from([1, 2, -1]))
def test_the_ranks_shares_of_a_stacked_tensor_rejoin_it_whole_and_each_reads_its_members_only(
    case: tuple[int, int, int, int, int, int], axis: int
) -> None:
    """Planning and reading agree with vLLM's map: ep rank e holds members
    [e·base + min(e, rem), … + base + (e < rem)); within them tp rank t the t-th block of the
    split axis; joined over tp then ep, the shares are the stored tensor, byte for byte."""
    members, ep, tp, a, units, per = case
    shape = (members, a, units * per) if axis != 1 else (members, units * per, a)
    split = 1 if axis == 1 else 2
    shard = ShardRule("cols", "U", -1) if axis == -1 else ShardRule("axis", "U", split)
    rule = TensorRule("w", "F32", "[E, .., ..]", shard, stacked="e")
    whole = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    raw = RawTensor("F32", shape, memoryview(whole.tobytes()))
    per_ep = []
    for e in range(ep):
        env = {"E": members, "U": units, "tp": tp, "ep": ep}
        shares = []
        for t in range(tp):
            plan = plan_block("b", [rule], {"w": shape}, env, t, {}, e, {"e": "E"}).tensors["w"]
            got = shard_raw(plan, raw, 0)
            arr = np.frombuffer(got.data, np.float32).reshape(got.shape)
            assert got.shape == plan.local_shape
            first, count = member_range(members, ep, e).start, len(member_range(members, ep, e))
            assert plan.members == (first, count)
            shares.append(arr)
        per_ep.append(np.concatenate(shares, axis=split))
    assert np.concatenate(per_ep, axis=0).tobytes() == whole.tobytes()


@pytest.fixture
def fake_cupy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import fake_cupy

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    cp = fake_cupy.install(str(tmp_path))
    import specbind.generated.kernels as k

    k.module.cache_clear()
    yield cp
    sys.modules.pop("cupy", None)
    k.module.cache_clear()


def test_the_device_path_binds_the_stacked_experts_as_the_numpy_backend_does(
    fake_cupy: Any, tmp_path: Path
) -> None:
    """The permute and the ep rows of a stacked family on the CuPy path (a stand-in CuPy on
    the CPU): the same bytes as the NumPy backend's, at tp 2 x ep 2."""
    import importlib

    from specbind.runtime.binder import backends
    from specbind.synth import synth, tiny_values

    table = MODELS["gpt-oss"]
    synth(table, tmp_path / "ck", tiny_values(table), seed=4)
    ck = CheckpointDir(tmp_path / "ck")
    ranks = {"tp_size": 2, "tp_rank": 1, "ep_size": 2, "ep_rank": 1, "progress": False}
    host = bind_checkpoint(ck, table, **ranks).fields()
    backend = backends.get("cupy", importlib.import_module("specbind.generated.kernels"))
    dev = bind_checkpoint(ck, table, backend=backend, **ranks).fields()
    assert dev.keys() == host.keys() and "layers.0.mlp.w13" in host
    for key, (rule, want) in host.items():
        got = backend.to_host(dev[key][1], rule.dtype)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), key
