"""One vLLM scenario, run in the vLLM venv (.ci/vllm-venv) by tests/vllm/test_vllm_loader.py.

    python tests/support/vllm_scenario.py SPEC.json OUT.json

SPEC: {"tp": N, "runs": [{"name", "ckpt", "load_format", "generate": bool,
"expert_parallel": bool}, ...]}. Each run
starts one engine (``vllm.LLM``), records every parameter vLLM holds after loading (name,
shape, dtype and a SHA-256 of its bytes, per tp rank), the greedy tokens and top-3 logprobs of
one prompt when asked, the seconds the engine took to start, or the error that stopped the
start. The runs share this process, so vLLM is imported once (engine starts are the cost).

tp 2 on CPU: the ``mp`` executor with one OpenMP thread per rank (``VLLM_CPU_OMP_THREADS_BIND
0|1``); a ``__main__`` guard, as the workers import this file. The KV cache is 64 MiB, given in
bytes (tests/vllm/token_worker.py says why not ``VLLM_CPU_KVCACHE_SPACE``).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # vllm_digest, in vLLM's workers too
from vllm_workers import KV_BYTES  # found by the path above

PROMPT = [1, 5, 9, 17, 33, 2]
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model ships a function
os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # whole GiB; it would override KV_BYTES


def run(tp: int, r: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    extra: dict[str, Any] = {"distributed_executor_backend": "mp"} if tp > 1 else {}
    if r.get("expert_parallel"):
        extra["enable_expert_parallel"] = True
    t0 = time.perf_counter()
    try:
        llm = LLM(
            model=r["ckpt"], load_format=r["load_format"], tensor_parallel_size=tp,
            dtype="bfloat16", skip_tokenizer_init=True, enforce_eager=True, max_model_len=64,
            max_num_seqs=2, seed=0, kv_cache_memory_bytes=KV_BYTES, **extra,
        )  # fmt: skip
    except Exception as e:  # the refusal under test: recorded, and the next run goes on
        cleanup_dist_env_and_memory()
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}
    out: dict[str, Any] = {"seconds": time.perf_counter() - t0}
    from vllm_digest import digests

    out["params"] = llm.apply_model(digests)  # one list per tp rank
    if r.get("generate"):
        # ignore_eos: a random model may pick its EOS token early; the claim compares 4 steps
        sp = SamplingParams(max_tokens=4, temperature=0.0, logprobs=3, ignore_eos=True)
        (res,) = llm.generate([{"prompt_token_ids": PROMPT}], sp, use_tqdm=False)
        o = res.outputs[0]
        out["tokens"] = list(o.token_ids)
        out["logprobs"] = [
            sorted((t, lp.logprob) for t, lp in step.items()) for step in (o.logprobs or [])
        ]
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    return out


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    tp = int(spec["tp"])
    if tp == 1:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # errors reach this process
    else:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i) for i in range(tp)))
    # each result says how its engine ran (a claim about expert parallelism reads it)
    results = {
        r["name"]: run(tp, r) | {"expert_parallel": bool(r.get("expert_parallel"))}
        for r in spec["runs"]
    }
    Path(sys.argv[2]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
