"""Load time inside vLLM: ``load_format="specbind"`` beside vLLM's default loader.

    python -m specbind.bench.vllm_load CKPT [--repeat R]     (in the vLLM venv: .ci/vllm-venv)

Starts R engines of each loader at tp 1, interleaved (default, specbind, default, ...), in one
process with the engine core in-process, and reads each loader's own "Loading weights took"
line from vLLM's log: the time of ``load_weights`` alone (reading, checking, copying into the
parameters), not the engine's start. Equal work: both fill the same parameters from the same
checkpoint on a warm page cache (a warm-up start of each comes first). Prints min and median.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import statistics
from typing import Any

_TOOK = re.compile(r"[Ll]oading weights took ([0-9.]+) seconds")


class _Grab(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = _TOOK.search(record.getMessage())
        if m:
            self.seconds.append(float(m.group(1)))


def _start(ckpt: str, load_format: str, grab: _Grab) -> float:
    import gc

    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    before = len(grab.seconds)
    llm: Any = LLM(
        model=ckpt, load_format=load_format, dtype="bfloat16", skip_tokenizer_init=True,
        enforce_eager=True, max_model_len=64, max_num_seqs=2,
    )  # fmt: skip
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    if len(grab.seconds) != before + 1:
        raise SystemExit(f"{load_format}: vLLM logged no 'Loading weights took' line")
    return grab.seconds[-1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import vllm  # noqa: F401  (configures vLLM's loggers before the handler joins them)

    grab = _Grab()
    logging.getLogger("vllm").addHandler(grab)
    times: dict[str, list[float]] = {"auto": [], "specbind": []}
    for fmt in times:  # warm-up: imports, page cache
        _start(args.ckpt, fmt, grab)
    for _ in range(args.repeat):
        for fmt in times:
            times[fmt].append(_start(args.ckpt, fmt, grab))
    for fmt, xs in times.items():
        print(
            f"{fmt:9s} load_weights: median {statistics.median(xs):.3f} s, min {min(xs):.3f} s "
            f"({len(xs)} starts)"
        )


if __name__ == "__main__":
    main()
