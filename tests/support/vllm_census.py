"""The tp census of the vLLM layouts: for each row's checkpoint (tests/support/vllm_rows.py:
``ROWS`` and ``CENSUS_ROWS``), which tps in 1..8 ``bind_for_engine`` accepts and which vLLM
itself takes (tests/vllm/census_worker.py: its config checks, its model class's constructor
and weight loaders, as the last rank of that tp), so a test can name every tp where the two
disagree.

``census(rows, tmp)`` returns {row id: {"bind": {tp: None or the refusal}, "engine": {tp: None
or vLLM's error}}}, and the ``vllm_proofs.Report`` of what came from the cache.
The bind side binds rank ``tp - 1`` (the rank whose share lies furthest along every split) in
this process; the engine side runs in two workers in the vLLM venv, the rows dealt between
them. Results are cached by content with the proofs' (tests/support/vllm_cache.py, kind
``CENSUS``): a census is recomputed only when a source, a spec or the row changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import vllm_venv
from vllm_proofs import Report, cached_rows
from vllm_rows import VllmRow

WORKER = vllm_venv.REPO / "tests" / "vllm" / "census_worker.py"
TPS = tuple(range(1, 9))
CENSUS = "tp census 1..8: bind_for_engine and vLLM's own constructor and loaders"


def bind_side(ckpt: Path) -> dict[str, str | None]:
    """Per tp, None where ``bind_for_engine`` binds rank tp - 1 of the checkpoint, else its
    one-line refusal."""
    from specbind.core.errors import SpecbindError
    from specbind.engine import bind_for_engine

    out: dict[str, str | None] = {}
    for tp in TPS:
        try:
            bind_for_engine(ckpt, "vllm", tp_size=tp, tp_rank=tp - 1)
        except SpecbindError as e:
            out[str(tp)] = str(e)
        else:
            out[str(tp)] = None
    return out


def census(rows: tuple[VllmRow, ...], tmp: Path) -> tuple[dict[str, Any], Report]:
    return cached_rows(
        rows, CENSUS, 0, tmp, WORKER, "the vLLM tp census",
        job=lambda ckpt: {"tps": list(TPS)},
        finish=lambda ckpt, job, engine: {"bind": bind_side(ckpt), "engine": engine},
    )  # fmt: skip
