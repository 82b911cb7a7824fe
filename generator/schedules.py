"""A model spec's layer schedules and config-flag groups: parsed, checked, and proven against
the spec's own synthetic config.

Invariants (each refusal is a ``SpecError`` naming file, path and line):
- a slot's ``lists`` and ``schedule`` name only blocks of that slot, a list field once;
- a schedule's rules are tried in order and only the last is unconditional, so every decoder
  layer gets exactly one block and no rule is unreachable;
- a condition's ``default`` has its kind's type (a count, a step of at least 1, or a list of
  layer indices); an ``offset_default`` goes with an ``offset`` field, never a number;
- a flag group's ``present`` and ``absent`` share no value (by type: ``1`` is not ``true``);
- with a ``synth`` section, the schedule read over the synthetic config.json (its ``config``
  and ``lists``) agrees with the blocks the synthetic lists give every synthetic layer, so
  ``specbind synth`` never writes a checkpoint its own model refuses.
"""

from __future__ import annotations

import json
from typing import Any

from specbind.core.ir import (
    ConditionKind,
    LayerGroupRule,
    LayerList,
    ScheduleCondition,
    ScheduleRule,
    SlotRule,
    SynthRule,
)
from specbind.core.schedule import ConfigSchedule
from specbind.generator.yamlio import Located, PathKey

_KINDS: tuple[ConditionKind, ...] = ("from", "below", "every", "in", "not_in")


def slot_lists(
    doc: Located, path: PathKey, raw: dict[str, Any], blocks: tuple[str, ...]
) -> tuple[LayerList, ...]:
    """A slot's ``lists``: field -> block -> the entries meaning it."""
    out = []
    for cfg, values in (raw.get("lists") or {}).items():
        where: PathKey = (*path, "lists", cfg)
        if cfg == raw.get("config"):
            raise doc.error(where, f"{cfg} is already the slot's `config` list")
        seen: dict[str, str] = {}
        for b, vals in values.items():
            if b not in blocks:
                raise doc.error((*where, b), f"{b!r} is not a block of this slot")
            for v in vals:
                if v in seen:
                    raise doc.error((*where, b), f"{v!r} already means {seen[v]}")
                seen[v] = b
        out.append(LayerList(cfg, tuple((b, tuple(v)) for b, v in values.items())))
    return tuple(out)


def slot_schedule(
    doc: Located, path: PathKey, raw: list[dict[str, Any]] | None, blocks: tuple[str, ...]
) -> tuple[ScheduleRule, ...]:
    """A slot's ``schedule``: ordered rules, the last without conditions."""
    out = []
    rules = raw or []
    for i, r in enumerate(rules):
        where: PathKey = (*path, "schedule", i)
        if r["block"] not in blocks:
            raise doc.error((*where, "block"), f"{r['block']!r} is not a block of this slot")
        last = i == len(rules) - 1
        if last and "when" in r:
            raise doc.error(
                (*where, "when"),
                "the last rule takes no `when`: it is the block every other layer holds",
            )
        if not last and "when" not in r:
            raise doc.error(
                (*where, "block"),
                "only the last rule may go without `when` (the rest would never be reached)",
            )
        conds = enumerate(r.get("when") or ())
        when = tuple(_condition(doc, (*where, "when", k), c) for k, c in conds)
        out.append(ScheduleRule(r["block"], when))
    return tuple(out)


def _condition(doc: Located, path: PathKey, raw: dict[str, Any]) -> ScheduleCondition:
    kind = next(k for k in _KINDS if k in raw)
    default = raw.get("default")
    if default is not None:
        listed = isinstance(default, list)
        if listed != (kind in ("in", "not_in")):
            want = "a list of layer indices" if kind in ("in", "not_in") else "a whole number"
            raise doc.error((*path, "default"), f"`{kind}` reads {want}; default {default!r}")
        if kind == "every" and default < 1:
            raise doc.error((*path, "default"), "a step of 0 layers: `every` needs 1 or more")
    offset = raw.get("offset", 0)
    offset_config = offset if isinstance(offset, str) else None
    if "offset_default" in raw and offset_config is None:
        raise doc.error((*path, "offset_default"), "`offset_default` needs an `offset` field")
    return ScheduleCondition(
        kind,
        raw[kind],
        tuple(default) if isinstance(default, list) else default,
        0 if offset_config is not None else int(offset),
        offset_config,
        raw.get("offset_default"),
    )


def flag_group(doc: Located, path: PathKey, group: str, raw: dict[str, Any]) -> LayerGroupRule:
    """A group that follows one config.json value (``use_qk_norm``) in every layer."""
    present = tuple(raw.get("present") or ())
    absent = tuple(raw.get("absent") or ())
    for v in present:
        if any(type(a) is type(v) and a == v for a in absent):
            raise doc.error(path, f"{v!r} cannot mean both present and absent")
    missing = raw.get("missing")
    return LayerGroupRule(
        group,
        present=present,
        absent=absent,
        flag=raw["flag"],
        missing=None if missing is None else missing == "present",
    )


def check_synth(doc: Located, slots: tuple[SlotRule, ...], synth: SynthRule | None) -> None:
    """Every synthetic layer's block by the synthetic lists agrees with the schedule read over
    the synthetic config.json; a list's entry names a block of its slot."""
    if synth is None:
        return
    config: dict[str, Any] = json.loads(synth.config_json)
    lists = {sl.config: sl for sl in synth.lists}
    for sl in synth.lists:
        config[sl.config] = [sl.value(i) for i in range(synth.layers)]

    def lookup(name: str) -> tuple[Any, str] | None:
        node: Any = config
        for key in name.split("."):
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node, name

    cs = ConfigSchedule(slots, lookup)
    if cs.problems:
        raise doc.error(("synth", "config"), cs.problems[0].removeprefix("model: "))
    for slot in slots:
        if not slot.schedule or slot.scope == "mtp":
            continue
        for i in range(synth.layers):
            listed = next(
                (
                    (lst.config, lst.block_for(lists[lst.config].value(i)))
                    for lst in slot.all_lists()
                    if lst.config in lists
                ),
                None,
            )
            got = cs.scheduled(slot.schedule, i)
            if got is None or listed is None or listed[1] == got[0]:
                continue
            raise doc.error(
                ("synth", "lists", listed[0]),
                f"synthetic layer {i}: {listed[0]} gives {slot.name} {listed[1]}, but the "
                f"schedule gives {got[0]} ({got[1]})",
            )
