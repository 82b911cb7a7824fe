"""What runtime code needs to know about a generated model table, and config.json geometry.

Invariants: a geometry symbol with a ``config`` field is read from config.json — under
``text_config`` when the file nests it, else flat — and must be an integer (not a bool, not a
float) no smaller than its ``min``; a symbol without one is an engine setting with a default.
Missing or ill-typed fields are refused by name; nothing falls back silently to a default.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from runtime.backends import Backend
from runtime.binding import Array, BindReport, FieldRule, TensorRule
from runtime.errors import CheckpointError, GeometryError
from runtime.source import TensorSource
from runtime.tp import BlockPlan

G = TypeVar("G")


class Weights(Protocol):
    def arrays(self) -> dict[str, Array]: ...


@dataclass(frozen=True)
class GeometryField:
    name: str
    config: str | None
    value: int
    min: int
    doc: str


@dataclass(frozen=True)
class LayerGroupRule:
    group: str
    config: str
    present: tuple[str, ...]
    absent: tuple[str, ...]


@dataclass(frozen=True)
class BlockEntry(Generic[G]):
    name: str
    prefix: str
    tensors: tuple[TensorRule, ...]
    markers: frozenset[str]
    matches: Callable[[Collection[str]], bool]
    # (g, tp, rank, layer, source, backend) -> this rank's weights and the layer's report
    bind: Callable[[G, int, int, int, TensorSource, Backend], tuple[Weights, BindReport]]
    fields: dict[str, FieldRule]
    shapes: Callable[[G, int], dict[str, tuple[int, ...]]]  # full shapes at (g, tp)
    check: Callable[[G, int], None]  # constraints at (g, tp)
    plan: Callable[[G, int, int], BlockPlan]  # (g, tp, rank)


@dataclass(frozen=True)
class ModelTable(Generic[G]):
    name: str
    layer_pattern: str
    layer_prefixes: tuple[str, ...]
    geometry_fields: tuple[GeometryField, ...]
    make_geometry: Callable[[dict[str, int]], G]
    blocks: tuple[BlockEntry[G], ...]
    layer_groups: tuple[LayerGroupRule, ...] = ()

    def default_values(self) -> dict[str, int]:
        return {f.name: f.value for f in self.geometry_fields}

    def block(self, name: str) -> BlockEntry[G]:
        for b in self.blocks:
            if b.name == name:
                return b
        raise KeyError(name)


def values_from_config(
    table: ModelTable[Any], config: Mapping[str, Any], overrides: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Geometry values from a parsed config.json (HF field names), plus engine settings."""
    values: dict[str, int] = {}
    for f in table.geometry_fields:
        if f.config is None:
            values[f.name] = f.value
            continue
        found = config_lookup(config, f.config)
        if found is None:
            raise CheckpointError(
                f"config.json: missing field {f.config!r} (flat or under text_config), "
                f"needed for geometry symbol {f.name}"
            )
        raw, where = found
        if type(raw) is not int:
            raise CheckpointError(
                f"config.json: {where} is {raw!r} ({type(raw).__name__}), expected an integer"
            )
        values[f.name] = raw
    return checked_values(table, values, overrides or {})


def config_lookup(config: Mapping[str, Any], name: str) -> tuple[Any, str] | None:
    """(value, where) of a config.json field: under ``text_config`` when the file nests it
    there, else flat; None when it is in neither."""
    nested = config.get("text_config")
    if nested is not None and not isinstance(nested, dict):
        raise CheckpointError(f"config.json: text_config is {type(nested).__name__}, not an object")
    if nested is not None and name in nested:
        return nested[name], f"text_config.{name}"
    if name in config:
        return config[name], name
    return None


def expected_groups(
    table: ModelTable[Any], config: Mapping[str, Any], layer: int
) -> dict[str, tuple[bool, str]]:
    """For each layer-group rule that covers ``layer``: (must be present, why)."""
    out: dict[str, tuple[bool, str]] = {}
    for rule in table.layer_groups:
        found = config_lookup(config, rule.config)
        if found is None:
            continue  # the checkpoint does not say; nothing to cross-check
        values = found[0]
        if not isinstance(values, list):
            raise CheckpointError(
                f"config.json: {rule.config} is {type(values).__name__}, not a list"
            )
        if layer >= len(values):
            continue
        v = values[layer]
        if v not in rule.present and v not in rule.absent:
            known = ", ".join(map(repr, rule.present + rule.absent))
            raise CheckpointError(
                f"config.json: {rule.config}[{layer}] is {v!r}, expected one of {known}"
            )
        out[rule.group] = (v in rule.present, f"config.json {rule.config}[{layer}] is {v!r}")
    return out


def checked_values(
    table: ModelTable[Any], values: Mapping[str, int], overrides: Mapping[str, int]
) -> dict[str, int]:
    """``values`` with ``overrides`` applied; every name known, every value in range."""
    values = dict(values)
    for k, v in overrides.items():
        if k not in values:
            raise GeometryError(f"unknown geometry symbol {k!r} (known: {', '.join(values)})")
        values[k] = v
    for f in table.geometry_fields:
        if values[f.name] < f.min:
            raise GeometryError(
                f"geometry {f.name} = {values[f.name]} is below its minimum {f.min}"
            )
        if values[f.name] > 1 << 30:
            raise GeometryError(f"geometry {f.name} = {values[f.name]} is implausibly large")
    return values
