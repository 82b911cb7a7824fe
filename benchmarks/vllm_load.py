"""Load time inside vLLM: ``load_format="specbind"`` beside vLLM's default loader.

    python -m benchmarks.vllm_load CKPT [--repeat R] [--cold] [--fresh N] [--tp T] [--copy]
    python -m benchmarks.vllm_load --write NAME DIR   (writes CKPT; NAME: CHECKPOINTS)

(both in the vLLM venv, PYTHONPATH the clone)

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
``--tp T`` (T > 1): vLLM's ``mp`` executor, one worker process per rank; vLLM-CPU spawns
them, and spawn imports this module in each (as ``__mp_main__``), which wraps the loaders
there too (the module's last lines); each worker appends its rank's figures to the file named
by ``TIMES_ENV``, read back after each start: each rank's and the slowest rank's (what the
engine waits for) are reported.
Each start also counts the bytes ``load_weights`` had read from storage (``read_bytes`` of
/proc/self/io, every rank's): with the page cache dropped, what shows each loader read the
checkpoint from the disk. ``--copy``: a third side in the same rounds, specbind with its file
maps off (``model_loader_extra_config={"mmap": False}``: every field copied into memory of
its own), so the share of the maps is measured, not inferred.
``--write NAME DIR``: the checkpoints of the issue's rows (``CHECKPOINTS``: specbind's synth,
seeded random values, at a real per-tensor geometry).
Trap: the machine's load moves every figure; read them only side by side, from one run.
Trap: at tp > 1 the weights live in the workers, so ``--fresh``'s peak RSS (this process's)
would not measure them: refused there.
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
# ``--copy``'s third side: specbind with its file maps off (every field copied into memory of
# its own), beside the other two in the same rounds.
COPY = "specbind-copy"
SIDES = (*FORMATS, COPY)


def _side(side: str) -> tuple[str, dict[str, Any]]:
    """A side's (load_format, model_loader_extra_config)."""
    return ("specbind", {"mmap": False}) if side == COPY else (side, {})


TIMES_ENV = "SPECBIND_BENCH_LOAD_TIMES"  # the file every process's wrapper appends its figures to

# The checkpoints: (model spec, decoder layers, shards, geometry). Llama: 1.34 GB.
# Qwen3-MoE: 4.3 GB, 48 experts of 768 (vLLM's fused MoE: sizes multiples of 32), the experts
# 86 % of the bytes, stored one tensor per expert and projection as the Hub's are.
CHECKPOINTS: dict[str, tuple[str, int, int, dict[str, int]]] = {
    "llama-1.34g": ("llama", 12, 2, {
        "hidden": 2048, "heads": 16, "kv_heads": 4, "head_dim": 128, "intermediate": 5632,
        "vocab": 32000,
    }),
    "qwen3-moe-4g": ("qwen3-moe", 8, 3, {
        "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128, "moe_intermediate": 768,
        "experts": 48, "intermediate": 6144, "vocab": 32000,
    }),
    # DeepSeek-V3's first three layers (MLA, dense MLP: first_k_dense_replace 3, CONFIG) at
    # its real geometry, vocab 32000: 4.4 GB, the MLA row of the issue.
    "deepseek-v3-mla-4g": ("deepseek-v3", 3, 8, {
        "hidden": 7168, "heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "intermediate": 18432, "moe_intermediate": 2048, "experts": 256, "shared_experts": 1,
        "vocab": 32000,
    }),
}  # fmt: skip
# A checkpoint's config.json values over its spec's synth config (which layers are dense).
CONFIG: dict[str, dict[str, Any]] = {"deepseek-v3-mla-4g": {"first_k_dense_replace": 3}}


def checkpoint_table(name: str) -> Any:
    """The model table ``name`` of ``CHECKPOINTS`` is written by: its spec's, with ``CONFIG``'s
    values over the spec's synth config (which layers are dense)."""
    from specbind.api import model_table

    table = model_table(CHECKPOINTS[name][0], "--write", {}, None)
    if name in CONFIG and table.synth is not None:
        import json

        from specbind.core.record import replace

        config = json.loads(table.synth.config_json) | CONFIG[name]
        table = replace(table, synth=replace(table.synth, config_json=json.dumps(config)))
    return table


def write_checkpoint(name: str, out: Path) -> dict[str, Any]:
    """Write the checkpoint ``name`` of ``CHECKPOINTS`` to ``out`` (seeded random values)."""
    from specbind.synth import synth

    if name not in CHECKPOINTS:
        raise SystemExit(f"--write {name!r}: unknown checkpoint (one of {', '.join(CHECKPOINTS)})")
    _, layers, shards, values = CHECKPOINTS[name]
    table = checkpoint_table(name)
    got = synth(table, out, values, layers=layers, shards=shards, mtp=False)
    hub_names(out)
    return got


HEAD = "lm_head."  # the one top-level module of a Hub causal LM; the rest lives under model.


def hub_name(name: str) -> str:
    """A tensor's name as a Hub causal-LM checkpoint stores it (what vLLM's own loader maps):
    synth writes the decoder's own names (``layers.0.…``), the Hub's nest them under
    ``model.``; the LM head stays top-level."""
    return name if name.startswith(HEAD) or name.startswith("model.") else "model." + name


def hub_names(ckpt: Path) -> None:
    """Rename every tensor of ``ckpt`` by ``hub_name``: each shard's header rewritten (8-byte
    aligned, as safetensors pads it), its data bytes copied after it unchanged."""
    import json
    import shutil
    import struct

    for f in sorted(ckpt.glob("*.safetensors")):
        tmp = f.with_suffix(".tmp")
        with open(f, "rb") as src, open(tmp, "wb") as dst:
            (n,) = struct.unpack("<Q", src.read(8))
            header = json.loads(src.read(n))
            renamed = {k if k == "__metadata__" else hub_name(k): v for k, v in header.items()}
            text = json.dumps(renamed, separators=(",", ":")).encode()
            text += b" " * (-len(text) % 8)
            dst.write(struct.pack("<Q", len(text)) + text)
            shutil.copyfileobj(src, dst, 64 << 20)
        os.replace(tmp, f)
    index = ckpt / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"] = {hub_name(k): v for k, v in doc["weight_map"].items()}
    index.write_text(json.dumps(doc, indent=2) + "\n")


def _rank() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # no parallel state (a bare loader call): the only rank
        return 0


def _record(kind: str, took: float, faults: int, disk: int) -> None:
    """Append one figure of this process to ``TIMES_ENV``'s file: ``kind rank s faults disk``
    (disk: bytes this process had read from storage, not from the page cache)."""
    path = os.environ.get(TIMES_ENV)
    if path:
        with open(path, "a", encoding="ascii") as f:
            f.write(f"{kind} {_rank()} {took} {faults} {disk}\n")


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _disk() -> int:
    """Bytes this process has had read from storage (``read_bytes`` of /proc/self/io): what
    shows that, with the page cache dropped, a loader read the checkpoint from the disk."""
    with open("/proc/self/io", encoding="ascii") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


PROFILE_ENV = "SPECBIND_BENCH_PROFILE"  # a folder: each timed call's cProfile stats go there


def _call(kind: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, recorded as ``kind`` (and profiled where ``PROFILE_ENV`` says)."""
    folder = os.environ.get(PROFILE_ENV)
    prof = None
    if folder:
        import cProfile

        prof = cProfile.Profile()
    faults, disk, t0 = _faults(), _disk(), time.perf_counter()
    try:
        return fn(*args, **kwargs) if prof is None else prof.runcall(fn, *args, **kwargs)
    finally:
        _record(kind, time.perf_counter() - t0, _faults() - faults, _disk() - disk)
        if prof is not None and folder:
            prof.dump_stats(os.path.join(folder, f"{kind}-{os.getpid()}-{time.time_ns()}.prof"))


def _timed(cls: Any) -> None:
    """Wrap ``cls.load_weights`` so each call records its wall time and minor faults."""
    inner = cls.load_weights
    if getattr(inner, "_bench", False):
        return

    def load_weights(self: Any, model: Any, model_config: Any) -> None:
        _call("lw", inner, self, model, model_config)

    load_weights._bench = True  # type: ignore[attr-defined]
    cls.load_weights = load_weights


def _timed_post() -> None:
    """Wrap vLLM's ``process_weights_after_loading`` (as its base loader calls it)."""
    from vllm.model_executor.model_loader import base_loader

    inner = base_loader.process_weights_after_loading
    if getattr(inner, "_bench", False):
        return

    def process_weights_after_loading(*args: Any, **kwargs: Any) -> Any:
        return _call("post", inner, *args, **kwargs)

    process_weights_after_loading._bench = True  # type: ignore[attr-defined]
    base_loader.process_weights_after_loading = process_weights_after_loading


def take_records(path: str) -> list[str]:
    """The record lines of ``path`` since the last call (the file is emptied)."""
    with open(path, "r+", encoding="ascii") as f:
        lines = f.read().splitlines()
        f.seek(0)
        f.truncate()
    return [ln for ln in lines if ln.strip()]


def one_start(lines: list[str], tp: int, load_format: str) -> tuple[float, ...]:
    """One start's figures from its record lines: (slowest rank's load_weights s, its minor
    faults, slowest post-processing s, bytes read from storage by load_weights on all ranks,
    each rank's load_weights s ...)."""
    rows = [ln.split() for ln in lines]
    lw = {int(r): (float(s), int(n)) for k, r, s, n, _ in rows if k == "lw"}
    post = [float(s) for k, _, s, _, _ in rows if k == "post"]
    disk = sum(int(d) for k, _, _, _, d in rows if k == "lw")
    if sorted(lw) != list(range(tp)) or sum(k == "lw" for k, *_ in rows) != tp:
        got = sorted(int(r) for k, r, *_ in rows if k == "lw")
        raise SystemExit(
            f"{load_format}: load_weights ran on ranks {got}, expected each of 0..{tp - 1} once"
        )
    took, faults = max(lw.values())
    ranks = (lw[r][0] for r in range(tp))
    return (took, float(faults), max(post, default=0.0), float(disk), *ranks)


def drop_cache(ckpt: str) -> None:
    """Drop the checkpoint's files from the page cache (their pages only; no root needed)."""
    for p in Path(ckpt).glob("*.safetensors"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _start(ckpt: str, load_format: str, tp: int) -> tuple[float, ...]:
    """(load_weights s, whole LLM(...) s, minor faults of load_weights, post-processing s,
    bytes load_weights read from storage, each rank's load_weights s ...) of one engine start
    (at tp > 1, the slowest rank's)."""
    import gc

    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    path = os.environ[TIMES_ENV]
    take_records(path)  # an earlier start's strays, if any
    extra: dict[str, Any] = {"distributed_executor_backend": "mp"} if tp > 1 else {}
    fmt, config = _side(load_format)
    if config:
        extra["model_loader_extra_config"] = config
    t0 = time.perf_counter()
    llm: Any = LLM(
        model=ckpt, load_format=fmt, dtype="bfloat16", skip_tokenizer_init=True,
        enforce_eager=True, max_model_len=64, max_num_seqs=2, tensor_parallel_size=tp, **extra,
    )  # fmt: skip
    whole = time.perf_counter() - t0
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    lw, faults, post, disk, *ranks = one_start(take_records(path), tp, load_format)
    return (lw, whole, faults, post, disk, *ranks)


def _load_config(load_format: str) -> Any:
    from vllm.config.load import LoadConfig

    return LoadConfig(load_format=load_format)


def summary(times: dict[str, list[tuple[float, ...]]]) -> list[str]:
    """The printed rows: each loader's min and median of each figure, then the ratios. A start
    is (load_weights s, LLM(...) s, minor faults[, post-processing s[, bytes read from
    storage[, each rank's load_weights s ...]]])."""
    rows = []
    med: dict[str, list[float]] = {}
    for fmt, xs in times.items():
        if not xs:  # no start of this loader in this run (--repeat 0)
            continue
        cols = list(zip(*xs, strict=True))
        med[fmt] = [statistics.median(c) for c in cols]
        lw, whole = cols[0], cols[1]
        row = (
            f"{fmt:13s} load_weights: median {med[fmt][0]:.3f} s (min {min(lw):.3f}); "
            f"LLM(...): median {med[fmt][1]:.3f} s (min {min(whole):.3f}); minor faults "
            f"median {med[fmt][2]:.0f}"
        )
        if len(cols) > 3:
            row += f"; post-processing median {med[fmt][3]:.3f} s"
        if len(cols) > 4:
            row += f"; read from disk median {med[fmt][4] / 1e9:.2f} GB"
        if len(cols) > 6:  # tp > 1: load_weights above is the slowest rank's
            row += "; per rank " + ", ".join(
                f"{r}: {statistics.median(c):.3f} (min {min(c):.3f})"
                for r, c in enumerate(cols[5:])
            )
        rows.append(row + f" ({len(xs)} starts)")
    if "auto" in med and all(med["auto"][:2]):
        theirs = med["auto"]
        for side in (s for s in SIDES[1:] if s in med):
            ours = med[side]
            rows.append(
                f"{side} / auto, medians: load_weights {ours[0] / theirs[0]:.2f}, "
                f"LLM(...) {ours[1] / theirs[1]:.2f}"
            )
    return rows


def _fresh(ckpt: str, load_format: str, cold: bool) -> tuple[float, ...]:
    """One engine start in a process of its own: (load_weights s, LLM(...) s, minor faults of
    load_weights, post-processing s, bytes read from storage, peak RSS GB of the process)."""
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
    lw, whole, faults, post, disk, rss = (float(x) for x in line[-1].split()[1:])
    return lw, whole, faults, post, disk, rss * 1024 / 1e9  # KiB -> GB


def _child(ckpt: str, load_format: str) -> None:
    """The ``--child`` process: one engine start, its figures on one line, its peak RSS."""
    _wrap()
    lw, whole, faults, post, disk, *_ = _start(ckpt, load_format, 1)
    print(f"CHILD {lw} {whole} {faults} {post} {disk} {peak_rss_kib()}", flush=True)


def peak_rss_kib() -> int:
    """This process's peak RSS in KiB: ``VmHWM`` of /proc/self/status, the high-water mark of
    its own address space. Not ``ru_maxrss``, which Linux carries across ``execve`` from the
    process that forked it (a child of a bench holding 3 GB reports at least 3 GB)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise SystemExit("no VmHWM in /proc/self/status: peak RSS needs Linux")


def compile_specbind() -> str:
    """Compile specbind's bytecode (``__pycache__``, as installing its wheel does), and say so.
    Trap: a fresh process (``--fresh``, every tp worker) imports specbind inside
    ``load_weights``; from a clone run with ``PYTHONDONTWRITEBYTECODE`` set nothing is cached,
    and each start compiled ~100 modules there (0.36 s of one core), a cost no installed user
    pays and vLLM's own (precompiled) loader never does."""
    import compileall

    import specbind

    root = Path(specbind.__file__).resolve().parent
    # by walking: compileall.compile_dir skips the package's symlinked folders (generated/)
    files = [Path(d) / f for d, _, fs in os.walk(root, followlinks=True) for f in fs]
    ok = all(compileall.compile_file(str(f), quiet=2) for f in files if f.suffix == ".py")
    return f"specbind's bytecode compiled under {root} ({'ok' if ok else 'with errors'})"


def _wrap() -> None:
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # registers load_format="specbind"
    _timed(DefaultModelLoader)
    _timed(type(get_model_loader(_load_config("specbind"))))
    _timed_post()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", nargs="?")
    ap.add_argument("--repeat", type=int, default=5, help="pairs after the warm-up (default 5)")
    ap.add_argument("--cold", action="store_true", help="drop the checkpoint's page cache first")
    ap.add_argument("--fresh", type=int, default=0, help="pairs of one process per start")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    ap.add_argument("--write", nargs=2, metavar=("NAME", "DIR"), help="write a checkpoint")
    ap.add_argument("--copy", action="store_true", help=f"a third side: {COPY} (mmap off)")
    ap.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.write:
        got = write_checkpoint(args.write[0], Path(args.write[1]))
        print(f"wrote {got['path']}: {got['tensors']} tensors, {got['bytes'] / 1e9:.2f} GB")
        return
    if not args.ckpt:
        ap.error("CKPT is required (or --write NAME DIR)")
    if args.tp < 1:
        ap.error(f"--tp {args.tp}: expected a positive size")
    if args.fresh and args.tp > 1:
        ap.error("--fresh measures the engine's own process; at --tp > 1 the weights live in "
                 "the workers: run --fresh at --tp 1")  # fmt: skip
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.tp > 1:  # one OpenMP thread bound per rank
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(map(str, range(args.tp))))
    if TIMES_ENV not in os.environ:
        import atexit
        import tempfile

        fd, path = tempfile.mkstemp(prefix="specbind-bench-", suffix=".times")
        os.close(fd)
        atexit.register(os.unlink, path)
        os.environ[TIMES_ENV] = path
    if not args.child:
        print(compile_specbind(), flush=True)
    _wrap()
    if args.child:
        _child(args.ckpt, args.child)
        return
    sides = SIDES if args.copy else FORMATS
    times: dict[str, list[tuple[float, ...]]] = {fmt: [] for fmt in sides}
    for fmt in times:  # warm-up: imports, page cache
        _start(args.ckpt, fmt, args.tp)
    load = os.getloadavg()
    for _ in range(args.repeat):
        for fmt in times:
            if args.cold:
                drop_cache(args.ckpt)
            times[fmt].append(_start(args.ckpt, fmt, args.tp))
    fresh: dict[str, list[tuple[float, ...]]] = {fmt: [] for fmt in sides}
    for _ in range(args.fresh):
        for fmt in fresh:
            fresh[fmt].append(_fresh(args.ckpt, fmt, args.cold))
    after = os.getloadavg()
    print(f"tp {args.tp}" + (" (load_weights: the slowest rank's)" if args.tp > 1 else ""))
    for row in summary(times):
        print(row)
    if args.fresh:
        print("one process per start:")
        for row in summary({f: [x[:5] for x in xs] for f, xs in fresh.items()}):
            print(row)
        rss = {f: statistics.median(x[5] for x in xs) for f, xs in fresh.items()}
        print(
            "peak RSS of the engine's process, medians: "
            + ", ".join(f"{f} {gb:.2f} GB" for f, gb in rss.items())
            + "; "
            + ", ".join(f"{f} / auto {rss[f] / rss['auto']:.2f}" for f in rss if f != "auto")
        )
    cache = "dropped before each start" if args.cold else "warm"
    print(
        f"page cache {cache}; load average (1, 5, 15 min) before "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {after[0]:.2f} {after[1]:.2f} "
        f"{after[2]:.2f}; {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
elif __name__ == "__mp_main__" and os.environ.get(TIMES_ENV):
    # a vLLM worker: vLLM-CPU spawns them, and spawn imports the parent's main module under
    # this name, so each worker wraps its own loaders here before its engine starts
    _wrap()
