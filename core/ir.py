"""The spec IR: one set of rule classes that the generator parses YAML into, the generated
tables instantiate, and the runtime binds with.

Invariants:
- every ``kind`` is a ``Literal``; a rule never carries free-form strings where a closed set
  of values is meant;
- shapes and checks are carried as the spec's own text (for messages and comments); the
  generator evaluates them, the generated code holds them as Python expressions;
- a tensor name may hold one family placeholder ``{e}``; ``concrete`` fills it in (by the
  digit rule of ``core.patterns``), so a rule for 288 experts is one row, not 288;
- a ``stacked`` tensor holds a whole family in one stored tensor, the family on axis 0 (gpt-oss
  ``experts.gate_up_proj [E, X, 2I]``): it has no placeholder and is never ``concrete``d.
Trap: ``ShardRule.axis`` is the axis as written (``cols`` is ``-1``); resolve it against the
tensor's rank with ``ShardRule.resolved`` before indexing a shape.
"""

from __future__ import annotations

from typing import Literal

from specbind.core.algebra import Expr
from specbind.core.patterns import fill
from specbind.core.record import field, record

ShardKind = Literal["replicated", "rows", "cols", "axis"]
FieldKind = Literal["verbatim", "concat", "transform", "stack", "tie"]
LayerRole = Literal["decoder", "mtp"]
SlotScope = Literal["all", "decoder", "mtp"]


@record
class ShardRule:
    """How one tensor splits across tensor-parallel ranks: whole ``unit``s along ``axis``."""

    kind: ShardKind
    unit: str | None = None
    axis: int = 0  # rows: 0; cols: -1; axis: as declared
    # why ``unit`` is never replicated (a tp past its count is refused); None: it replicates
    never_replicated: str | None = None
    # a tp that does not divide ``unit`` pads it to a multiple of ``pad`` and splits that
    # (``core.vocab_pad``: vLLM's VocabParallelEmbedding); None: such a tp is refused
    pad: int | None = None

    def resolved(self, rank: int) -> int:
        return self.axis % rank if rank else 0


@record
class TieRule:
    """``config`` true: the tensor is bound from ``to`` and a stored copy is refused."""

    to: str
    config: str


@record
class TensorRule:
    name: str  # relative to the layer (or, for globals, to the text model); may hold `{f}`
    dtype: str  # the dtype that is bound
    shape: str  # the symbolic shape as written in the spec, for messages
    shard: ShardRule
    group: str | None = None
    why_dtype: str | None = None
    stored: tuple[str, ...] = ()  # other on-disk dtypes accepted, converted exactly to dtype
    family: str | None = None  # the family placeholder in ``name``
    root: bool = False  # named from the checkpoint root, not under the text model's prefix
    tie: TieRule | None = None
    linear: bool = False  # a linear weight [O, I] that a quantization scheme may replace
    # Also accepted on disk with extra size-1 axes ([1, 1, H, 1] for [H]): the same row-major
    # bytes, read as ``shape``; shards are planned on ``shape``.
    stored_singletons: bool = False
    # A stacked family: axis 0 of this one stored tensor is the family ``stacked`` (its count
    # symbol); ep rank r reads only its members' rows of axis 0, tp splits another axis.
    stacked: str | None = None
    # A stacked linear (``linear: {in, out}``): the axes of I and O in the stored tensor
    # (gpt-oss stores x @ W, [E, I, O]); a quantization scheme's companions are [E, O, ...].
    linear_axes: tuple[int, int] | None = None
    # The parsed shape, held by the generator only (generated tables leave it empty).
    dims: tuple[Expr, ...] = field(default=(), compare=False, repr=False)

    def concrete(self, index: int) -> TensorRule:
        """This rule for one member of its family (``experts.{e}.w`` -> ``experts.7.w``)."""
        assert self.family is not None
        return TensorRule(
            fill(self.name, index), self.dtype, self.shape, self.shard, self.group, self.why_dtype,
            self.stored, None, self.root, self.tie, self.linear, self.stored_singletons,
        )  # fmt: skip


@record
class FamilyRule:
    """An indexed family (``e`` in ``range(E)``), split whole across ep ranks (``experts``)."""

    name: str
    count: str  # the symbol holding the family's size
    shard: Literal["experts"]


@record
class FieldRule:
    kind: FieldKind
    dtype: str  # the bound field's dtype
    layout: ShardKind  # across tp ranks
    parts: int  # a concat of row shards holds one block per source
    axis: int = 0  # the axis ``layout`` splits, in the field's own shape
    family: str | None = None  # stacked over this rank's members of the family, on axis 0
    join: int = 0  # a concat or stack: the axis its sources are joined along


@record
class SharedScaleRule:
    """Linear weights whose quantization scale must be one value: their ``global`` weight
    scales within each member (q/k/v read by one fused GEMM), or their ``input`` scales across
    every member of the family ``across`` (the experts of a layer share one activation scale)."""

    tensors: tuple[str, ...]
    scale: Literal["global", "input"]
    across: str | None
    why: str


@record
class GroupRule:
    name: str
    optional: bool
    why: str


@record
class ConstraintRule:
    name: str
    check: str
    why: str
    expr: Expr | None = field(default=None, compare=False, repr=False)  # generator only


@record
class GeometryField:
    name: str
    config: str | None
    value: int
    min: int
    doc: str
    also: tuple[str, ...] = ()  # other config.json paths (dotted) of the same value
    default: str | None = None  # expression over other symbols when config.json lacks `config`
    expr: str | None = None  # always computed from other symbols (no config field)
    # a JSON null in config.json reads as the field absent (``default`` stands in), as the
    # family's transformers config class reads it (Mixtral's ``"head_dim": null``); else refused
    null_is_absent: bool = False
    # what a JSON null reads as where the class reads it otherwise than absent (ERNIE 4.5)
    null_default: str | None = None


ConditionKind = Literal["from", "below", "every", "in", "not_in"]
FlagValue = str | bool | int


@record
class LayerGroupRule:
    """An optional group's presence per layer: by a per-layer config list (``config``, the
    values meaning ``present`` / ``absent``), by one config value for every layer (``flag``:
    ``use_qk_norm``; true present, false absent unless ``present`` / ``absent`` say; a file
    without the field reads as ``missing`` if given, else is not cross-checked), or
    ``required`` in every layer of this model.
    Trap: a flag value matches by type and value (``1`` is not ``true``)."""

    group: str
    config: str = ""
    present: tuple[FlagValue, ...] = ()
    absent: tuple[FlagValue, ...] = ()
    required: bool = False
    flag: str = ""
    missing: bool | None = None  # flag only: whether a file without the field carries it


@record
class ConfigRequirement:
    """A config.json field that decides a parameter's shape or presence in the family's
    transformers and vLLM classes, whose other values the spec cannot say (Falcon's
    ``multi_query``: false builds a KV head per query head): its value must be one of
    ``allowed``, matched by type and value (``1`` is not ``true``); a file without the field
    (or with null) reads as ``missing`` when given (transformers' default), else is not
    checked. ``why`` says what another value would build."""

    config: str
    allowed: tuple[FlagValue, ...]
    why: str
    missing: tuple[FlagValue, ...] = ()  # () or (the value absence means,)


@record
class ScheduleCondition:
    """One test of a decoder layer's index against a config.json field (``config``, dotted
    into nested objects), on ``n = index - offset`` (``offset`` a number, or the value of
    ``offset_config``): ``from`` n >= value (a dense-first count), ``below`` n < value,
    ``every`` n % value == 0 (a step or period), ``in`` / ``not_in`` n in the value's list.
    ``default``: the value a file without the field (or with null) is read as; None: such a
    file leaves the schedule undecided for that layer (not cross-checked)."""

    kind: ConditionKind
    config: str
    default: int | tuple[int, ...] | None = None
    offset: int = 0
    offset_config: str | None = None
    offset_default: int | None = None


@record
class ScheduleRule:
    """A slot's block in every decoder layer where all of ``when`` hold (none: every layer the
    earlier rules leave); a slot's rules are tried in order, the first that holds decides."""

    block: str
    when: tuple[ScheduleCondition, ...] = ()


@record
class LayerList:
    """A per-layer config.json list naming a slot's block (``values``: block -> the entries
    meaning it); a string is read one character per layer (NemotronH's
    ``hybrid_override_pattern``), a boolean is every layer's entry (StableLM's
    ``use_qkv_bias``: true the biased attention block, false the plain one).
    Trap: an entry matches by type and value (``1`` is not ``true``)."""

    config: str
    values: tuple[tuple[str, tuple[str | bool, ...]], ...]

    def block_for(self, value: object) -> str | None:
        for block, vals in self.values:
            if any(type(v) is type(value) and v == value for v in vals):
                return block
        return None


@record
class SlotRule:
    """One part of a layer (attention, mlp, norms, ...): the blocks that may fill it, tried in
    order, where it applies, and the per-layer config list that says which block it holds."""

    name: str
    blocks: tuple[str, ...]
    scope: SlotScope = "all"
    config: str | None = None  # e.g. layer_types
    values: tuple[tuple[str, tuple[str, ...]], ...] = ()  # block -> config values meaning it
    lists: tuple[LayerList, ...] = ()  # more per-layer lists (or strings) naming the block
    schedule: tuple[ScheduleRule, ...] = ()  # the block from config.json counts and periods

    def all_lists(self) -> tuple[LayerList, ...]:
        """``config`` / ``values`` and ``lists``, as one tuple of per-layer lists."""
        first = () if self.config is None else (LayerList(self.config, self.values),)
        return first + self.lists

    def block_for(self, value: object) -> str | None:
        for block, vals in self.values:
            if value in vals:
                return block
        return None


@record
class NameRule:
    """Another writer's layer-relative name (or, ``scope`` "model", model-level name):
    ``source`` (a prefix or whole name) read as ``to[0]``, or, with several ``to``, one stored
    tensor read as that many sections of ``axis``, in order: equal ones (``segments``), or
    ``sizes`` each (geometry expressions over the model's symbols). Rows (axis 0) are the
    default; ``-1`` is the last axis (Llama 4's stacked ``gate_up_proj [E, X, 2I]`` holds
    ``[gate | up]`` on it)."""

    source: str
    to: tuple[str, ...]
    why: str
    sizes: tuple[str, ...] = ()  # one row count per ``to``; empty: equal segments
    # "model": a model-level name (relative to the text model's prefix), one ``to``
    scope: Literal["layer", "model"] = "layer"
    # ``source`` is one stored [members, ...] tensor: member i read as each ``to`` with {e} = i
    unstack: bool = False
    axis: int = 0  # the axis the sections split, as written (negative: from the last)


@record
class UnboundRule:
    """Checkpoint names under ``prefix`` that this model declares it does not bind, and why."""

    prefix: str
    why: str


@record
class SynthList:
    """A per-layer config.json list of a synthetic checkpoint: ``head``, then ``pattern``
    repeated."""

    config: str
    head: tuple[str, ...]
    pattern: tuple[str, ...]

    def value(self, index: int) -> str:
        if index < len(self.head):
            return self.head[index]
        return self.pattern[(index - len(self.head)) % len(self.pattern)]


@record
class SynthRule:
    """What ``specbind synth`` writes for a model (from the model spec's ``synth`` section)."""

    tiny: tuple[tuple[str, int], ...]
    layers: int
    lists: tuple[SynthList, ...]
    mtp: tuple[tuple[str, str], ...]  # slot -> block of the MTP layers
    config_json: str  # extra config.json fields, as JSON text
    config_from: tuple[tuple[str, str], ...] = ()  # config.json field <- geometry symbol
    nested_json: str = "{}"  # top-level fields when the text fields nest under text_config
