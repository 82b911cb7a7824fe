"""What an engine loader checks of a checkpoint before the engine builds its model: the census
of every tensor (each claimed by a block, none missing), every tensor's dtype, and the config
(the geometry it gives), with no tensor's bytes read (``specbind.audit``'s names-only census,
milliseconds on a tiny checkpoint, the headers of a large one).

vLLM 0.32 calls a loader's ``load_model`` first in each worker (vllm/v1/worker/
cpu_model_runner.py ``load_model`` -> model_loader ``get_model`` -> ``BaseModelLoader.
load_model``), which builds the model (``create_model``) and then calls ``load_weights``; it
never calls ``download_model`` on that path. ``specbind.vllm_loader`` runs this check at the
top of its ``load_model``, so a checkpoint refused here costs no model construction (no
allocation of every parameter), only what vLLM did before any loader runs (its processes,
imports, the distributed groups).

Invariant: every refusal here is one a bind of the same checkpoint makes too (the bind runs
the same census and dtype rules, then the shapes and values): this check only moves the first
refusal earlier. Trap: shapes are not read here (the census reads names, dtypes and config);
a wrong shape is refused by the bind, after the model is built and before any weight is used.
"""

from __future__ import annotations

from pathlib import Path

from specbind.core.errors import BindError


def check_before_build(
    path: str | Path, engine: str, *, model: str | None = None, advice: str | None = None
) -> None:
    """Refuse, in one line, a checkpoint whose census, dtypes or config the engine layout of
    its model refuses; read no tensor's bytes."""
    from specbind.api import model_table
    from specbind.audit import audit
    from specbind.engine_quant import engine_scheme
    from specbind.engine_select import select_layout
    from specbind.runtime.io.checkpoint import CheckpointDir

    raw = CheckpointDir(Path(path))
    base = model_table(model, "model=", raw.config, advice)
    layout = select_layout(engine, base.name, raw.config)  # the layout the bind will use
    engine_scheme(engine, layout, raw, None)  # a scheme the engine does not serve: refused
    rep = audit(
        raw, layout.table, progress=False, mtp=layout.skip_mtp is None, verify=False,
        identical=False,
    )  # fmt: skip
    problems = rep["problems"]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BindError(f"{problems[0]}{more}")  # as the bind's own lines: no path
