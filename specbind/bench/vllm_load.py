"""Load time inside vLLM: ``load_format="specbind"`` beside vLLM's default loader.

    python -m specbind.bench.vllm_load CKPT [--repeat R]     (in the vLLM venv: .ci/vllm-venv)

Starts R engines of each loader at tp 1, interleaved (default, specbind, default, ...), in one
process with the engine core in-process, and times each loader's ``load_weights`` (wrapped
here): reading, checking and copying into the parameters, not the engine's start. Equal
work: both fill the same parameters from the same checkpoint on a warm page cache (a warm-up
start of each comes first). Prints min and median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any


def _timed(cls: Any, seconds: list[float]) -> None:
    """Wrap ``cls.load_weights`` so each call appends its wall time to ``seconds``."""
    inner = cls.load_weights

    def load_weights(self: Any, model: Any, model_config: Any) -> None:
        t0 = time.perf_counter()
        inner(self, model, model_config)
        seconds.append(time.perf_counter() - t0)

    cls.load_weights = load_weights


def _start(ckpt: str, load_format: str, seconds: list[float]) -> float:
    import gc

    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    before = len(seconds)
    llm: Any = LLM(
        model=ckpt, load_format=load_format, dtype="bfloat16", skip_tokenizer_init=True,
        enforce_eager=True, max_model_len=64, max_num_seqs=2,
    )  # fmt: skip
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    if len(seconds) != before + 1:
        raise SystemExit(f"{load_format}: load_weights ran {len(seconds) - before} times")
    return seconds[-1]


def _load_config(load_format: str) -> Any:
    from vllm.config.load import LoadConfig

    return LoadConfig(load_format=load_format)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # registers load_format="specbind"
    seconds: list[float] = []
    _timed(DefaultModelLoader, seconds)
    _timed(type(get_model_loader(_load_config("specbind"))), seconds)
    times: dict[str, list[float]] = {"auto": [], "specbind": []}
    for fmt in times:  # warm-up: imports, page cache
        _start(args.ckpt, fmt, seconds)
    for _ in range(args.repeat):
        for fmt in times:
            times[fmt].append(_start(args.ckpt, fmt, seconds))
    for fmt, xs in times.items():
        print(
            f"{fmt:9s} load_weights: median {statistics.median(xs):.3f} s, min {min(xs):.3f} s "
            f"({len(xs)} starts)"
        )


if __name__ == "__main__":
    main()
