"""The checkpoint's own half-precision dtype: a family stored in F16 throughout (older releases,
many fine-tunes) binds its spec's BF16 tensors as F16, for an engine that runs F16.

Which one: the bind's ``dtype`` argument if given, else config.json's ``dtype`` (transformers
5) or ``torch_dtype`` (earlier writers), at the top level or in ``text_config``: ``float16`` is
F16, ``bfloat16`` BF16; anything else (absent, ``float32``) leaves the spec's own BF16, whose
tensors are then checked as always.

Invariants:
- the model spec says which it accepts (``dtypes: [BF16, F16]``); a dtype it does not list is
  refused in one line naming the model, the dtype and where it came from, before any byte;
- only the spec's BF16 tensors follow the choice; a tensor the spec keeps in another dtype
  (an F32 ``A_log``, a correction bias) keeps it, and its ``stored`` alternatives still
  convert exactly or are refused;
- nothing converts between F16 and BF16: a BF16 tensor in a checkpoint bound as F16 (a mixed
  checkpoint) is refused naming the tensor, with why (``why_dtype``), never rounded.
Trap: the two config keys may disagree (a file re-saved by another writer); both present and
different is refused rather than one preferred.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specbind.core.errors import BindError
from specbind.core.ir import FieldRule, TensorRule
from specbind.core.planning import BlockPlan
from specbind.core.record import replace

HALF = frozenset({"BF16", "F16"})
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
        shown = ", ".join(f"{k} {v}" for k, v in found.items())
        raise BindError(f"config.json names two dtypes ({shown}); refusing to guess")
    if not found:
        return None, "config.json names no dtype"
    key, value = next(iter(found.items()))
    return _NAMES.get(value), f"config.json {key} {value}"


def choose(model: str, allowed: Sequence[str], config: Mapping[str, Any], given: str | None) -> str:
    """The dtype the spec's BF16 tensors bind in (see the module docstring)."""
    if given is not None:
        if given not in HALF:
            raise BindError(f"dtype {given!r} is not a half dtype (BF16 or F16)")
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


def rules_in(
    rules: Sequence[TensorRule], plan: BlockPlan, half: str
) -> tuple[tuple[TensorRule, ...], BlockPlan]:
    """``rules`` and ``plan`` with every BF16 tensor bound as ``half`` instead."""
    if half == "BF16":
        return tuple(rules), plan
    why = (
        f"this checkpoint binds its half-precision tensors as {half}; a tensor in another "
        "half dtype would have to be rounded, so a mixed checkpoint is refused"
    )
    out = tuple(
        replace(r, dtype=half, stored=tuple(d for d in r.stored if d != half), why_dtype=why)
        if r.dtype == "BF16"
        else r
        for r in rules
    )
    tensors = {
        n: replace(t, dtype=half, stored=tuple(d for d in t.stored if d != half))
        if t.dtype == "BF16"
        else t
        for n, t in plan.tensors.items()
    }
    return out, replace(plan, tensors=tensors)


def fields_in(fields: Mapping[str, FieldRule], half: str) -> dict[str, FieldRule]:
    """The bound fields' rules with BF16 read as ``half``."""
    return {
        k: replace(f, dtype=half) if half != "BF16" and f.dtype == "BF16" else f
        for k, f in fields.items()
    }
