"""Which block each slot of a decoder layer holds by config.json, and whether the names agree:
per-layer lists (``layer_types``, ``mlp_layer_types``, a string such as NemotronH's
``hybrid_override_pattern``, one character per layer) and schedules (dense-first counts,
sparse steps, periods and offsets, explicit index lists: ``first_k_dense_replace``,
``decoder_sparse_step``, ``mlp_only_layers``, ``attn_layer_period``/``attn_layer_offset``).

Invariants:
- every field a schedule or list reads is read once per config (``ConfigSchedule``) and checked
  for its type there: a count, step or offset is a whole number (a step at least 1), an index
  list a list of whole numbers, a per-layer list a list or a string; a field of the wrong
  type is one ``model:`` problem naming it, and whatever reads it is left undecided;
- a field absent from config.json (or null) reads as the ``default`` its condition declares;
  without one, the schedule is undecided for the layer (not cross-checked), never guessed;
- every source of a schedule is read: where the file holds the slot's per-layer list, that
  list is the writer's schedule, and a count or step the file lacks is undecided, not its
  default (transformers 5.23's KimiLinearConfig writes ``mlp_layer_types`` and no
  ``first_k_dense_replace``, and builds its layers from the list before any count: the
  default 0 would contradict a list it wrote itself); a count the file does hold is still
  cross-checked beside the list;
- a per-layer list shorter than the decoder layers is a problem for each layer past its end
  (vLLM indexes it by layer); layers past the decoder layers (MTP) are never cross-checked;
- a disagreement is one line naming the layer, the config fields with their values, the block
  the config says and the block the layer's names say.
Trap: the names still decide what binds; the config is a cross-check, never a substitute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specbind.core.ir import LayerList, ScheduleCondition, ScheduleRule, SlotRule
from specbind.core.shown import shown

# a field's value once read: its checked value (None: absent or ill-typed) and where it is
Read = tuple[Any, str]
# a config.json field by (dotted) name: (value, where it was found) or None (runtime.layout.config)
Lookup = Callable[[str], "tuple[Any, str] | None"]
_BAD = object()  # an ill-typed field: reported once, never evaluated


def _whole(v: Any) -> bool:
    return type(v) is int


class ConfigSchedule:
    """The schedule and list fields of one config.json (``lookup``: a field by name), read
    and type-checked once; ``problems`` holds a line per ill-typed field."""

    def __init__(self, slots: tuple[SlotRule, ...], lookup: Lookup) -> None:
        self.problems: list[str] = []
        self._fields: dict[str, Read] = {}
        self._lists: dict[str, Read] = {}
        for slot in slots:
            for lst in slot.all_lists():
                self._read_list(lst.config, lookup)
            for rule in slot.schedule:
                for c in rule.when:
                    self._read_field(c.config, c.kind, lookup)
                    if c.offset_config is not None:
                        self._read_field(c.offset_config, "offset", lookup)

    def _read_list(self, name: str, lookup: Lookup) -> None:
        if name in self._lists:
            return
        found = lookup(name)
        if found is None or found[0] is None:
            self._lists[name] = (None, name)
            return
        value, where = found
        if not isinstance(value, (list, str, bool)):
            self.problems.append(
                f"model: config.json {where} is {type(value).__name__}, not a list (one entry "
                "per layer), a string (one character per layer) or a boolean (every layer's)"
            )
            value = _BAD
        self._lists[name] = (value, where)

    def _read_field(self, name: str, kind: str, lookup: Lookup) -> None:
        if name in self._fields:
            return
        found = lookup(name)
        if found is None or found[0] is None:
            self._fields[name] = (None, name)
            return
        value, where = found
        if kind in ("in", "not_in"):
            ok = isinstance(value, list) and all(_whole(v) for v in value)
            want = "a list of layer indices (whole numbers)"
        elif kind == "every":
            ok = _whole(value) and value >= 1
            want = "a whole number of at least 1 (a layer step)"
        elif kind == "offset":
            ok = _whole(value)
            want = "a whole number (a layer offset)"
        else:
            ok = _whole(value) and value >= 0
            want = "a whole number of layers"
        if not ok:
            self.problems.append(f"model: config.json {where} is {shown(value)}, expected {want}")
            value = _BAD
        self._fields[name] = (value, where)

    def _value(self, name: str, default: Any) -> tuple[Any, str] | None:
        """(value, the words that say it: ``x is 3``, ``x is absent, read as 3``) of a field,
        its default when absent; None when undecidable."""
        value, where = self._fields[name]
        if value is _BAD:
            return None
        if value is None:
            if default is None:
                return None
            shown = list(default) if isinstance(default, tuple) else default
            return shown, f"{where} is absent, read as {shown}"
        return value, f"{where} is {_short(value)}"

    def has_list(self, slot: SlotRule) -> bool:
        """Whether the file holds one of ``slot``'s per-layer lists (well-typed)."""
        return any(self._lists[lst.config][0] not in (None, _BAD) for lst in slot.all_lists())

    def _holds(
        self, c: ScheduleCondition, index: int, defaults: bool = True
    ) -> tuple[bool, str] | None:
        """Whether ``c`` holds at layer ``index``, and the words that say why; None when a
        field it reads is absent without a default (or ``defaults`` is false) or ill-typed."""
        got = self._value(c.config, c.default if defaults else None)
        if got is None:
            return None
        value, said = got
        offset = c.offset
        if c.offset_config is not None:
            off = self._value(c.offset_config, c.offset_default)
            if off is None:
                return None
            offset, off_said = off
            said += f" and {off_said}"
        n = index - offset
        n_text = f"layer {index}" if offset == 0 else f"{_signed(index, offset)} = {n}"
        if c.kind in ("from", "below"):
            holds = n >= value if c.kind == "from" else n < value
            sign = ">=" if n >= value else "<"
            return holds, f"{said} ({n_text} {sign} {value})"
        if c.kind == "every":
            holds = n % value == 0
            words = "is a multiple" if holds else "is not a multiple"
            return holds, f"{said} ({n_text} {words} of {value})"
        inside = n in value
        words = "is in it" if inside else "is not in it"
        return inside == (c.kind == "in"), f"{said} ({n_text} {words})"

    def scheduled(
        self, rules: tuple[ScheduleRule, ...], index: int, defaults: bool = True
    ) -> tuple[str, str] | None:
        """The block the schedule gives layer ``index`` and why (the deciding words), or None
        when undecidable here; ``defaults`` false: an absent field is undecided."""
        why: list[str] = []
        for rule in rules:
            verdicts = []
            for c in rule.when:
                v = self._holds(c, index, defaults)
                verdicts.append(v)
            # a rule is all of its conditions: one that fails decides it, whatever is unknown
            failed = next((v[1] for v in verdicts if v is not None and not v[0]), None)
            if failed is None and None in verdicts:
                return None
            if failed is None:
                return rule.block, "; ".join([*why, *(v[1] for v in verdicts if v is not None)])
            why.append(failed)
        return None  # the generator requires a last rule without conditions

    def listed(self, lst: LayerList, index: int) -> tuple[str | None, str, bool] | None:
        """(the block the list names, None if its entry names none; the entry's words; whether
        the list ends before the layer), or None when the file has no such list."""
        values, where = self._lists[lst.config]
        if values is None or values is _BAD:
            return None
        if isinstance(values, bool):  # one value for every layer (a flag)
            return lst.block_for(values), f"{where} is {str(values).lower()}", False
        if index >= len(values):
            kind = "characters" if isinstance(values, str) else "entries"
            return None, f"{where} has {len(values)} {kind}, none for layer {index}", True
        entry = values[index]
        return lst.block_for(entry), f"{where}[{index}] is {shown(entry)}", False


def _short(value: Any) -> str:
    """A field's value for a message: a long index list cut after 16 entries; anything longer
    than a line cut by ``shown``."""
    text = str([*value[:16], "..."]) if isinstance(value, list) and len(value) > 16 else str(value)
    return text if len(text) <= 200 else shown(value)


def _signed(index: int, offset: int) -> str:
    return f"layer {index} - {offset}" if offset > 0 else f"layer {index} + {-offset}"


def slot_problems(
    cs: ConfigSchedule, slot: SlotRule, index: int, held: str, decoder: bool = True
) -> list[tuple[str, str | None]]:
    """Where config.json's lists and schedule for ``slot`` disagree with the block ``held``
    at layer ``index``: one (line, the block config.json names there, or None where it names
    none) each; an MTP layer (``decoder`` false) is checked only against a list entry the
    file gives it."""
    out: list[tuple[str, str | None]] = []
    for lst in slot.all_lists():
        got = cs.listed(lst, index)
        if got is None:
            continue
        want, words, short = got
        if short and not decoder:
            continue
        if short:
            out.append(
                (f"layer {index}: config.json {words}, but layer {index} is a decoder layer", None)
            )
        elif want is None:
            known = sorted(v for _, vs in lst.values for v in vs)
            out.append((f"layer {index}: config.json {words}, expected one of {known}", None))
        elif want != held:
            out.append((
                f"layer {index}: config.json {words} (a {want} {slot.name}), but the layer's "
                f"tensors are {held}", want,
            ))  # fmt: skip
    if slot.schedule and decoder:
        # the file's own per-layer list is the writer's schedule: no default stands in then
        got_s = cs.scheduled(slot.schedule, index, defaults=not cs.has_list(slot))
        if got_s is not None and got_s[0] != held:
            out.append((
                f"layer {index}: config.json {got_s[1]}, so its {slot.name} is {got_s[0]} by "
                f"the schedule, but the layer's tensors are {held}", got_s[0],
            ))  # fmt: skip
    return out
