"""``specbind models``: the supported models, read from the generated tables, so the list
cannot drift from what ``bind`` accepts.

Per model: the config.json ``model_type`` values it claims, its blocks, the real model's
layers, what tensor parallelism splits (the symbols whose units tensors are split in) and
whether expert parallelism applies (a block with an expert family), the quantization schemes
a checkpoint may be stored in, and the engine layouts (each with the config.json
architectures it serves, where it says, a model's second layout included) with their proof
status: the test that
proves a layout against the engine's own loader and the tps it does (every rank of each), or
``unproven`` with the measured reason the layout's ``unproven:`` gives; or, for a model the
engine cannot run at all, no layout and the measured reason (``unavailable``: the engine's own
loader's error line).
Invariant: every row comes from ``generated.MODELS`` and ``generated.engines`` (``ENGINES``,
``UNAVAILABLE``), the same registries ``bind`` and ``bind_for_engine`` look models up in;
nothing is written here.
"""

from __future__ import annotations

from typing import Any

from specbind.runtime.binder.tables import ModelTable


def supported() -> list[dict[str, Any]]:
    """One entry per generated model, by name."""
    from specbind.generated import MODELS
    from specbind.generated.engines import ENGINES, UNAVAILABLE

    return [_row(MODELS[name], ENGINES, UNAVAILABLE) for name in sorted(MODELS)]


def _row(
    table: ModelTable[Any],
    engines: dict[tuple[str, str], Any],
    unavailable: dict[tuple[str, str], str] | None = None,
) -> dict[str, Any]:
    units = sorted(
        {
            r.shard.unit or f"axis {r.shard.axis}"
            for b in table.blocks
            for r in b.tensors
            if r.shard.kind != "replicated"
        }
    )
    experts = sorted({b.name for b in table.blocks if b.module.FAMILIES})
    return {
        "model": table.name,
        "default": table.default,
        "model_types": list(table.model_types),
        "blocks": [b.name for b in table.blocks],
        "layers": table.real_layers,
        "mtp_layers": table.real_mtp,
        "tp_splits": units,
        "ep": {"splits_experts_of": experts} if experts else None,
        "quantization": [s.name for s in table.schemes],
        "engines": sorted(
            [
                {
                    "engine": engine,
                    "architectures": list(layout.architectures),
                    "proof": layout.proof,
                    "tp": list(layout.proof_tp),
                    "unproven": layout.unproven,
                    "unavailable": None,
                    "except": (
                        {"blocks": list(layout.proof_except), "why": layout.proof_except_why}
                        if layout.proof_except
                        else None
                    ),
                }
                for (engine, _), layout in engines.items()
                if layout.model == table.name  # a model's second layout: <model>-<name>
            ]
            + [
                {
                    "engine": engine,
                    "architectures": [],
                    "proof": None,
                    "tp": [],
                    "unproven": None,
                    "unavailable": why,
                    "except": None,
                }
                for (engine, model), why in (unavailable or {}).items()
                if model == table.name
            ],
            key=lambda e: (str(e["engine"]), list(e["architectures"])),
        ),
    }


def engine_status(e: dict[str, Any]) -> str:
    """One engine layout's proof as ``specbind models`` and the docs' models page say it (and
    the config.json architectures it serves, where it says)."""
    archs = e.get("architectures")
    if archs:
        return f"for {', '.join(archs)}: {engine_status(e | {'architectures': []})}"
    if e.get("unavailable"):  # no layout: the engine cannot run the model
        return f"no layout: {e['unavailable']}"
    if e["proof"]:
        at = f" at tp {', '.join(map(str, e['tp']))}" if e["tp"] else ""
        left = e.get("except")
        but = f"; not {', '.join(left['blocks'])}: {left['why']}" if left else ""
        return f"proved{at} by {e['proof']}{but}"
    return f"unproven: {e['unproven']}" if e["unproven"] else "unproven"


def render_text(rows: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    for r in rows:
        mtp = f" + {r['mtp_layers']} MTP" if r["mtp_layers"] else ""
        lines.append(
            f"{r['model']}{' (default)' if r['default'] else ''}: model_type "
            f"{', '.join(r['model_types'])}; {r['layers']} layers{mtp} at the real geometry"
        )
        ep = r["ep"]
        engines = [f"{e['engine']} ({engine_status(e)})" for e in r["engines"]]
        for key, value in (
            ("blocks", ", ".join(r["blocks"])),
            ("tp", "splits by " + ", ".join(r["tp_splits"])),
            ("ep", "splits the experts of " + ", ".join(ep["splits_experts_of"]) if ep else
             "refused (no expert family)"),
            ("quantized", ", ".join(r["quantization"]) or "none"),
            ("engines", ", ".join(engines) or "none (bind, bind --out, the API)"),
        ):  # fmt: skip
            lines.append(f"  {key:<10} {value}")
    lines.append(f"{len(rows)} model(s); --json for the same as data")
    return "\n".join(lines)
