"""A checkpoint's quantization config in words, for the refusal of a variant no scheme
describes: ``compressed-tensors pack-quantized, 4-bit int group 128 asymmetric weights, no
input quantization``, ``gptq, 4-bit group 128 symmetric desc_act true``.

Which fields tell a method's variants apart (the same fields the scheme files' ``variant:``
rules read, as vLLM's quantization configs read them):
- compressed-tensors (``compressed_tensors.py`` ``_get_scheme_from_parts``): ``format``, and
  each config group's ``weights`` (``num_bits``, ``type``, ``strategy``, ``group_size``,
  ``symmetric``, ``actorder``, ``block_structure``) and ``input_activations`` (``dynamic``,
  ``strategy``, ``symmetric``);
- ``fp8`` (``fp8.py`` ``Fp8Config.from_config``): ``weight_block_size``, ``activation_scheme``;
- GPTQ (``auto_gptq.py``): ``bits``, ``group_size``, ``desc_act``, ``sym``,
  ``checkpoint_format``; AWQ (``auto_awq.py``): ``bits``, ``group_size``, ``zero_point``,
  ``version``; ModelOpt (``modelopt.py``): ``quant_algo``.
Invariant: pure; any shape of JSON is described without raising (a hostile config is words,
never a traceback); a value past ``MAX_SHOWN`` characters is shown cut (``core.shown``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from specbind.core.quant import canonical
from specbind.core.shown import shown

MAX_SHOWN = 40


def text(v: Any) -> str:
    """A config value as the refusal shows it: a plain string as is, anything else as the
    scheme files compare it (``core.quant.canonical``: ``true``, ``null``, ``[64, 64]``); a
    long one cut by ``core.shown``."""
    plain = isinstance(v, str) and v.isprintable()  # else a newline or escape stays one line
    s = v if plain else json.dumps(v) if isinstance(v, str) else canonical(v)
    return s if len(s) <= MAX_SHOWN else shown(s)


def describe(doc: Any) -> str:
    """``doc`` (a ``quantization_config`` object, or a side file's) in words."""
    if not isinstance(doc, Mapping):
        return f"quantization_config {text(doc)}"
    if isinstance(doc.get("quantization"), Mapping) and "quant_method" not in doc:
        doc = {"quant_method": "modelopt", **doc["quantization"]}  # hf_quant_config.json
    method = doc.get("quant_method")
    if method == "modelopt" or (method is None and "quant_algo" in doc):
        return f"modelopt, quant_algo {text(doc.get('quant_algo'))}"
    if method == "compressed-tensors" or (method is None and "config_groups" in doc):
        return _compressed_tensors(doc)
    if method == "fp8":
        block = doc.get("weight_block_size")
        where = (
            f"{text(block)} blocks" if block is not None else "per-tensor (no weight_block_size)"
        )
        return f"fp8, {where}, activation_scheme {text(doc.get('activation_scheme'))}"
    if method == "gptq" or (method is None and "desc_act" in doc):
        return (
            f"gptq, {_bits(doc.get('bits'))} group {text(doc.get('group_size'))} "
            f"{'symmetric' if doc.get('sym', True) is True else 'asymmetric'} "
            f"desc_act {text(doc.get('desc_act', False))}, checkpoint_format "
            f"{text(doc.get('checkpoint_format', 'gptq'))}"
        )
    if method == "awq" or (method is None and "zero_point" in doc):
        return (
            f"awq, {_bits(doc.get('bits', doc.get('w_bit')))} group "
            f"{text(doc.get('group_size', doc.get('q_group_size')))} zero_point "
            f"{text(doc.get('zero_point'))}, version {text(doc.get('version'))}"
        )
    if method == "bitsandbytes":
        bits = "4-bit" if doc.get("load_in_4bit") else "8-bit" if doc.get("load_in_8bit") else ""
        kind = doc.get("bnb_4bit_quant_type") if doc.get("load_in_4bit") else None
        return ", ".join(x for x in ("bitsandbytes", bits, text(kind) if kind else "") if x)
    return f"quant_method {text(method)}"


def _bits(b: Any) -> str:
    return f"{b}-bit" if isinstance(b, int) and not isinstance(b, bool) else f"bits {text(b)}"


def _compressed_tensors(doc: Mapping[str, Any]) -> str:
    groups = doc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        return f"compressed-tensors {text(doc.get('format'))}, no config_groups"
    parts = [_group(doc.get("format"), g) for g in groups.values()]
    return "compressed-tensors " + "; ".join(dict.fromkeys(parts))


def _group(top: Any, g: Any) -> str:
    if not isinstance(g, Mapping):
        return f"{text(top)}, group {text(g)}"
    fmt = g.get("format", top)
    return f"{text(fmt)}, {_weights(g.get('weights'))}, {_inputs(g.get('input_activations'))}"


def _weights(w: Any) -> str:
    if not isinstance(w, Mapping):
        return f"weights {text(w)}"
    strategy = w.get("strategy")
    what = [_bits(w.get("num_bits")), text(w.get("type"))]
    if strategy == "group":
        what.append(f"group {text(w.get('group_size'))}")
    elif strategy == "block":
        what.append(f"block {text(w.get('block_structure'))}")
    elif strategy == "tensor_group":
        what.append(f"tensor_group {text(w.get('group_size'))}")
    else:
        what.append(text(strategy))
    what.append("symmetric" if w.get("symmetric", True) is True else "asymmetric")
    if w.get("actorder") is not None:
        what.append(f"actorder {text(w.get('actorder'))}")
    return " ".join(what) + " weights"


def _inputs(a: Any) -> str:
    if a is None:
        return "no input quantization"
    if not isinstance(a, Mapping):
        return f"input_activations {text(a)}"
    how = "dynamic" if a.get("dynamic") is True else "static"
    sym = "" if a.get("symmetric", True) is True else " asymmetric"
    return (
        f"{how} {_bits(a.get('num_bits'))} {text(a.get('type'))} "
        f"{text(a.get('strategy'))}{sym} inputs"
    )
