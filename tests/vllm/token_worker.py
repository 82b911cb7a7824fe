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
each keep their KV cache (1 GiB, ``VLLM_CPU_KVCACHE_SPACE``).
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
from vllm_workers import progress

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
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
    gc.collect()
    cleanup_dist_env_and_memory()
    return out


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out: dict[str, Any] = {}
    for job in spec["loads"]:
        out[job["key"]] = {}
        for fmt in FORMATS:
            progress(f"{job['key']} {fmt}")
            out[job["key"]][fmt] = _run(job["ckpt"], fmt)
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
