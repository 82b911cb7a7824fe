"""Every family row (tests/support/family_rows_*.py) proven against its own transformers
class, by one table-driven harness.

Claims, per row:
* ``audit`` of the checkpoint the family's transformers class writes accounts for every
  tensor (``unaccounted`` 0, ``problems`` []), and so for each of the row's config variants;
* on every rank of every listed tp (x ep), the bound fields are exactly the row's reference
  layout (no field unchecked, none missing), and each equals, bit for bit, the reference slice
  of the loaded module's tensors (vLLM's per-rank layout, computed by family_table's rules);
* every semantic check holds at every listed tp: a layer output computed from the ranks'
  fields alone, summed over ranks, equals the module's;
* a tp the units do not allow is refused with a one-line error naming the unit;
* every variant a row lists as ``refused`` (a layout its class also writes that the spec
  cannot say) is refused by audit and by bind, in one line naming what does not fit;
* (rows with ``beyond``) every tp in 1..8 that bind accepts is one the row proves or one it
  names with the reason it is not proven, and every tp the row lists binds.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_proof import ProofContext, write_family
from family_table import Family

from specbind.audit import audit
from specbind.core.errors import GeometryError
from specbind.runtime.checkpoint import CheckpointDir

pytest.importorskip("torch", exc_type=ImportError)
pytest.importorskip("transformers", exc_type=ImportError)

pytestmark = pytest.mark.interop

SUPPORT = Path(__file__).resolve().parent.parent / "support"


def _rows() -> list[Family]:
    rows: list[Family] = []
    for p in sorted(SUPPORT.glob("family_rows_*.py")):
        rows.extend(importlib.import_module(p.stem).ROWS)
    names = [r.model for r in rows]
    assert len(names) == len(set(names)), f"a family has two rows: {names}"
    return rows


ROWS = _rows()
RANKS = [pytest.param(r, tp, ep, id=f"{r.id}-tp{tp}-ep{ep}") for r in ROWS for tp in r.tps
         for ep in r.eps]  # fmt: skip
_CONTEXTS: dict[str, ProofContext] = {}


@pytest.fixture(scope="session")
def proofs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    def get(row: Family) -> ProofContext:
        if row.model not in _CONTEXTS:
            path = write_family(row, tmp_path_factory.mktemp(row.model) / "ck")
            _CONTEXTS[row.model] = ProofContext(row, path)
        return _CONTEXTS[row.model]

    return get


def _stored_count(path: Path) -> int:
    from safetensors import safe_open

    n = 0
    for f in path.glob("*.safetensors"):
        with safe_open(f, "np") as h:
            n += len(list(h.keys()))
    return n


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_audit_accounts_for_every_tensor_the_family_class_writes(
    proofs: Any, row: Family, tmp_path: Path
) -> None:
    ctx = proofs(row)
    paths = [ctx.path] + [
        write_family(row, tmp_path / name, row.config | over) for name, over in row.variants.items()
    ]
    for path in paths:
        rep = audit(CheckpointDir(path), ctx.table, progress=False)
        assert rep["problems"] == [], (path.name, rep["problems"])
        assert rep["coverage"]["unaccounted"] == 0, (path.name, rep["coverage"])
        assert rep["coverage"]["bound"] >= _stored_count(path), (path.name, rep["coverage"])


def _is_reference(
    got: Any, name: str, rule: Any, root: Any, cfg: Any, tp: int, r: int, ep: int, e: int
) -> None:
    """Bound field ``name`` of rank (r, e) equals ``rule``'s slice of ``root``'s tensors (a
    rule with ``slice_ep``, an expert layout, is given the ep size and rank too)."""

    def t(n: str) -> Any:  # a parameter, or a buffer (a router's score-correction bias)
        module, _, attr = n.rpartition(".")
        return getattr(root.get_submodule(module), attr).detach().numpy()

    by_ep = getattr(rule, "slice_ep", None)
    want = by_ep(t, cfg, tp, r, ep, e) if by_ep is not None else rule.slice(t, cfg, tp, r)
    assert got[name].shape == want.shape, (name, tp, r, got[name].shape, want.shape)
    assert np.array_equal(got[name], want), (name, tp, r)


@pytest.mark.parametrize(("row", "tp", "ep"), RANKS)
def test_every_field_of_every_rank_is_vllms_slice_of_the_loaded_module(
    proofs: Any, row: Family, tp: int, ep: int
) -> None:
    ctx = proofs(row)
    cfg = ctx.config
    layers = cfg["num_hidden_layers"]
    expected = {f"layers.{i}.{k}" for i in range(layers) for k in row.layout(cfg, i)}
    expected |= {f"globals.{k}" for k in row.globals}
    checked = 0
    for r in range(tp):
        for e in range(ep):
            got = ctx.fields(tp, r, ep, e)
            assert set(got) == expected, (
                f"bound but no reference: {sorted(set(got) - expected)}; "
                f"referenced but not bound: {sorted(expected - set(got))}"
            )
            for i in range(layers):
                for k, rule in row.layout(cfg, i).items():
                    _is_reference(got, f"layers.{i}.{k}", rule, ctx.layer(i), cfg, tp, r, ep, e)
                    checked += 1
            for k, rule in row.globals.items():
                _is_reference(got, f"globals.{k}", rule, ctx.model, cfg, tp, r, ep, e)
                checked += 1
    assert checked == len(expected) * tp * ep


@pytest.mark.parametrize(("row", "tp", "ep"), RANKS)
def test_a_layer_computed_from_the_ranks_fields_equals_the_module(
    proofs: Any, row: Family, tp: int, ep: int
) -> None:
    assert row.semantics, f"{row.model}: a row needs at least one semantic check"
    for check in row.semantics:  # an MoE check (``per_ep``) sums over the ep ranks too
        if getattr(check, "per_ep", False):
            check(proofs(row), tp, ep)
        elif ep == 1:
            check(proofs(row), tp)


@pytest.mark.parametrize(
    "row", [pytest.param(r, id=r.id) for r in ROWS if r.refused_tp is not None]
)
def test_a_tp_the_units_do_not_allow_is_refused_naming_the_unit(proofs: Any, row: Family) -> None:
    ctx = proofs(row)
    assert row.refused_tp is not None
    with pytest.raises(GeometryError) as e:
        ctx.bind(row.refused_tp, 0)
    msg = str(e.value)
    assert f"which tp {row.refused_tp} does not divide" in msg and "\n" not in msg, msg


CENSUS = [pytest.param(r, id=r.id) for r in ROWS if r.beyond is not None]


@pytest.mark.parametrize("row", CENSUS)
def test_every_tp_bind_accepts_is_proven_or_named_with_its_reason(proofs: Any, row: Family) -> None:
    from specbind.core.errors import SpecbindError

    ctx = proofs(row)
    assert row.beyond is not None
    accepted = set()
    for tp in range(1, 9):
        try:
            ctx.bind(tp, tp - 1)
        except SpecbindError:
            continue
        accepted.add(tp)
    assert set(row.tps) <= accepted, (sorted(accepted), row.tps)
    unproven = accepted - set(row.tps)
    assert unproven == set(row.beyond), f"bound but neither proven nor named: {sorted(unproven)}"
    assert all(why.strip() for why in row.beyond.values())


REFUSED = [pytest.param(r, v, id=f"{r.id}-{v}") for r in ROWS for v in r.refused]


@pytest.mark.parametrize(("row", "variant"), REFUSED)
def test_a_variant_the_spec_cannot_say_is_refused_by_name(
    proofs: Any, row: Family, variant: str, tmp_path: Path
) -> None:
    from specbind.core.errors import SpecbindError
    from specbind.runtime.bind import bind_checkpoint

    over, fragment = row.refused[variant]
    path = write_family(row, tmp_path / variant, row.config | over)
    table = proofs(row).table
    rep = audit(CheckpointDir(path), table, progress=False)
    assert rep["problems"] and fragment in rep["problems"][0], rep["problems"]
    with pytest.raises(SpecbindError) as e:
        bind_checkpoint(CheckpointDir(path), table, progress=False)
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)
