"""One worker of the vLLM token runs, run in the vLLM venv by tests/support/vllm_tokens.py.

    python tests/vllm/token_worker.py SPEC.json OUT.json

SPEC: {"loads": [{"key": K, "ckpt": DIR}, ...]}. For each checkpoint the worker starts an
engine (``vllm.LLM``, tp 1, in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, eager, a
64-token context, no tokenizer) once with vLLM's default loader (``load_format="auto"``) and
once with specbind's, and records the greedy tokens of one prompt given as token ids with
every step's top-5 logprobs, or the one-line error that stopped the start or the generation.
OUT: {K: {"auto": ..., "specbind": ...}}.

Progress: before each load the worker prints a line naming it (tests/support/vllm_workers.py:
a run that stops names the load it stopped in).
Trap: each engine's memory is given back before the next (``del``, ``gc.collect``, vLLM's
``cleanup_dist_env_and_memory``): on a 2-core machine with 24 GiB, engines left alive would
each keep their KV cache.
Trap: the KV cache is sized in bytes (``KV_BYTES``), never by ``VLLM_CPU_KVCACHE_SPACE`` (whole
GiB, and it overrides the argument): a GiB of cache for a tiny model is some 260,000 block
objects, which vLLM builds, zeroes and the collector walks at every one of the engine's
``gc.collect()`` calls; that was a third of a token run's CPU.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # vllm_workers
from vllm_workers import KV_BYTES, progress, settle

os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override KV_BYTES
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # errors reach this process

FORMATS = ("auto", "specbind")
PROMPT = [1, 5, 9, 17, 33, 2]
STEPS = 4
TOP = 5


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _run(ckpt: str, load_format: str) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    t0 = time.perf_counter()
    llm = None
    try:
        llm = LLM(
            model=ckpt, load_format=load_format, dtype="bfloat16", skip_tokenizer_init=True,
            enforce_eager=True, max_model_len=64, max_num_seqs=1, seed=0,
            kv_cache_memory_bytes=KV_BYTES,
        )  # fmt: skip
        # ignore_eos: a random model may pick its EOS token early; the claim compares STEPS steps
        sp = SamplingParams(max_tokens=STEPS, temperature=0.0, logprobs=TOP, ignore_eos=True)
        (res,) = llm.generate([{"prompt_token_ids": PROMPT}], sp, use_tqdm=False)
        o = res.outputs[0]
        out: dict[str, Any] = {
            "tokens": list(o.token_ids),
            # NaN is written as a string: JSON has no NaN, and a NaN logprob is a result
            "logprobs": [
                sorted((t, repr(lp.logprob)) for t, lp in step.items())
                for step in (o.logprobs or [])
            ],
        }
    except Exception as e:  # the measured failure: recorded, the next load goes on
        out = {"error": _line(e)}
    out["seconds"] = time.perf_counter() - t0
    del llm
    gc.collect()  # the engine's objects go before its process groups
    cleanup_dist_env_and_memory()
    settle()
    return out


def _only_our_gc_freezes() -> None:
    """vLLM's engine freezes the whole heap when it starts (``freeze_gc_heap``) and unfreezes it
    all when it shuts down (``gc.unfreeze`` in ``EngineCore.shutdown``, the worker's
    ``shutdown`` and ``cleanup_dist_env_and_memory``): each engine start then walks vLLM's and
    torch's millions of imported objects again at every collection (0.2-0.4 s each, about ten
    per engine). Here the heap is frozen only by ``settle``, once an engine is gone, and vLLM's
    freezes and unfreezes do nothing: the collections inside an engine's start and shutdown
    walk that engine's objects alone. An engine frozen while alive would never be collected,
    so vLLM's own freeze is the one switched off. Measured on six families, with the KV cache
    made small: 43 s of CPU to 21 s, the tokens and logprobs unchanged."""
    import gc

    from vllm.v1.engine import core
    from vllm.v1.worker import gpu_worker

    core.freeze_gc_heap = gpu_worker.freeze_gc_heap = lambda: None
    gc.unfreeze = lambda: None


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import vllm.entrypoints.llm  # noqa: F401  (imported before the first load, then frozen)

    _only_our_gc_freezes()
    settle()
    out: dict[str, Any] = {}
    for job in spec["loads"]:
        out[job["key"]] = {}
        for fmt in FORMATS:
            progress(f"{job['key']} {fmt}")
            out[job["key"]][fmt] = _run(job["ckpt"], fmt)
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
