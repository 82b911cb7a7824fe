"""The lab's command line, ``python -m benchmarks`` from a clone: every row of the benchmark
suite (the full-geometry slice beside the hand-written baselines, the whole-process rows,
``--limits``, ``--quant``, ``--dequant``, ``--reload``, ``--scale``, ``--fixed-cost``, ``--ranks``,
``--loaders``). The installed ``specbind bench`` keeps only the measurement a user runs on a
checkpoint of their own (``specbind/bench.py``).

Invariant: as ``specbind``'s own commands, a refusal is one line on stderr and a non-zero exit
(1 a ``SpecbindError``, 2 a ``UsageError`` or argparse's own); results go to stdout.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from specbind.cli import JSON_HELP, _json, _scheme, _sets, _table
from specbind.core.errors import SpecbindError, UsageError


def run(a: argparse.Namespace) -> int:
    from benchmarks import main as bench

    table = _table(a.model)
    if a.repeat < 1:
        raise UsageError("--repeat must be >= 1")
    if any(n < 1 for n in a.ranks or []):
        raise UsageError("--ranks must be >= 1")
    if a.quant is not None:
        from benchmarks import quant as bench_quant

        qr = bench_quant.run(
            table, _scheme(table, a.quant), a.tp_size or [1, 2, 8], a.ep_size or [8],
            a.repeat, bench.cache_dir(a.cache), _sets(a.set),
        )  # fmt: skip
        print(_json(qr) if a.json else bench_quant.render(qr))
        return 0
    if a.dequant:
        from benchmarks import dequant as bench_dequant

        dq = bench_dequant.run(a.repeat)
        print(_json(dq) if a.json else bench_dequant.render(dq))
        return 0
    if a.reload:
        from benchmarks import reload as bench_reload

        rel = bench_reload.run(table, bench.cache_dir(a.cache), a.repeat)
        print(_json(rel) if a.json else bench_reload.render(rel))
        return 0
    if a.scale:
        from benchmarks import scale as bench_scale

        sizes = tuple(a.scale_layers or bench_scale.SIZES)
        scale = bench_scale.run(table, bench.cache_dir(a.cache), a.repeat, sizes)
        print(_json(scale) if a.json else bench_scale.render(scale))
        return 0
    if a.fixed_cost:
        from benchmarks import fixed as bench_fixed

        fixed = bench_fixed.run(bench.process_repeats(a.repeat, a.quick))
        print(_json(fixed) if a.json else bench_fixed.render(fixed))
        return 0
    tiny = a.tiny or a.quick
    if a.quick and not a.tiny:
        print("bench: --quick binds the tiny slice (a smoke run; drop --quick for full-geometry "
              "figures)", file=sys.stderr)  # fmt: skip
    thp = THP_CHOICES[a.thp]
    if a.whole:
        whole = bench.whole_only(
            table, a.tp_size or [1, 2, 8], a.repeat, bench.cache_dir(a.cache), tiny,
            _sets(a.set), thp, a.quick,
        )  # fmt: skip
        print(_json(whole) if a.json else bench.render_whole(whole))
        return 0
    if a.limits:
        lim = bench.limits_only(
            table, a.tp_size or [1, 2, 8], a.repeat, bench.cache_dir(a.cache), tiny, _sets(a.set)
        )
        print(_json(lim) if a.json else bench.render_limits(lim))
        return 0
    result = bench.run(
        table, a.tp_size or [1, 2, 8], a.repeat, bench.cache_dir(a.cache), tiny,
        rss=not a.no_rss, overrides=_sets(a.set), ranks=a.ranks or [], loaders=a.loaders,
        quick=a.quick, thp=thp,
    )  # fmt: skip
    print(_json(result) if a.json else bench.render(result))
    return 0


# --thp: the modes each whole-process row runs, interleaved in the same rounds (the first
# mode's figures are the row's own): huge pages off in both sides' processes, the machine's
# default, or both
THP_CHOICES = {"both": ("off", "default"), "off": ("off",), "default": ("default",)}


def parser() -> argparse.ArgumentParser:
    be = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="specbind's benchmark suite: speed and memory beside the loaders users "
        "would write, on a synthetic checkpoint slice of a model's spec",
    )
    be.add_argument("--model", help="model spec name (default: the spec marked default)")
    be.add_argument(
        "--set", action="append", default=[], metavar="NAME=INT", help="override a geometry symbol"
    )
    be.add_argument(
        "--tp-size", type=int, action="append", help="tp sizes to measure (default 1 2 8)"
    )
    be.add_argument("--repeat", type=int, default=3, help="timed runs per measurement (median)")
    be.add_argument(
        "--cache", help="where the checkpoint slice is kept (default: ~/.cache/specbind/bench)"
    )
    be.add_argument("--tiny", action="store_true", help="tiny geometry (a smoke run)")
    be.add_argument(
        "--quick",
        action="store_true",
        help="the tiny slice and one round of each whole-process row instead of at least 5 (a "
        "smoke run: every figure once, none worth quoting; minutes, not tens of them)",
    )
    be.add_argument(
        "--limits",
        action="store_true",
        help="only the rows of what the machine limits: a rank in memory vs memcpy, --out vs dd "
        "conv=fdatasync, planning per tensor, runai-model-streamer + NumPy (if installed)",
    )
    be.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocesses")
    be.add_argument(
        "--whole",
        action="store_true",
        help="only the whole-slice whole-process row (specbind vs the vLLM-style loader) at "
        "each tp",
    )
    be.add_argument(
        "--thp",
        choices=sorted(THP_CHOICES),
        default="both",
        help="whole-process rows: transparent huge pages off in both sides' processes "
        "(prctl PR_SET_THP_DISABLE), the machine's default, or both interleaved (default both; "
        "the output names each row's mode)",
    )
    be.add_argument(
        "--ranks",
        type=int,
        action="append",
        help="also N ranks (tp N) binding concurrently on this host beside one after another",
    )
    be.add_argument(
        "--loaders",
        action="store_true",
        help="also fastsafetensors and runai-model-streamer reading the same files (if installed)",
    )
    be.add_argument(
        "--scale",
        action="store_true",
        help="one rank's share of the real model from a sparse checkpoint (tp 8 x ep 8; tp 1 "
        "attention), streamed to a file",
    )
    be.add_argument(
        "--reload",
        action="store_true",
        help="only the reload row: open_bound(copy=True) of a rank's file beside a memcpy",
    )
    be.add_argument(
        "--scale-layers",
        type=int,
        action="append",
        help="with --scale: checkpoint sizes in layers (default 1 4 46)",
    )
    be.add_argument(
        "--fixed-cost",
        action="store_true",
        help="only the start-to-first-work row (specbind beside `import numpy, ml_dtypes`)",
    )
    be.add_argument("--json", action="store_true", help=JSON_HELP.format("the figures"))
    be.add_argument(
        "--quant",
        metavar="SCHEME",
        help="instead: one MoE layer stored as SCHEME (nvfp4-modelopt) at the real expert shapes",
    )
    be.add_argument(
        "--ep-size", type=int, action="append", help="with --quant: ep sizes (default 8)"
    )
    be.add_argument(
        "--dequant",
        action="store_true",
        help="instead: the exact BF16 dequant of one 4096 x 4096 linear per layout, one core",
    )
    return be


def main(argv: list[str] | None = None) -> int:
    """The lab's command: its exit status (0 done, 1 refused, 2 a usage error)."""
    args: Any = parser().parse_args(argv)
    try:
        return run(args)
    except UsageError as e:
        print(f"benchmarks: error: {e}", file=sys.stderr)
        return 2
    except SpecbindError as e:
        print(f"benchmarks: error: {e}", file=sys.stderr)
        return 1
