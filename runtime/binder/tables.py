"""What runtime code needs to know about a generated model table: its blocks and its layout.

Invariants: a ``ModelTable`` is data the generator emitted (never built by hand outside tests);
each ``BlockEntry`` is one generated block module with its binder and the map from the model's
geometry to the block's, so every question about a block is one call into generated code.
config.json is read in ``runtime.layout.config``, not here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Generic, Protocol, TypeVar

from specbind.core.errors import DerivedError, GeometryError, SpecbindError
from specbind.core.ir import (
    ConfigRequirement,
    ConstraintRule,
    FieldRule,
    GeometryField,
    LayerGroupRule,
    NameRule,
    SlotRule,
    SynthRule,
    TensorRule,
    UnboundRule,
)
from specbind.core.planning import BlockPlan, Ranks, expand
from specbind.core.quant import SchemeRule
from specbind.core.record import field, record
from specbind.runtime.binder.backends import Backend
from specbind.runtime.binder.checks import Array, BindReport
from specbind.runtime.binder.quant import LayerQuant, quantize_rules
from specbind.runtime.binder.shapes import SHAPE_OPS, Shaped, planned
from specbind.runtime.io.source import TensorSource

G = TypeVar("G")


class Weights(Protocol):
    def arrays(self) -> dict[str, Array]: ...


def map_arrays(weights: Any, fn: Callable[[str, Any], Any]) -> Any:
    """``weights`` (a generated ``<Block>Weights``) with every array replaced by ``fn(field,
    array)``: each bound field, and each companion of a quantized field, by its name in
    ``arrays()``. An absent optional field stays absent."""
    from specbind.core.record import fields, is_record, replace
    from specbind.runtime.binder.quant import QuantFields

    if not is_record(weights) or isinstance(weights, type):
        return weights  # a streamed slot's weights: none kept
    changes: dict[str, Any] = {}
    for f in fields(weights):
        v = getattr(weights, f.name)
        if v is None:
            continue
        if isinstance(v, QuantFields):  # quantized fields' companions, by field name
            arrays = {k: fn(k, a) for k, a in v.arrays.items()}
            changes[f.name] = replace(v, arrays=arrays)
        else:
            changes[f.name] = fn(f.name, v)
    return replace(weights, **changes)


class Binder(Protocol):
    """A generated block module's ``bind_<block>``: this rank's weights and the report."""

    def __call__(
        self,
        g: Any,
        layer: int,
        source: TensorSource,
        tp_rank: int,
        backend: Backend,
        ep_rank: int,
        flags: Mapping[str, bool],
        quant: LayerQuant | None,
        into: Any = None,
        dtype: str = "BF16",
        /,
    ) -> tuple[Weights, BindReport]: ...


@record
class BlockEntry(Generic[G]):
    """One generated block as a model table uses it: the block's name, the block module that
    holds its binder (``bind_<name>``), and how the model's geometry becomes the block's
    (``geometry``). Every method takes the model's geometry and, where the answer depends on it,
    this process's ranks; each is one call into the generated module, so "go to definition"
    from here lands on generated code.
    The module is named, not held: it is imported the first time something asks for it, so a
    start that refuses before it reads a checkpoint, or binds a model that does not use a
    block, does not build that block's module (two records and its tables)."""

    name: str  # the block, as its module's BLOCK says (tests/test_tables checks they agree)
    module_name: str  # the generated block module (``specbind.generated.<block>``)
    geometry: Callable[[G, Ranks], Any]  # (model geometry, ranks) -> the block's Geometry
    # block symbol -> where the model's value comes from ("config.json num_attention_heads"):
    # a derived symbol that cannot be computed is refused naming the fields it read
    symbol_sources: tuple[tuple[str, str], ...] = ()
    # a tensor the model stores as a section of another (``names:``) -> the stored tensor
    stored_as: tuple[tuple[str, str], ...] = ()

    @contextmanager
    def _named(self) -> Iterator[None]:
        """A ``DerivedError`` of the block's code, with the config fields its symbols read."""
        try:
            yield
        except DerivedError as e:
            where = dict(self.symbol_sources)
            read = [f"{s} is {where[s]}" for s in e.symbols if s in where]
            stored = dict(self.stored_as)
            held = sorted({stored[t] for t in e.sizes if t in stored})
            text = str(e) + (f", stored as sections of {', '.join(held)}" if held else "")
            raise GeometryError(text + (f" ({'; '.join(read)})" if read else "")) from None

    @property
    def module(self) -> ModuleType:
        """The generated block module, imported on first use."""
        found = sys.modules.get(self.module_name)
        return found if found is not None else importlib.import_module(self.module_name)

    @property
    def binder(self) -> Binder:
        """The module's ``bind_<block>``."""
        binder: Binder = getattr(self.module, f"bind_{self.name}")
        return binder

    @property
    def prefix(self) -> str:
        return str(self.module.PREFIX)

    @property
    def tensors(self) -> tuple[TensorRule, ...]:
        """Family members as one pattern rule each."""
        rules: tuple[TensorRule, ...] = self.module.TENSORS
        return rules

    @property
    def markers(self) -> frozenset[str]:
        markers: frozenset[str] = self.module.MARKERS
        return markers

    @property
    def fields(self) -> dict[str, FieldRule]:
        fields: dict[str, FieldRule] = self.module.FIELDS
        return fields

    @property
    def sources(self) -> dict[str, tuple[str, ...]]:
        """Each bound field's checkpoint tensors (rule names), in order."""
        sources: dict[str, tuple[str, ...]] = self.module.SOURCES
        return sources

    @property
    def optional_groups(self) -> tuple[str, ...]:
        """The block's optional groups: tensors a checkpoint may leave out, all or none."""
        return tuple(sorted(n for n, g in self.module.GROUPS.items() if g.optional))

    def matches(self, names: Collection[str]) -> bool:
        """True when every marker of the block is among ``names`` (layer-relative)."""
        return bool(self.module.matches(names))

    def bind(
        self,
        g: G,
        ranks: Ranks,
        layer: int,
        source: TensorSource,
        backend: Backend,
        flags: Mapping[str, bool],
        quant: LayerQuant | None,
        into: Any = None,
        dtype: str = "BF16",
    ) -> tuple[Weights, BindReport]:
        """This rank's weights of one layer's slot, and the report. ``into``: an ``Arena``
        the ops write the fields they make into (the caller copies in the rest); ``dtype``:
        the half dtype the block's BF16 tensors bind in (``config.choose``)."""
        with self._named():
            return self.binder(
                self.geometry(g, ranks), layer, source, ranks.tp_rank, backend, ranks.ep_rank,
                flags, quant, into, dtype,
            )  # fmt: skip

    def shapes(self, g: G) -> dict[str, tuple[int, ...]]:
        """Full (unsharded) shapes, keyed by rule name."""
        with self._named():
            shapes: dict[str, tuple[int, ...]] = self.module.expected_shapes(
                self.geometry(g, Ranks())
            )
        return shapes

    def check(self, g: G, ranks: Ranks) -> None:
        """Refuse a geometry or rank layout that breaks one of the block's constraints."""
        with self._named():
            self.module.check_constraints(self.geometry(g, ranks))

    def plan(self, g: G, ranks: Ranks) -> BlockPlan:
        """Every tensor's local shape, offsets and bytes on this rank."""
        with self._named():
            plan: BlockPlan = self.module.plan(
                self.geometry(g, ranks), ranks.tp_rank, ranks.ep_rank
            )
        return plan

    def bound_shapes(
        self,
        g: G,
        ranks: Ranks,
        layer: int,
        quant: LayerQuant | None,
        absent: Collection[str] = (),
    ) -> dict[str, Shaped]:
        """Every field a bind of this rank holds, by name, with its shape and dtype: the
        generated ``assemble`` run on shapes alone (``runtime.binder.shapes``), so it is the
        binder's own result; ``absent`` names optional groups the checkpoint did not carry."""
        rules, plan = quantize_rules(self.name, self.tensors, self.plan(g, ranks), quant)
        group = {r.name: r.group or "" for r in rules}
        gone = frozenset(n for n, t in plan.tensors.items() if group.get(t.pattern, "") in absent)
        geo = self.geometry(g, ranks)
        with self._named():
            weights = self.module.assemble(geo, layer, planned(plan, gone), plan, SHAPE_OPS, quant)
        arrays: dict[str, Shaped] = weights.arrays()
        return arrays

    def counts(self, g: G) -> dict[str, int]:
        """Each family's size."""
        with self._named():
            counts: dict[str, int] = self.module.counts(self.geometry(g, Ranks()))
        return counts

    def names(self, g: G, groups: Collection[str] | None = None) -> list[str]:
        """Every tensor name the block declares, family members expanded (synth, plan); with
        ``groups``, the tensors of optional groups not listed there are left out."""
        rules = [r for r in self.tensors if groups is None or r.group is None or r.group in groups]
        whole = {f: range(n) for f, n in self.counts(g).items()}
        return [r.name for r in expand(rules, whole)[0]]


@record
class ModelTable(Generic[G]):
    name: str
    layer_pattern: str
    layer_prefixes: tuple[str, ...]
    geometry_fields: tuple[GeometryField, ...]
    make_geometry: Callable[[dict[str, int]], G]
    blocks: tuple[BlockEntry[G], ...]
    layer_groups: tuple[LayerGroupRule, ...] = ()
    slots: tuple[SlotRule, ...] = ()
    globals: str | None = None  # the block of model-level tensors (embedding, norm, head)
    unbound: tuple[UnboundRule, ...] = ()
    layer_count: str | None = None  # config.json field: decoder layers
    mtp_count: str | None = None  # config.json field: MTP layers after the decoder layers
    flags: tuple[str, ...] = ()  # config.json booleans the blocks read (a tie)
    synth: SynthRule | None = None  # what `specbind synth` writes for this model
    real_layers: int = 0  # the real model's decoder layers and MTP layers
    real_mtp: int = 0
    schemes: tuple[SchemeRule, ...] = ()  # the quantization schemes a checkpoint may use
    names: tuple[NameRule, ...] = ()  # other writers' layer-relative names (a name map)
    model_types: tuple[str, ...] = ()  # config.json model_type values of its checkpoints
    default: bool = False  # the model a command given neither --model nor a checkpoint uses
    constraints: tuple[ConstraintRule, ...] = ()  # over the geometry, this model's own
    check: Callable[[G], None] | None = None  # refuses a geometry that breaks one of them
    dtypes: tuple[str, ...] = ("BF16",)  # the half dtypes its checkpoints may be stored in
    requires: tuple[ConfigRequirement, ...] = ()  # config.json values the spec alone can say

    def default_values(self) -> dict[str, int]:
        return {f.name: f.value for f in self.geometry_fields}

    def block(self, name: str) -> BlockEntry[G]:
        for b in self.blocks:
            if b.name == name:
                return b
        raise KeyError(name)

    def slot_blocks(self, scope: str) -> list[SlotRule]:
        """The slots a layer of role ``scope`` ("decoder" or "mtp") is made of."""
        return [s for s in self.slots if s.scope in ("all", scope)]

    def padding(self, values: Mapping[str, int], ranks: Ranks) -> dict[str, list[int]]:
        """``{"<block>.<tensor>": [stored rows, padded rows]}`` for every tensor a bind at
        ``values`` and ``ranks`` pads: a block's ``padded:`` unit (the vocabulary) that tp does
        not divide, split as vLLM's VocabParallelEmbedding splits it (``core.vocab_pad``). What
        the bind and plan reports and a bound file's ``padding`` record; empty (no key written)
        where tp divides every padded unit. A block this geometry cannot split is left out:
        the bind refuses it where it is used."""
        geometry = self.make_geometry(dict(values))
        out: dict[str, list[int]] = {}
        for b in self.blocks:
            if not any(r.shard.pad is not None for r in b.tensors):
                continue
            try:
                plan = b.plan(geometry, ranks)
            except SpecbindError:
                continue
            for name, p in sorted(plan.tensors.items()):
                if p.padded:
                    out[f"{b.name}.{name}"] = [p.full_shape[p.axis], p.padded]
        return out


@record
class ModelEntry:
    """What the generated registry knows of a model without importing its table: the module
    that holds it, the config.json ``model_type`` values it claims, and whether it is the
    default (each as the table itself says: the generator writes both from one spec)."""

    module: str  # the generated module under ``package`` (``model_glm_5_3_flash``)
    model_types: tuple[str, ...]
    default: bool


class Registry(Mapping[str, "ModelTable[Any]"]):
    """The generated models by name (``specbind.generated.MODELS``), each table imported on
    first use: a process binding one model should not pay for the others (and a table's block
    modules are imported when first used, see ``BlockEntry``). Picking a model by name, by
    ``model_type`` or as the default reads ``entries`` only and imports nothing."""

    def __init__(self, package: str, entries: Mapping[str, ModelEntry]) -> None:
        self.package = package
        self.entries = dict(entries)
        self._tables: dict[str, ModelTable[Any]] = {}

    def __getitem__(self, name: str) -> ModelTable[Any]:
        table = self._tables.get(name)
        if table is None:
            entry = self.entries[name]  # KeyError for an unknown name, as a dict
            table = importlib.import_module(f"{self.package}.{entry.module}").TABLE
            self._tables[name] = table
        return table

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries


@record
class EngineTable(Generic[G]):
    """One engine's layout of one model (``generated/engines/``): a model table whose blocks bind
    the fields that engine reads, and the engine's parameter name of each field.

    ``parameters[block][field]`` is relative to ``layers`` (``{index}`` filled with the layer)
    for a layer block, and the full name for the model's globals block. ``skip_mtp``: why the
    engine's model holds no MTP layers (then they are not bound), or None."""

    engine: str
    table: ModelTable[G]
    layers: str
    parameters: Mapping[str, Mapping[str, str]]
    skip_mtp: str | None = None
    # block -> field -> (axis, multiple): a padded split (the variant binds the field whole;
    # each rank takes its share of the axis padded up to the multiple, zero past the stored)
    padding: Mapping[str, Mapping[str, tuple[int, int]]] = field(default_factory=dict)
    # block -> field -> (element-wise functions applied in order in F32, the engine's dtype)
    values: Mapping[str, Mapping[str, tuple[tuple[str, ...], str | None]]] = field(
        default_factory=dict
    )
    first_rank: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # rank 0 holds them
    constraints: tuple[tuple[str, str, str], ...] = ()  # (name, check, why) over geometry, tp
    file: str | None = None  # its spec, specs/engines/<engine>/<layout>.yaml
    architectures: tuple[str, ...] = ()  # the config.json architectures it serves
    proof: str | None = None  # the test proving it against the engine's own loader; None: none
    proof_tp: tuple[int, ...] = ()  # the tp sizes that test proves it at, every rank of each
    unproven: str | None = None  # why no test proves it: the engine's measured error line
    proof_except: tuple[str, ...] = ()  # blocks the proof cannot reach (a bound one: a warning)
    proof_except_why: str | None = None  # why, measured

    @property
    def model(self) -> str:
        return self.table.name
