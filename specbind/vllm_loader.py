"""specbind as a vLLM model loader: ``vllm.LLM(model=CKPT, load_format="specbind")``.

Installing specbind registers the loader through the ``vllm.general_plugins`` entry point
(pyproject), which vLLM runs in every one of its processes, tp workers included. On each rank
the loader binds that rank's share with the generated vLLM layout of the checkpoint's model
(``specs/engines/vllm/<model>.yaml``): every tensor checked, only the rank's bytes read, each
field copied into the vLLM parameter of its name (``specbind.engine.fill``: every parameter
filled exactly once, equal shape and dtype, nothing left over). vLLM's own post-processing
(``process_weights_after_loading``: its MLA absorbs, kernel repacking) stays vLLM's.

Invariants:
- a refused checkpoint fails engine start with specbind's one-line message (a
  ``SpecbindError``), before any parameter is written;
- tp size and rank come from vLLM's parallel state, never from the user;
- what this loader does not do (pipeline parallelism, expert parallelism, a Hub id instead of
  a local directory) is refused in one line rather than loaded some other way.
Trap: vLLM is imported only inside ``register`` and the loader's methods, so importing
specbind never needs vLLM.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from specbind.core.errors import SpecbindError

LOAD_FORMAT = "specbind"
ENGINE = "vllm"


def register() -> None:
    """The ``vllm.general_plugins`` entry point: register ``load_format="specbind"``."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class SpecbindLoader(BaseModelLoader):  # type: ignore[misc]
        """Binds this rank's share with specbind and copies it into vLLM's parameters."""

        def download_model(self, model_config: Any) -> None:
            _local_dir(model_config.model)

        def load_weights(self, model: Any, model_config: Any) -> None:
            load_weights(model, model_config)

    try:
        register_model_loader(LOAD_FORMAT)(SpecbindLoader)
    except Exception as e:  # registered already in this process (vLLM may run plugins twice)
        if "already" not in str(e).lower():
            raise


def _local_dir(model: str) -> Path:
    p = Path(model)
    if not p.is_dir():
        raise SpecbindError(
            f"load_format={LOAD_FORMAT!r} reads a local checkpoint directory; {model!r} is not "
            "one (download it first, e.g. `huggingface-cli download`)"
        )
    return p


def load_weights(model: Any, model_config: Any) -> None:
    """Bind this rank's share of ``model_config.model`` into ``model``'s parameters."""
    from vllm.config import get_current_vllm_config
    from vllm.distributed import (
        get_pp_group,
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )
    from vllm.logger import init_logger

    from specbind.engine import bind_for_engine, fill

    parallel = get_current_vllm_config().parallel_config
    if get_pp_group().world_size > 1:
        raise SpecbindError(
            f"load_format={LOAD_FORMAT!r}: pipeline parallelism is not supported (pp size "
            f"{get_pp_group().world_size}); use tensor parallelism"
        )
    if getattr(parallel, "enable_expert_parallel", False):
        raise SpecbindError(
            f"load_format={LOAD_FORMAT!r}: expert parallelism is not supported yet; the vLLM "
            "layouts split experts by tensor parallelism"
        )
    tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
    t0 = time.perf_counter()
    fields = bind_for_engine(_local_dir(model_config.model), ENGINE, tp_size=tp, tp_rank=rank)
    params = dict(model.named_parameters())
    nbytes = fill(ENGINE, params, fields)
    init_logger("vllm.model_executor.model_loader.specbind").info(
        "specbind: loading weights took %.2f seconds (%d parameters, %.1f MiB, tp rank %d of %d)",
        time.perf_counter() - t0, len(params), nbytes / 2**20, rank, tp,
    )  # fmt: skip
