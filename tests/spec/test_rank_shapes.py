"""Claims about the shape comments of generated code: they are the shapes a rank holds.

A bound field's comment (``q_absorb: T  # [heads_r * kv_lora_rank, q_lora_rank]``) is read back from the generated
source, evaluated with each legend name defined independently of the planner (``U_r = U /
tp``; ``E_r`` from vLLM's map), and compared with what that rank actually binds. The einsum
lowering the generated ``ops.contract`` calls name is checked against each letter's role.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from helpers import layer_arrays, source

from specbind.core import algebra
from specbind.core.einsum import lower
from specbind.core.errors import AlgebraError, GenerateError, GeometryError
from specbind.core.planning import Ranks
from specbind.generated import MODELS
from specbind.generator import yamlio
from specbind.generator.block_spec import parse_block
from specbind.generator.rank_shapes import RankShapes
from specbind.runtime.binder import ops
from specbind.synth import tiny_values

REPO = Path(__file__).resolve().parents[2]
GENERATED = REPO / "generated"
FIELD = re.compile(r"^    (\w+): T(?: \| None)?  # \[(.*)\](, replicated)?$", re.M)
LEGEND = re.compile(r"^#   (\w+_r)\b", re.M)
RANKS = (Ranks(tp_size=2, tp_rank=1, ep_size=4, ep_rank=3), Ranks(tp_size=2, tp_rank=0))


def _model_module(name: str) -> ModuleType:
    return importlib.import_module(f"specbind.generated.model_{re.sub(r'[^a-z0-9]+', '_', name)}")


def _rank_env(module: ModuleType, g: Any, r: Ranks) -> dict[str, int]:
    """Every symbol, and each rank-local name as the legend defines it (not from the plan)."""
    env = dict(module.env(g))
    for rule in module.TENSORS:
        if rule.shard.unit is not None:
            env[f"{rule.shard.unit}_r"] = max(env[rule.shard.unit] // r.tp_size, 1)
    for count in module.FAMILIES.values():
        n = env[count]
        env[f"{count}_r"] = n // r.ep_size + (r.ep_rank < n % r.ep_size)
    return env


CASES = [(m, e.name, r) for m, t in sorted(MODELS.items()) for e in t.blocks for r in RANKS]


def _id(case: tuple[str, str, Ranks]) -> str:
    m, b, r = case
    return f"{m}-{b}-tp{r.tp_size}r{r.tp_rank}-ep{r.ep_size}r{r.ep_rank}"


@pytest.mark.parametrize(("model", "block", "ranks"), CASES, ids=[_id(c) for c in CASES])
def test_every_field_binds_the_shape_its_comment_states_on_that_rank(
    model: str, block: str, ranks: Ranks
) -> None:
    table = MODELS[model]
    module = importlib.import_module(f"specbind.generated.{block}")
    whole = table.make_geometry(tiny_values(table))
    g = getattr(_model_module(model), f"{block}_geometry")(whole, ranks)
    full = dataclasses.replace(g, tp=1, ep=1)
    try:
        module.plan(g, ranks.tp_rank, ranks.ep_rank)
    except GeometryError as e:  # the tiny geometry's units are not all divisible by tp=2
        pytest.skip(f"{block} does not split at tp={ranks.tp_size}: {e}")
    bind = getattr(module, f"bind_{block}")
    flags = {f: False for f in table.flags}
    weights, _ = bind(g, 0, source(layer_arrays(module, full)), ranks.tp_rank,
                      ep_rank=ranks.ep_rank, flags=flags)  # fmt: skip
    env = _rank_env(module, g, ranks)
    stated = FIELD.findall(inspect.getsource(module))
    assert {f for f, _, _ in stated} == {f.name for f in dataclasses.fields(weights)} - {"quant"}
    checked = 0
    for field, dims, replicated in stated:
        arr = getattr(weights, field)
        if arr is None:
            continue
        want = tuple(int(algebra.evaluate(algebra.parse(d), env)) for d in dims.split(", "))
        assert np.shape(arr) == want, (field, dims, env)
        assert bool(replicated) == (module.FIELDS[field].layout == "replicated"), field
        checked += 1
    assert checked > 0


def test_each_generated_module_defines_every_rank_local_name_its_comments_use() -> None:
    seen = set()
    for path in sorted(GENERATED.glob("*.py")):
        text = path.read_text()
        defined = set(LEGEND.findall(text))
        comments = " ".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
        used = set(re.findall(r"\b[A-Za-z]\w*_r\b", comments))
        assert used <= defined, (path.name, used - defined)
        seen |= used
    assert {"heads_r", "experts_r", "expert_intermediate_r"} <= seen


def _block(name: str) -> Any:
    path = REPO / "specs" / "blocks" / f"{name}.yaml"
    return parse_block(yamlio.load(path, f"specs/blocks/{name}.yaml"))


def test_a_sharded_dim_reads_as_this_ranks_units_even_through_a_derived_symbol() -> None:
    rs = RankShapes(_block("kda"))
    dt_bias = next(
        t for t in rs.block.tensors if t.name.endswith("dt_bias")
    )  # [proj_dim], proj_dim = linear_heads * linear_head_dim
    assert rs.tensor_dims(dt_bias) == ["linear_heads_r * linear_head_dim"]
    assert rs.legend() == [
        "linear_heads_r = linear_heads/tp (1 when tp > linear_heads): this rank's share of linear_heads (linear-attention heads)"
    ]


def test_a_dim_without_the_unit_as_a_factor_reads_as_divided_by_tp() -> None:
    rs = RankShapes(_block("mla"))
    assert rs.share(algebra.parse("kv_lora_rank + heads"), "heads") == "(kv_lora_rank + heads) / tp"
    assert rs.legend() == []


def test_a_symbol_spelled_like_a_rank_local_name_is_refused() -> None:
    b = _block("mla")
    clash = dataclasses.replace(b, symbols={**b.symbols, "heads_r": "a clash"})
    with pytest.raises(
        GenerateError, match=r"'heads_r' clashes with the rank-local name of 'heads'"
    ):
        RankShapes(clash)


def test_each_einsum_letter_has_the_role_its_operands_give_it() -> None:
    low = lower("ihr,hrc->ihc")
    assert (low.batch, low.left, low.contract, low.right) == ("h", "i", "r", "c")
    assert (low.perm_a, low.perm_b, low.perm_out) == ((1, 0, 2), (0, 1, 2), (1, 0, 2))


@pytest.mark.parametrize(
    ("spec", "ranks", "message"),
    [
        ("ab,bc", None, "an einsum is 'letters,letters->letters'"),
        ("aa,ab->b", None, "a letter repeats within the first operand"),
        ("ab,bc->ad", None, "output letters must be distinct and come from the operands"),
        ("ab,cd->e", None, "output letters must be distinct"),
        ("ab,bc->a", None, r"letter\(s\) c are summed within one operand"),
        ("ab,bc->ac", (3, 2), "the first operand has rank 3, not 2"),
    ],
)
def test_a_malformed_einsum_is_refused_naming_it(
    spec: str, ranks: tuple[int, int] | None, message: str
) -> None:
    with pytest.raises(AlgebraError, match=message):
        lower(spec, ranks)


def test_contract_of_the_einsum_text_matches_numpy_einsum() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5, 4)).astype(np.float32)  # [i, h, r]
    b = rng.standard_normal((5, 4, 6)).astype(np.float32)  # [h, r, c]
    got = ops.contract(a, b, einsum="ihr,hrc->ihc", dtype="F32", factor=0.5)
    want = 0.5 * np.einsum("ihr,hrc->ihc", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(AlgebraError, match="the second operand has rank 3, not 2"):
        ops.contract(a, b, einsum="ihr,hc->ic", dtype="F32")
