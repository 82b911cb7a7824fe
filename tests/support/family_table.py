"""The rows of the table-driven family proofs (tests/families/test_family_proofs.py), and the
reference rules each row's expected rank slices are computed by.

A row names a family's spec, its own transformers classes, a tiny config where no two sizes
are equal, the tp x ep ranks to check, and a reference layout: every bound field of a layer
(``slot.field``) or of the model (``globals.field``) mapped to a rule over the LOADED MODULE's
tensors. The rules re-implement how vLLM lays a parameter out per rank (QKVParallelLinear,
MergedColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, replicated), written
here from vLLM's loaders, never read back from the spec: a spec that shards a tensor another
way fails the proof.

Rules (``units``: a config.json field, an int, or a function of config.json):
* ``Rep(t)``: the whole tensor on every rank.
* ``Col(t, units)``: rows (axis 0) split into tp equal parts by ``units``; where tp exceeds
  ``units`` (KV heads at tp 4 with 2 KV heads), unit ``r // (tp / units)`` whole, as vLLM
  replicates KV heads. A 1-D tensor (a bias, a whole-projection norm) splits the same way.
* ``Row(t, units)``: columns (axis 1) split into tp parts by ``units``.
* ``Cat(*rules)``: each rule's rank slice, joined on axis 0 ([q_r; k_r; v_r], [gate_r; up_r]).
* ``Part(rule, sections, k)``: section ``k`` of a stored fused tensor (its rows, the sections'
  row counts given in order), then sharded by ``rule`` (which names the fused tensor and the
  section's units).

Trap: a reference that is missing for a bound field, or bound for no field, fails the proof;
the layout is the full list of what the family binds, not a sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# a config.json field, a number, or a function of config.json (kv_heads * head_dim)
Units = str | int | Callable[[Mapping[str, Any]], int]


def units_of(config: Mapping[str, Any], units: Units) -> int:
    if isinstance(units, int):
        return units
    return int(config[units]) if isinstance(units, str) else units(config)


@dataclass(frozen=True)
class Rep:
    tensor: str

    def slice(self, t: Callable[[str], Any], cfg: Mapping[str, Any], tp: int, r: int) -> Any:
        return t(self.tensor)


def _split(a: Any, axis: int, n_units: int, tp: int, r: int) -> Any:
    size = a.shape[axis]
    assert size % n_units == 0, f"{size} rows are not {n_units} whole units"
    if tp <= n_units:
        assert n_units % tp == 0, f"tp {tp} does not divide {n_units} units"
        per = size // tp
        lo = r * per
    else:
        assert tp % n_units == 0, f"tp {tp} is not a multiple of {n_units} units"
        per = size // n_units
        lo = r // (tp // n_units) * per
    return np.take(a, np.arange(lo, lo + per), axis=axis)


@dataclass(frozen=True)
class Col:
    tensor: str
    units: Units

    def slice(self, t: Callable[[str], Any], cfg: Mapping[str, Any], tp: int, r: int) -> Any:
        return _split(t(self.tensor), 0, units_of(cfg, self.units), tp, r)


@dataclass(frozen=True)
class Row:
    tensor: str
    units: Units

    def slice(self, t: Callable[[str], Any], cfg: Mapping[str, Any], tp: int, r: int) -> Any:
        return _split(t(self.tensor), 1, units_of(cfg, self.units), tp, r)


@dataclass(frozen=True)
class Cat:
    parts: tuple[Any, ...]

    def __init__(self, *parts: Any) -> None:
        object.__setattr__(self, "parts", parts)

    def slice(self, t: Callable[[str], Any], cfg: Mapping[str, Any], tp: int, r: int) -> Any:
        return np.concatenate([p.slice(t, cfg, tp, r) for p in self.parts], axis=0)


@dataclass(frozen=True)
class Part:
    """Section ``k`` of a fused stored tensor, then sharded by ``rule`` (over the section)."""

    rule: Col | Row | Rep
    sections: tuple[int, ...]  # the fused tensor's row count of each section, in order
    k: int

    def slice(self, t: Callable[[str], Any], cfg: Mapping[str, Any], tp: int, r: int) -> Any:
        sizes = list(self.sections)
        whole = t(self.rule.tensor)
        assert whole.shape[0] == sum(sizes), (self.rule.tensor, whole.shape, sizes)
        lo = sum(sizes[: self.k])
        section = whole[lo : lo + sizes[self.k]]
        return type(self.rule)(**{**self.rule.__dict__, "tensor": "section"}).slice(
            lambda _: section, cfg, tp, r
        )


Rule = Rep | Col | Row | Cat | Part
# A semantic check: (proof context, tp) -> None, asserting; see family_semantics.py.
Semantic = Callable[[Any, int], None]


@dataclass(frozen=True)
class Family:
    """One row: a family's spec, its transformers writer, where no two sizes are equal."""

    model: str  # the specs/models name (specbind.generated.MODELS key)
    hf_class: str  # transformers' *ForCausalLM class name
    config_class: str  # transformers' config class name
    config: dict[str, Any]  # the tiny config, pairwise-different sizes, >= 2 layers
    layer: dict[str, Rule]  # bound `slot.field` -> reference over the layer module's tensors
    globals: dict[str, Rule]  # bound `globals.field` -> reference over the model's tensors
    tps: tuple[int, ...]  # every legal tp, including one that replicates KV heads
    semantics: tuple[Semantic, ...]  # at least one: a layer output from the ranks' fields
    eps: tuple[int, ...] = (1,)
    # tps in 1..8 that bind accepts but the row does not prove, each with the reason (vLLM's
    # Transformers backend cannot hold a KV head split mid-head at tp > kv_heads); None: the
    # row does not take part in that census
    beyond: dict[int, str] | None = None
    # configs the family's class also writes that the spec cannot say, each refused by name:
    # variant name -> (config overrides, a fragment audit's first problem and bind's one-line
    # error both hold)
    refused: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    layers_path: str = "model.layers"  # the module list of decoder layers
    refused_tp: int | None = 3  # a tp the units do not allow: bind refuses it, naming a unit
    f32: str = r"(?!)"  # in-memory parameter names the writer keeps in F32 (regex)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)  # more configs to audit
    # (config.json, layer index) -> that layer's layout, where layers differ (a MoE schedule's
    # dense layers); None: ``layer`` for every layer
    layer_at: Callable[[Mapping[str, Any], int], dict[str, Rule]] | None = None

    @property
    def id(self) -> str:
        return self.model

    def layout(self, config: Mapping[str, Any], index: int) -> dict[str, Rule]:
        """Layer ``index``'s reference layout."""
        return self.layer if self.layer_at is None else self.layer_at(config, index)
