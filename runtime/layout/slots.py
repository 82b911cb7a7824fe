"""Where every checkpoint tensor belongs: decoder or MTP layer, slot and block, the model-level
tensors, the declared-unbound ones — from names alone, cross-checked against config.json.

Invariants:
- each slot of a layer is filled by the first of its blocks whose markers are all present;
  a block with a prefix claims every name under it (so an unknown ``self_attn.*`` name is the
  block's to refuse), a block without one claims only the names it declares;
- every name of a layer belongs to exactly one filled slot; every name outside the layers is a
  model-level tensor, under a declared-unbound prefix, or a problem; nothing is dropped;
- a per-layer config list (``layer_types``, ``mlp_layer_types``, ``indexer_types``) and the
  layer counts (``num_hidden_layers`` plus the MTP layers) must agree with what the names say;
  MTP layers config.json counts but the file lacks (transformers saves none) are one problem
  naming the option that binds the decoder alone (``mtp=False``, ``--no-mtp``); with it, the
  MTP layers config.json counts are set aside unread (``Layout.mtp_skipped``), never bound;
- the layout reports problems, it does not raise for them: ``audit`` lists them all, ``bind``
  refuses the first before reading a byte (only a config.json count that is not a plausible
  whole number is refused outright: nothing can be laid out against it).
- the layer prefix is found from the names (one of the model's allowed prefixes); names of two
  different prefixes in one checkpoint are refused as ambiguous; a layer index follows the digit
  rule of ``core.patterns`` (``layers.07.`` or ``layers.٣.`` is no layer: its names stay
  outside, where the layout refuses them as unclaimed).
Trap: a config list is a cross-check, never a substitute: a layer is what its names are.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from functools import lru_cache
from typing import Any

from specbind.core.errors import CheckpointError
from specbind.core.patterns import INDEX, Matcher, layer_pattern, parts
from specbind.core.record import field, record, replace
from specbind.core.schedule import ConfigSchedule, slot_problems
from specbind.runtime.binder.checks import Stored, family_matcher, stored
from specbind.runtime.binder.tables import BlockEntry, ModelTable
from specbind.runtime.io.source import RawTensor, TensorSource
from specbind.runtime.layout.config import (
    check_requires,
    config_count,
    config_lookup,
    expected_groups,
)


@record(frozen=False)
class LayerSplit:
    prefix: str
    layers: dict[int, list[str]] = field(default_factory=dict)  # index -> layer-relative names
    outside: list[str] = field(default_factory=list)

    def full_name(self, table: ModelTable[Any], index: int, rel: str) -> str:
        return layer_pattern(table.layer_pattern, self.prefix).format(index) + rel


# per prefix: the position of each name under it and its split (full prefix, index, rest)
Hits = dict[str, list[tuple[int, tuple[str, int, str]]]]


def split_layers(table: ModelTable[Any], names: list[str]) -> LayerSplit:
    starts, rx = _layer_regex(table.layer_pattern, table.layer_prefixes)
    if rx is None:
        return _split_each(table, names)
    hits: Hits = {p: [] for p in starts.values()}
    for i, n in enumerate(names):
        m = rx.fullmatch(n)
        if m is not None:
            start, index, tail, rest = m.groups()
            hits[starts[start]].append((i, (start + index + tail, int(index), rest)))
    return _split_from(table, names, hits)


def _split_each(table: ModelTable[Any], names: list[str]) -> LayerSplit:
    """``split_layers`` when one name could match two prefixes: each prefix tried on its own."""
    matchers = {p: layer_pattern(table.layer_pattern, p) for p in table.layer_prefixes}
    hits: Hits = {p: [] for p in matchers}
    for i, n in enumerate(names):
        for p, lp in matchers.items():
            hit = lp.split(n)
            if hit is not None:
                hits[p].append((i, hit))
    return _split_from(table, names, hits)


def _split_from(
    table: ModelTable[Any],
    names: list[str],
    hits: Hits,
) -> LayerSplit:
    """The split under the one prefix the names use (``hits``: per prefix, each name's position
    and its layer split); names under two prefixes are refused as ambiguous."""
    used = [p for p, h in hits.items() if h]
    if len(used) > 1:
        shown = ", ".join(repr(p + table.layer_pattern) for p in used)
        raise CheckpointError(f"layer names use more than one prefix ({shown}); refusing to guess")
    prefix = used[0] if used else table.layer_prefixes[0]
    split = LayerSplit(prefix)
    taken = set()
    for i, hit in hits[prefix]:
        taken.add(i)
        split.layers.setdefault(hit[1], []).append(hit[2])
    split.outside = [n for i, n in enumerate(names) if i not in taken]
    split.layers = dict(sorted(split.layers.items()))
    return split


@lru_cache(maxsize=64)
def _layer_regex(
    pattern: str, prefixes: tuple[str, ...]
) -> tuple[dict[str, str], re.Pattern[str] | None]:
    """One regex for every prefix's layer names, as ``core.patterns.LayerPattern`` reads each
    (groups: the prefix and literal head, the index, the literal tail, the rest), and which
    prefix each head belongs to. It is exact only when no name can match two prefixes: when no
    prefix's head starts another's; otherwise None (each prefix is then tried on its own).
    One regex per name instead of one per (name, prefix): a third of the whole-model pass."""
    head, _, tail = parts(pattern)
    starts = {p + head: p for p in prefixes}
    if len(starts) != len(prefixes) or any(
        a != b and b.startswith(a) for a in starts for b in starts
    ):
        return starts, None
    alts = "|".join(re.escape(s) for s in sorted(starts, key=len, reverse=True))
    return starts, re.compile(f"({alts})({INDEX})({re.escape(tail)})(.+)", re.DOTALL)


class LayerSource:
    """One decoder layer of a checkpoint, by layer-relative name."""

    def __init__(self, ckpt: TensorSource, full_prefix: str, names: list[str]) -> None:
        self._ckpt = ckpt
        self._prefix = full_prefix
        self._names = list(names)

    def names(self) -> list[str]:
        return list(self._names)

    def get(self, name: str) -> RawTensor | None:
        return self._ckpt.get(self._prefix + name)

    def stored(self, name: str) -> Stored:
        """As ``NamedView.stored``, for a layer-relative name: the full stored name, the
        specs' name it is read as layer-relative."""
        got = stored(self._ckpt, self._prefix + name)
        return got if got.read_as is None else replace(got, read_as=name)


@record(frozen=False)
class SlotFill:
    slot: str
    block: BlockEntry[Any] | None  # None: no block of the slot matches
    names: list[str] = field(default_factory=list)  # layer-relative names it claims
    missing: list[str] = field(default_factory=list)  # the nearest block's absent markers
    nearest: str = ""


@record(frozen=False)
class LayerLayout:
    index: int
    role: str  # "decoder" | "mtp"
    slots: dict[str, SlotFill] = field(default_factory=dict)
    unclaimed: list[str] = field(default_factory=list)


@record(frozen=False)
class Layout:
    split: LayerSplit
    layers: dict[int, LayerLayout]
    globals: dict[str, str]  # the globals block's relative name -> full checkpoint name
    unbound: dict[str, list[str]]  # declared prefix -> the names under it
    unclaimed: list[str]  # outside the layers, neither global nor declared unbound
    problems: list[str]  # one line each, "layer N: ..." or "model: ..."
    mtp_skipped: dict[int, list[str]] = field(default_factory=dict)  # set aside (mtp=False)


def claimed(
    block: BlockEntry[Any], names: Collection[str], suffixes: Collection[str] = ()
) -> list[str]:
    """The layer-relative names ``block`` owns, sorted (see the module invariants); a block
    without a prefix also owns its linear weights' quantization companions (``suffixes``: every
    scheme's companion suffixes), which its binder then checks against the config."""
    prefix = block.prefix
    if prefix:
        return sorted(n for n in names if n.startswith(prefix))
    named, families, heads = _owner_rules(block, frozenset(suffixes))
    given = names if isinstance(names, (set, frozenset)) else frozenset(names)
    owned = given & named  # declared names and companions: one set operation
    if heads:
        owned |= {n for n in given if n.startswith(heads) and families.match(n) is not None}
    return sorted(owned)


@lru_cache(maxsize=256)
def _owner_rules(
    block: BlockEntry[Any], suffixes: frozenset[str]
) -> tuple[frozenset[str], Matcher, tuple[str, ...]]:
    """What ``claimed`` tests a name against, built once per block rather than once per layer:
    every name it owns outright (its declared names and each linear weight's companions,
    ``module.suffix``), its families' matcher and their literal heads (a member starts with its
    pattern's head, so a plain ``startswith`` rules out most names before the regex)."""
    named = {r.name for r in block.tensors}
    for r in block.tensors:
        if r.linear and r.name.endswith(".weight"):
            module = r.name[: -len(".weight")]
            named |= {f"{module}.{s}" for s in suffixes}
    fams = tuple(r.name for r in block.tensors if r.family is not None)
    return frozenset(named), family_matcher(block.tensors), tuple(parts(f)[0] for f in fams)


def fill_slot(table: ModelTable[Any], slot: str, names: Collection[str]) -> SlotFill:
    rule = next(s for s in table.slots if s.name == slot)
    blocks = [table.block(b) for b in rule.blocks]
    suffixes = _suffixes(table)
    given = names if isinstance(names, (set, frozenset)) else frozenset(names)  # O(1) lookups
    for b in blocks:
        if b.matches(given):
            return SlotFill(slot, b, claimed(b, names, suffixes))
    best = max(blocks, key=lambda b: sum(1 for r in b.tensors if r.name in given))
    missing = sorted(m for m in best.markers if m not in given)
    return SlotFill(slot, None, [], missing, best.name)


def declaring(
    table: ModelTable[Any], slot: str, names: Collection[str], unknown: Collection[str]
) -> tuple[BlockEntry[Any], list[str]] | None:
    """Another block of ``slot`` that declares every one of ``unknown`` (layer-relative names
    the block that filled the slot refused as unrecognised), and its markers the layer lacks:
    a layer that lost one tensor of a variant (StableLM's ``q_proj.bias``) is filled by the
    plainer block, which then refuses the variant's other tensors. Asked only on a refusal."""
    rule = next(s for s in table.slots if s.name == slot)
    for b in (table.block(x) for x in rule.blocks):
        named, families, _ = _owner_rules(b, frozenset())
        if all(u in named or families.match(u) is not None for u in unknown):
            missing = sorted(m for m in b.markers if m not in names)
            if missing:
                return b, missing
    return None


@lru_cache(maxsize=64)
def _suffixes(table: ModelTable[Any]) -> frozenset[str]:
    """Every scheme's companion suffixes (``weight_scale``, ...), once per table."""
    return frozenset(c.suffix for s in table.schemes for c in s.companions)


def layout(
    table: ModelTable[Any],
    names: list[str],
    config: Mapping[str, Any],
    mtp: bool = True,
    stored: Callable[[str], str] = str,
) -> Layout:
    """Where every name belongs; ``mtp=False`` binds the decoder alone: the MTP layers
    config.json counts are neither required nor bound (those present are set aside unread).
    ``stored``: a full name's stored name (present or absent, ``NamedView.stored``): every
    tensor a problem names is named so, in full."""
    split = split_layers(table, names)
    problems: list[str] = []
    try:  # a config value the spec cannot say is the cause: said before any name it explains
        check_requires(table, config)
    except CheckpointError as e:
        problems.append(f"model: {e}")
    n_layers = config_count(config, table.layer_count)
    n_mtp = config_count(config, table.mtp_count) or 0
    skipped: dict[int, list[str]] = {}
    if n_layers is not None and not mtp:
        skipped = {i: ns for i, ns in split.layers.items() if n_layers <= i < n_layers + n_mtp}
        split.layers = {i: ns for i, ns in split.layers.items() if i not in skipped}
        n_mtp = 0
    if n_layers is not None:
        want = set(range(n_layers + n_mtp))
        have = set(split.layers)
        told = f"config.json {table.layer_count} is {n_layers}" + (
            f" plus {n_mtp} MTP layer(s) ({table.mtp_count})" if n_mtp else ""
        )
        absent_mtp = sorted(i for i in want - have if i >= n_layers)
        if absent_mtp and not any(i >= n_layers for i in have):
            problems.append(
                f"layer {absent_mtp[0]}: config.json {table.mtp_count} is {n_mtp}, but the "
                f"checkpoint has no MTP layer (no layer {_span(absent_mtp)} after the "
                f"{n_layers} decoder layers; transformers does not save them): bind the "
                "decoder alone with --no-mtp (BindOptions(mtp=False))"
            )
            want -= set(absent_mtp)
        for i in sorted(want - have):
            problems.append(f"layer {i}: {told}, but the checkpoint has no layer {i}")
        for i in sorted(have - want):
            mtp_hint = (
                f" (an MTP layer? config.json {table.mtp_count} counts none)"
                if table.mtp_count is not None and mtp and n_mtp == 0 and i == n_layers
                else ""
            )
            problems.append(
                f"layer {i}: {told}, so there is no layer {i}, but the checkpoint has one"
                + mtp_hint
            )
    cs = ConfigSchedule(table.slots, lambda name: config_lookup(config, name))
    problems += cs.problems
    layers: dict[int, LayerLayout] = {}
    for index, lnames in split.layers.items():
        role = "mtp" if n_layers is not None and index >= n_layers else "decoder"
        lay = LayerLayout(index, role)
        owner: dict[str, str] = {}
        given = frozenset(lnames)
        head = split.full_name(table, index, "")

        def named(rel: list[str], head: str = head) -> list[str]:
            """Layer-relative names as stored, in full, each once."""
            return list(dict.fromkeys(stored(head + n) for n in rel))

        for rule in table.slot_blocks(role):
            fill = fill_slot(table, rule.name, given)
            lay.slots[rule.name] = fill
            if fill.block is None:
                problems.append(
                    f"layer {index}: no {rule.name} block of {table.name} matches its names; "
                    f"nearest is {fill.nearest}, missing {named(fill.missing)}"
                )
                continue
            for n in fill.names:
                if n in owner:
                    problems.append(
                        f"layer {index}: {stored(head + n)} is claimed by slots {owner[n]} and "
                        f"{rule.name}"
                    )
                owner[n] = rule.name
            found = slot_problems(cs, rule, index, fill.block.name, role == "decoder")
            problems += _with_tensors(table, fill, rule.name, found, named)
            problems += _group_check(table, config, index, fill, named)
        lay.unclaimed = sorted(n for n in lnames if n not in owner)
        if lay.unclaimed and all(f.block is not None for f in lay.slots.values()):
            shown = _shown(named(lay.unclaimed))
            problems.append(
                f"layer {index}: {len(lay.unclaimed)} tensor(s) belong to no slot of a {role} "
                f"layer ({', '.join(lay.slots)}): {shown} — refusing to skip them"
            )
        layers[index] = lay
    glob, unbound, unclaimed = _outside(table, split)
    if table.globals is not None and not glob:
        gb = table.block(table.globals)
        needs = sorted(stored(global_full(gb, split.prefix, m)) for m in gb.markers)
        problems.append(
            f"model: none of the model-level tensors of {table.globals} is present "
            f"(it needs {needs} under {split.prefix!r})"
        )
    if unclaimed:
        problems.append(
            f"model: {len(unclaimed)} tensor(s) outside the layers are neither model-level "
            f"tensors nor declared unbound: {_shown([stored(n) for n in unclaimed])} — refusing "
            "to skip them"
        )
    return Layout(split, layers, glob, unbound, unclaimed, problems, skipped)


def _with_tensors(
    table: ModelTable[Any],
    fill: SlotFill,
    slot: str,
    found: list[tuple[str, str | None]],
    named: Callable[[list[str]], list[str]],
) -> list[str]:
    """``found`` (``core.schedule.slot_problems``: where config.json's lists or schedule give
    the slot another block than its tensors do, with that block), each line with the tensors
    that decide it, as stored, where the two blocks are variants of one (the layer holds most
    of the named block's markers: StableLM's gqa and gqa_bias, not a KDA layer where
    config.json says DSA): those the block config.json names needs and the layer lacks, else
    those the layer carries that it does not hold. Asked only when there is a problem."""
    names = set(fill.names)
    out = []
    for line, want in found:  # ``want`` is never the block the layer holds (slot_problems)
        block = table.block(want) if want is not None else None
        lacking = sorted(m for m in block.markers if m not in names) if block else []
        # a variant of the named block (it holds most of its markers), not another kind of
        # layer altogether, whose block names say it
        if block is not None and 2 * len(lacking) < len(block.markers):
            if lacking:
                line += f" (a {want} {slot} needs {_shown(named(lacking))}, absent)"
            else:
                declared, families, _ = _owner_rules(block, frozenset())
                extra = [n for n in sorted(names) if n not in declared and not families.match(n)]
                if extra:
                    line += f" (the layer carries {_shown(named(extra))}, which a {want} lacks)"
        out.append(line)
    return out


def _span(indices: list[int]) -> str:
    return str(indices[0]) if len(indices) == 1 else f"{indices[0]}..{indices[-1]}"


def _shown(names: list[str], most: int = 12) -> str:
    return str(names if len(names) <= most else [*names[:most], f"... {len(names) - most} more"])


def _group_check(
    table: ModelTable[Any],
    config: Mapping[str, Any],
    index: int,
    fill: SlotFill,
    named: Callable[[list[str]], list[str]],
) -> list[str]:
    """Where the model's group rules (``required``, a per-layer list, a config flag) say a
    group the layer's block has must be present or absent, and the layer disagrees
    (``named``: layer-relative names as the checkpoint stores them)."""
    assert fill.block is not None
    out: list[str] = []
    names = set(fill.names)
    mine = {t.group for t in fill.block.tensors if t.group is not None}
    if not mine & {r.group for r in table.layer_groups}:
        return out  # this block has no group a per-layer list speaks about
    try:
        expected = expected_groups(table, config, index)
    except CheckpointError as e:
        return [*out, f"layer {index}: {e}"]
    for group, (must, why) in expected.items():
        members = [t.name for t in fill.block.tensors if t.group == group]
        if not members:
            continue
        has = any(m in names for m in members)
        if must and not has:
            out.append(
                f"layer {index}: {why}, but the layer has no {group} tensors "
                f"(missing {_shown(named(members))})"
            )
        if has and not must:
            held = named([m for m in members if m in names])
            out.append(f"layer {index}: {why}, but the layer carries {group} tensors ({held})")
    return out


def _outside(
    table: ModelTable[Any], split: LayerSplit
) -> tuple[dict[str, str], dict[str, list[str]], list[str]]:
    """Sort the names outside the layers into model-level tensors, declared-unbound, the rest."""
    glob: dict[str, str] = {}
    block = table.block(table.globals) if table.globals else None
    unbound: dict[str, list[str]] = {u.prefix: [] for u in table.unbound}
    rest: list[str] = []
    for n in split.outside:
        rel = _global_name(block, split.prefix, n)
        if rel is not None and rel not in glob:
            glob[rel] = n
            continue
        under = next((u.prefix for u in table.unbound if n.startswith(u.prefix)), None)
        if under is not None:
            unbound[under].append(n)
        else:
            rest.append(n)
    return glob, unbound, sorted(rest)


def global_full(block: BlockEntry[Any] | None, prefix: str, name: str) -> str:
    """The full name the globals block's tensor ``name`` has in a checkpoint whose layers sit
    under ``prefix``: at the root where the block says so (``lm_head.weight``), else under
    the prefix. ``_global_name`` read backwards: what a refusal names for an absent one."""
    root = block is not None and any(r.root and r.name == name for r in block.tensors)
    return name if root else prefix + name


def _global_name(block: BlockEntry[Any] | None, prefix: str, full: str) -> str | None:
    """The globals block's name for a full checkpoint name, or None if it declares none."""
    if block is None:
        return None
    for r in block.tensors:
        if r.root and full == r.name:
            return r.name
        if not r.root and full == prefix + r.name:
            return r.name
    return None
