"""Load time inside vLLM: ``load_format="specbind"`` beside vLLM's default loader.

    python -m benchmarks.vllm_load CKPT [--repeat R] [--cold]   (in the vLLM venv)

One process, vLLM imported once, the engine core in-process, tp 1: a warm-up start of each
loader, then R pairs interleaved (auto, specbind, auto, ...). Each start times the loader's
``load_weights`` (wrapped here: reading, checking and filling every parameter, not vLLM's
post-processing) and the whole ``vllm.LLM(...)`` construction, and counts the minor page faults
of ``load_weights`` (fresh memory first written; the default loader's parameters partly reuse
the heap an earlier engine of the same process freed). ``--cold``: the checkpoint's pages are
dropped from the page cache before every start (``posix_fadvise(DONTNEED)`` on its files),
else the page cache is warm. Prints min and median of each, the specbind / auto ratio of the
medians, and the load average before and after. ``--fresh N``: N more pairs, each start a
process of its own (what a user's first start is: no heap of an earlier engine to reuse),
with that process's peak RSS (its ``VmHWM`` at the end: the engine core runs in it).
Trap: the machine's load moves every figure; read them only side by side, from one run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

FORMATS = ("auto", "specbind")


def _timed(cls: Any, seconds: list[tuple[float, int]]) -> None:
    """Wrap ``cls.load_weights`` so each call appends (wall time, minor faults) to ``seconds``."""
    inner = cls.load_weights

    def load_weights(self: Any, model: Any, model_config: Any) -> None:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        inner(self, model, model_config)
        took = time.perf_counter() - t0
        seconds.append((took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults))

    cls.load_weights = load_weights


def drop_cache(ckpt: str) -> None:
    """Drop the checkpoint's files from the page cache (their pages only; no root needed)."""
    for p in Path(ckpt).glob("*.safetensors"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _start(ckpt: str, load_format: str, seconds: list[tuple[float, int]]) -> tuple[float, ...]:
    """(load_weights s, whole LLM(...) s, minor faults of load_weights) of one engine start."""
    import gc

    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    before = len(seconds)
    t0 = time.perf_counter()
    llm: Any = LLM(
        model=ckpt, load_format=load_format, dtype="bfloat16", skip_tokenizer_init=True,
        enforce_eager=True, max_model_len=64, max_num_seqs=2,
    )  # fmt: skip
    whole = time.perf_counter() - t0
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    if len(seconds) != before + 1:
        raise SystemExit(f"{load_format}: load_weights ran {len(seconds) - before} times")
    took, faults = seconds[-1]
    return took, whole, float(faults)


def _load_config(load_format: str) -> Any:
    from vllm.config.load import LoadConfig

    return LoadConfig(load_format=load_format)


def summary(times: dict[str, list[tuple[float, ...]]]) -> list[str]:
    """The printed rows: each loader's min and median of each figure, then the ratios."""
    rows = []
    med: dict[str, list[float]] = {}
    for fmt, xs in times.items():
        if not xs:  # no start of this loader in this run (--repeat 0)
            continue
        cols = list(zip(*xs, strict=True))
        med[fmt] = [statistics.median(c) for c in cols]
        lw, whole, _ = cols
        rows.append(
            f"{fmt:9s} load_weights: median {med[fmt][0]:.3f} s (min {min(lw):.3f}); "
            f"LLM(...): median {med[fmt][1]:.3f} s (min {min(whole):.3f}); minor faults "
            f"median {med[fmt][2]:.0f} ({len(xs)} starts)"
        )
    if set(FORMATS) <= med.keys() and all(med["auto"][:2]):
        ours, theirs = med["specbind"], med["auto"]
        rows.append(
            f"specbind / auto, medians: load_weights {ours[0] / theirs[0]:.2f}, "
            f"LLM(...) {ours[1] / theirs[1]:.2f}"
        )
    return rows


def _fresh(ckpt: str, load_format: str, cold: bool) -> tuple[float, ...]:
    """One engine start in a process of its own: (load_weights s, LLM(...) s, minor faults of
    load_weights, peak RSS GB of the process)."""
    import subprocess
    import sys

    if cold:
        drop_cache(ckpt)
    argv = [sys.executable, "-m", "benchmarks.vllm_load", ckpt, "--child", load_format]
    # the clone first on PYTHONPATH: ``-m benchmarks.vllm_load`` from any working directory
    paths = [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    out, _ = proc.communicate()
    line = [x for x in out.splitlines() if x.startswith("CHILD ")]
    if proc.returncode or not line:
        raise SystemExit(f"{load_format}: the engine's process failed (exit {proc.returncode})")
    lw, whole, faults, rss = (float(x) for x in line[-1].split()[1:])
    return lw, whole, faults, rss * 1024 / 1e9  # KiB -> GB


def _child(ckpt: str, load_format: str) -> None:
    """The ``--child`` process: one engine start, its figures on one line, its peak RSS."""
    seconds: list[tuple[float, int]] = []
    _wrap(seconds)
    lw, whole, faults = _start(ckpt, load_format, seconds)
    print(f"CHILD {lw} {whole} {faults} {peak_rss_kib()}", flush=True)


def peak_rss_kib() -> int:
    """This process's peak RSS in KiB: ``VmHWM`` of /proc/self/status, the high-water mark of
    its own address space. Not ``ru_maxrss``, which Linux carries across ``execve`` from the
    process that forked it (a child of a bench holding 3 GB reports at least 3 GB)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise SystemExit("no VmHWM in /proc/self/status: peak RSS needs Linux")


def _wrap(seconds: list[tuple[float, int]]) -> None:
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # registers load_format="specbind"
    _timed(DefaultModelLoader, seconds)
    _timed(type(get_model_loader(_load_config("specbind"))), seconds)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("--repeat", type=int, default=5, help="pairs after the warm-up (default 5)")
    ap.add_argument("--cold", action="store_true", help="drop the checkpoint's page cache first")
    ap.add_argument("--fresh", type=int, default=0, help="pairs of one process per start")
    ap.add_argument("--child", choices=FORMATS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.child:
        _child(args.ckpt, args.child)
        return
    seconds: list[tuple[float, int]] = []
    _wrap(seconds)
    times: dict[str, list[tuple[float, ...]]] = {fmt: [] for fmt in FORMATS}
    for fmt in times:  # warm-up: imports, page cache
        _start(args.ckpt, fmt, seconds)
    load = os.getloadavg()
    for _ in range(args.repeat):
        for fmt in times:
            if args.cold:
                drop_cache(args.ckpt)
            times[fmt].append(_start(args.ckpt, fmt, seconds))
    fresh: dict[str, list[tuple[float, ...]]] = {fmt: [] for fmt in FORMATS}
    for _ in range(args.fresh):
        for fmt in fresh:
            fresh[fmt].append(_fresh(args.ckpt, fmt, args.cold))
    after = os.getloadavg()
    for row in summary(times):
        print(row)
    if args.fresh:
        print("one process per start:")
        for row in summary({f: [x[:3] for x in xs] for f, xs in fresh.items()}):
            print(row)
        rss = {f: statistics.median(x[3] for x in xs) for f, xs in fresh.items()}
        print(
            f"peak RSS of the engine's process, medians: auto {rss['auto']:.2f} GB, specbind "
            f"{rss['specbind']:.2f} GB (specbind / auto {rss['specbind'] / rss['auto']:.2f})"
        )
    cache = "dropped before each start" if args.cold else "warm"
    print(
        f"page cache {cache}; load average (1, 5, 15 min) before "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {after[0]:.2f} {after[1]:.2f} "
        f"{after[2]:.2f}; {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
