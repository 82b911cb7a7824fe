"""Which engine layout binds a checkpoint, chosen as the engine chooses its model class, and
whether that layout may bind at the asked tp.

vLLM picks the class that holds a checkpoint by config.json ``architectures`` (its
``ModelRegistry``, vllm/model_executor/models/registry.py: the first listed architecture it
knows), not by ``model_type``: a Hub Phi-3.5-MoE says ``PhiMoEForCausalLM`` (vLLM's native
class), while transformers' own class writes ``PhimoeForCausalLM`` (vLLM's Transformers
backend), and the two hold other parameter names.

Invariants:
- the layout is the one whose ``architectures:`` lists the first of the checkpoint's
  architectures any layout of the engine lists; a checkpoint naming none of them is bound by
  the layout of its model (chosen by ``model_type``), as before;
- a listed architecture whose layout is another model's than the one ``model_type`` (or the
  caller) chose is refused in one line naming both: the engine would build the other class;
- a tp the layout's proof does not cover is refused (``engine_ops.check_proven_tp``);
- an engine constraint reads the geometry, tp, and the model's group flags as 1 or 0
  (``use_qk_norm``: 1 where config.json sets it; a file without the field reads as the group's
  ``missing``, else 0).
Trap: ``architectures`` may be absent, null, or not a list of strings in a hand-written
config: then it chooses nothing (the model type does), as vLLM then falls back too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specbind.core.errors import SpecbindError


def select_layout(engine: str, model: str, config: Mapping[str, Any]) -> Any:
    """The generated ``EngineTable`` of ``engine`` for a checkpoint of ``model`` whose
    config.json is ``config``: by its architectures, else the model's own layout."""
    from specbind.generated.engines import ARCHITECTURES, ENGINES

    archs = config.get("architectures")
    names = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    for arch in names:
        name = ARCHITECTURES.get((engine, arch))
        if name is None:
            continue
        table = ENGINES[(engine, name)]
        if table.model != model:
            raise SpecbindError(
                f"config.json architectures names {arch}, which {engine} serves by its layout "
                f"of {table.model} ({table.file}), but the checkpoint is read as {model}: "
                f"{engine} would build the other model's class"
            )
        return table
    return layout_for(engine, model)


def layout_for(engine: str, model: str) -> Any:
    """The generated ``EngineTable`` of ``engine`` for ``model``, or one line: the measured
    reason the engine cannot run the model (its ``unavailable:``), or the layouts that exist."""
    from specbind.generated.engines import ENGINES, UNAVAILABLE

    found = ENGINES.get((engine, model))
    why = UNAVAILABLE.get((engine, model))
    if found is None and why is not None:
        raise SpecbindError(
            f"no {engine} layout for model {model!r}: {engine} cannot run it here "
            f"(specs/engines/{engine}/{model}.yaml: {why})"
        )
    if found is None:
        have = ", ".join(f"{e}/{m}" for e, m in sorted(ENGINES)) or "none"
        raise SpecbindError(
            f"no {engine} layout for model {model!r} (specs/engines/{engine}/{model}.yaml; "
            f"generated: {have})"
        )
    return found


def constraint_values(layout: Any, config: Mapping[str, Any]) -> dict[str, int]:
    """The geometry of ``config`` and, for the engine's constraints, each group flag of the
    model as 1 or 0."""
    from specbind.runtime.layout.config import flag_group, values_from_config

    values = values_from_config(layout.table, config)
    for rule in layout.table.layer_groups:
        if rule.flag:
            verdict = flag_group(rule, config)
            values[rule.flag] = int(verdict is not None and verdict[0])
    return values
