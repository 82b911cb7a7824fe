"""Every read of config.json's fields: geometry, flags, per-layer lists, counts, quantization.

Invariants: a geometry symbol with a ``config`` field is read from config.json — under
``text_config`` when the file nests it, else flat — and must be an integer (not a bool, not a
float) no smaller than its ``min``; a symbol without one is an engine setting with a default;
the model's own constraints hold for every geometry ``checked_values`` returns. Missing or
ill-typed fields are refused by name; nothing falls back silently to a default: a field falls
back only to the ``default`` expression its spec declares (``head_dim`` = ``hidden / heads``),
evaluated exactly, and an ``expr`` symbol is always computed (``core.geometry``). A ``--set``
value supplies a field config.json lacks. A JSON null is absent only where the spec says
``null_is_absent``, as the family's transformers config class reads it (transformers 5.19+
writes ``"head_dim": null`` into Mixtral's config.json), or reads as ``null_default`` where the
class reads a null otherwise than an absent field (ERNIE 4.5: absent 128, null hidden / heads);
elsewhere a null is refused by name.
A field that decides a parameter's shape or presence but no geometry symbol (Falcon's
``multi_query``, Llama's ``attention_bias``) is held to the values the spec's ``requires:``
lists (``check_requires``).
The checkpoint's own half dtype (``choose``): a bind's ``dtype`` if given, else config.json's
``dtype`` (transformers 5) or ``torch_dtype``, top level or ``text_config`` (two that disagree
are refused): ``float16`` is F16, ``bfloat16`` BF16, anything else the spec's own BF16; one the
model spec's ``dtypes:`` does not list is refused before any byte (see ``checks.rules_in``).
Trap: a flag (``tie_word_embeddings``) is read at the top level first, unlike geometry (see
``config_flags``); a per-layer list is a cross-check of the names, never a substitute.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from specbind.core.errors import BindError, CheckpointError, GeometryError, OverrideError
from specbind.core.geometry import computed, resolve
from specbind.core.shown import shown

if TYPE_CHECKING:  # types only: reading config.json loads nothing of runtime.binder
    from specbind.core.ir import LayerGroupRule
    from specbind.runtime.binder.tables import ModelTable

MAX_LAYERS = 1 << 16  # a layer count past this is a broken config, not a model


def values_from_config(
    table: ModelTable[Any], config: Mapping[str, Any], overrides: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Geometry values from a parsed config.json (HF field names), plus engine settings."""
    values: dict[str, int] = {}
    pending: dict[str, str] = {}  # symbols computed from others: defaults, expressions
    overrides = overrides or {}
    for f in table.geometry_fields:
        if type(overrides.get(f.name)) is int:  # --set supplies a field config.json lacks
            values[f.name] = overrides[f.name]
            continue
        if f.expr is not None:
            pending[f.name] = f.expr
            continue
        if f.config is None:
            values[f.name] = f.value
            continue
        hits = [
            h
            for p in (f.config, *f.also)
            if (h := config_lookup(config, p)) is not None
            and not (h[0] is None and f.null_is_absent)  # read as absent: default stands in
        ]
        if not hits and f.default is not None:
            pending[f.name] = f.default
            continue
        if not hits:
            paths = " or ".join(repr(p) for p in (f.config, *f.also))
            raise CheckpointError(
                f"config.json: missing field {paths} (flat or under text_config), "
                f"needed for geometry symbol {f.name} (--set {f.name}=N supplies it)"
            )
        raw, where = hits[0]
        if raw is None and f.null_default is not None:  # the class reads null so
            pending[f.name] = f.null_default
            continue
        if raw is None:
            raise CheckpointError(
                f"config.json: {where} is null, expected an integer (model {table.name} does "
                f"not read a null {where} as absent: its transformers config class does not)"
            )
        for other, at in hits[1:]:
            if other != raw or type(other) is not type(raw):
                raise CheckpointError(
                    f"config.json: {where} is {shown(raw)} but {at} is {shown(other)}; both are "
                    f"geometry symbol {f.name}"
                )
        if type(raw) is not int:
            raise CheckpointError(
                f"config.json: {where} is {shown(raw)} ({type(raw).__name__}), expected an integer"
            )
        values[f.name] = raw
    return checked_values(table, resolve(values, pending), overrides)


def check_requires(table: ModelTable[Any], config: Mapping[str, Any]) -> None:
    """Refuse a config.json value the spec cannot say for a field that decides a parameter's
    shape or presence (``requires:``), naming the field, its value and why; a field absent (or
    null) reads as the rule's ``missing`` value, and without one is not checked."""
    for q in table.requires:
        found = config_lookup(config, q.config)
        if found is None or found[0] is None:
            if not q.missing:
                continue
            value, where, said = q.missing[0], q.config, " (absent: read as "
            said += f"{json.dumps(q.missing[0])}, the transformers default)"
        else:
            value, where = found
            said = ""
        if not any(type(v) is type(value) and v == value for v in q.allowed):
            allowed = " or ".join(json.dumps(v) for v in q.allowed)
            raise CheckpointError(
                f"config.json: {where} is {_json(value)}{said}, but model {table.name} binds "
                f"{q.config} {allowed} only: {q.why}"
            )


def config_lookup(config: Mapping[str, Any], name: str) -> tuple[Any, str] | None:
    """(value, where) of a config.json field: under ``text_config`` when the file nests it
    there, else flat; None when it is in neither. A dotted name walks into nested objects
    (``linear_attn_config.num_heads``)."""
    nested = config.get("text_config")
    if nested is not None and not isinstance(nested, dict):
        raise CheckpointError(f"config.json: text_config is {type(nested).__name__}, not an object")
    for scope, head in ((nested, "text_config."), (config, "")):
        if scope is None:
            continue
        node: Any = scope
        for key in name.split("."):
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            return node, head + name
    return None


def expected_groups(
    table: ModelTable[Any], config: Mapping[str, Any], layer: int
) -> dict[str, tuple[bool, str]]:
    """For each layer-group rule that covers ``layer``: (must be present, why)."""
    out: dict[str, tuple[bool, str]] = {}
    for rule in table.layer_groups:
        if rule.required:
            out[rule.group] = (True, f"model {table.name} requires the {rule.group} group")
            continue
        if rule.flag:
            flagged = flag_group(rule, config)
            if flagged is not None:
                out[rule.group] = flagged
            continue
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
                f"config.json: {rule.config}[{layer}] is {shown(v)}, expected one of {known}"
            )
        out[rule.group] = (v in rule.present, f"config.json {rule.config}[{layer}] is {shown(v)}")
    return out


def flag_group(rule: LayerGroupRule, config: Mapping[str, Any]) -> tuple[bool, str] | None:
    """A flag rule's verdict for every layer: (the group must be present, why); None when the
    file lacks the field (or has null) and the rule declares no ``missing``. A value that is
    neither ``present`` nor ``absent`` (by type and value: ``1`` is not ``true``) is refused."""
    found = config_lookup(config, rule.flag)
    if found is None or found[0] is None:
        if rule.missing is None:
            return None
        said = "carries" if rule.missing else "has no"
        return rule.missing, f"config.json has no {rule.flag} (a layer then {said} {rule.group})"
    value, where = found
    present = rule.present or (True,)
    absent = rule.absent or (False,)

    def among(vals: tuple[Any, ...]) -> bool:
        return any(type(v) is type(value) and v == value for v in vals)

    if not among(present) and not among(absent):
        known = ", ".join(json.dumps(v) for v in present + absent)
        raise CheckpointError(f"config.json: {where} is {_json(value)}, expected one of {known}")
    return among(present), f"config.json {where} is {json.dumps(value)}"


def _json(value: Any) -> str:
    """A config.json value as JSON spells it (``true``, ``"x"``), cut as ``shown`` cuts."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return shown(value)
    return text if len(text) <= 200 else shown(value)


def checked_values(
    table: ModelTable[Any], values: Mapping[str, int], overrides: Mapping[str, int]
) -> dict[str, int]:
    """``values`` with ``overrides`` applied; every name known, every value in range."""
    values = dict(values)
    for k, v in overrides.items():
        if k not in values:
            raise OverrideError(f"unknown geometry symbol {shown(k)} (known: {', '.join(values)})")
        if type(v) is not int:  # the API's overrides are the caller's objects, not parsed text
            raise OverrideError(
                f"override {k}={shown(v)} is a {type(v).__name__}, not an integer "
                "(a geometry value)"
            )
        values[k] = v
    values = computed(table.geometry_fields, values, keep=overrides)
    for f in table.geometry_fields:
        if values[f.name] < f.min:
            raise GeometryError(
                f"geometry {f.name} = {values[f.name]} is below its minimum {f.min}"
            )
        if values[f.name] > 1 << 30:
            raise GeometryError(f"geometry {f.name} = {values[f.name]} is implausibly large")
    if table.check is not None:
        table.check(table.make_geometry(values))  # the model's own constraints
    return values


def config_flags(table: ModelTable[Any], config: Mapping[str, Any]) -> dict[str, bool]:
    """The config.json booleans the blocks read (``tie_word_embeddings``); absent is false.

    Trap: unlike geometry, a flag is read at the top level first: transformers ties a
    multimodal model's head by the outer config's ``tie_word_embeddings``, whatever its
    ``text_config`` says; only a file without the top-level field falls back to text_config.
    """
    out: dict[str, bool] = {}
    for name in table.flags:
        found = (config[name], name) if name in config else config_lookup(config, name)
        if found is None:
            out[name] = False
            continue
        value, where = found
        if type(value) is not bool:
            raise CheckpointError(f"config.json: {where} is {shown(value)}, expected true or false")
        out[name] = value
    return out


def config_count(config: Mapping[str, Any], name: str | None) -> int | None:
    if name is None:
        return None
    found = config_lookup(config, name)
    if found is None:
        return None
    value, where = found
    if type(value) is not int or not 0 <= value <= MAX_LAYERS:
        raise CheckpointError(
            f"config.json: {where} is {shown(value)}, expected a whole number up to {MAX_LAYERS}"
        )
    return value


def quantization_config(config: Mapping[str, Any]) -> Any:
    """config.json's ``quantization_config`` (flat, else under ``text_config``); None if absent."""
    qc = config.get("quantization_config")
    nested = config.get("text_config")
    if qc is None and isinstance(nested, dict):
        qc = nested.get("quantization_config")
    return qc


HALF = frozenset({"BF16", "F16"})  # the half dtypes a bind may choose (see choose)
_NAMES = {"float16": "F16", "bfloat16": "BF16", "half": "F16"}
_KEYS = ("dtype", "torch_dtype")


def config_dtype(config: Mapping[str, Any]) -> tuple[str | None, str]:
    """(the half dtype config.json names, or None, and where it says so)."""
    found: dict[str, str] = {}
    for scope, c in (("", config), ("text_config.", config.get("text_config"))):
        if not isinstance(c, Mapping):
            continue
        for k in _KEYS:
            v = c.get(k)
            if isinstance(v, str):
                found[f"{scope}{k}"] = v.removeprefix("torch.")
    if len(set(found.values())) > 1:
        said = ", ".join(f"{k} {shown(v)}" for k, v in found.items())
        raise BindError(f"config.json names two dtypes ({said}); refusing to guess")
    if not found:
        return None, "config.json names no dtype"
    key, value = next(iter(found.items()))
    return _NAMES.get(value), f"config.json {key} {shown(value) if value not in _NAMES else value}"


def choose(model: str, allowed: Sequence[str], config: Mapping[str, Any], given: str | None) -> str:
    """The dtype the spec's BF16 tensors bind in (see the module docstring)."""
    if given is not None:
        if given not in HALF:
            raise BindError(f"dtype {shown(given)} is not a half dtype (BF16 or F16)")
        half, where = given, f"dtype={given} was asked for"
    else:
        found, where = config_dtype(config)
        half = found or "BF16"
    if half not in allowed:
        raise BindError(
            f"model {model} binds {', '.join(allowed)} checkpoints, but {where}: its spec does "
            f"not say its tensors may be {half} (model `dtypes:`)"
        )
    return half
