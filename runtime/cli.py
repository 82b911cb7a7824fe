"""The ``specbind`` command line.

Invariant: every refusal is one line on stderr and a non-zero exit — ``SpecbindError`` exits 2
with its message; anything else is reported as an internal error (exit 3), with the traceback
only when ``SPECBIND_DEBUG=1``. Results go to stdout; progress bars go to stderr.
Trap: ``generated`` is imported lazily, so ``specbind generate`` works when it is stale or gone.
Fixed cost: a command imports only what it uses (jinja2, jsonschema and yaml in ``generate``,
tqdm only when a bar is drawn), and the console entry ``entry`` flushes and leaves through
``os._exit``, skipping interpreter teardown (~25 ms of freeing what the OS frees anyway). Only
``entry`` does that; ``main`` returns, so tests and library callers keep their interpreter.
Bytecode: a wheel install compiles it (pip's default); an editable install writes it on the
first run unless ``PYTHONDONTWRITEBYTECODE`` is set, in which case every start recompiles
(15-20 ms) — run ``python -m compileall -q core generator runtime generated specbind`` once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import traceback
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from specbind.core.errors import SpecbindError

REPO = Path(__file__).resolve().parent.parent


def _table(name: str | None) -> Any:
    from specbind.generated import MODELS

    if name is None:
        if len(MODELS) != 1:
            raise SpecbindError(
                f"several models are generated; pick one with --model ({', '.join(MODELS)})"
            )
        return next(iter(MODELS.values()))
    if name not in MODELS:
        raise SpecbindError(f"unknown model {name!r} (generated: {', '.join(MODELS)})")
    return MODELS[name]


def _sets(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key.isidentifier():
            raise SpecbindError(f"--set {item!r}: expected NAME=INTEGER")
        if not re.fullmatch(r"-?[0-9]{1,12}", val):  # int() also takes '1_6', '+1', '１６'
            raise SpecbindError(f"--set {item!r}: {val!r} is not an integer")
        if key in out:
            raise SpecbindError(f"--set {key} is given twice ({out[key]} and {val})")
        out[key] = int(val)
    return out


def cmd_generate(a: argparse.Namespace) -> int:
    from specbind.generator.render import generate, stale

    root = Path(a.root)
    out = root / "generated"
    if a.check:
        problems = stale(root, out)
        if problems:
            print(
                f"generated/ is out of date with specs/ ({len(problems)} problem(s)):",
                file=sys.stderr,
            )
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            print("run `make generate` and commit the result", file=sys.stderr)
            return 1
        print("generated/ is up to date")
        return 0
    changed = generate(root, out)
    print(
        f"generated/: {len(changed)} file(s) written"
        + (f": {', '.join(changed)}" if changed else " (up to date)")
    )
    return 0


def cmd_synth(a: argparse.Namespace) -> int:
    from specbind.runtime.model import checked_values
    from specbind.runtime.synth import synth, tiny_values

    table = _table(a.model)
    if a.seed < 0:
        raise SpecbindError(f"--seed {a.seed}: must be >= 0")
    if a.shards is not None and a.shards < 1:
        raise SpecbindError(f"--shards {a.shards}: must be >= 1")
    base = table.default_values() if a.full else tiny_values(table)
    values = checked_values(table, base, _sets(a.set))
    layers = a.layers if a.layers is not None else (table.synth.layers if table.synth else 1)
    if a.layers is None and a.full and a.sparse:
        layers = table.real_layers  # the whole model: holes cost no disk
    summary = synth(
        table, Path(a.out), values, layers=layers, seed=a.seed, mtp=not a.no_mtp,
        shards=a.shards, gates_bf16=a.gates_bf16, nested_config=a.nested_config,
        sparse=a.sparse,
    )  # fmt: skip
    kinds = [
        f"{x['index']}:{'+'.join(x['blocks'].values())}" + ("(mtp)" if x["role"] == "mtp" else "")
        for x in summary["layers"]
    ]
    print(
        f"wrote {summary['path']}: {summary['tensors']} tensors, {summary['bytes']} B in "
        f"{summary['files']} shard(s); layers {' '.join(kinds)}"
    )
    return 0


def cmd_audit(a: argparse.Namespace) -> int:
    from specbind.runtime.audit import audit, render_text
    from specbind.runtime.checkpoint import Checkpoint

    rep = audit(Checkpoint(Path(a.ckpt)), _table(a.model), progress=a.progress)
    print(json.dumps(rep, indent=2) if a.json else render_text(rep))
    return 0


def _or(given: int | None, default: int) -> int:
    """A flag's value, or its default when absent (``bind --from`` checks only flags given)."""
    return default if given is None else given


def _note_overrides(overrides: dict[str, int]) -> None:
    """``--set`` replaces what config.json says: say so, never silently."""
    if overrides:
        shown = ", ".join(f"{k}={v}" for k, v in overrides.items())
        print(f"specbind: note: --set overrides config.json: {shown}", file=sys.stderr)


def cmd_reload(a: argparse.Namespace) -> int:
    """``bind --from PATH``: a rank's ``--out`` file loaded back, checked against these binders
    and the ranks given by flag (only those: a file says which rank it is), every byte copied."""
    import time

    from specbind.runtime.reload import open_bound

    if a.ckpt is not None:
        raise SpecbindError(f"bind: give a checkpoint or --from, not both ({a.ckpt}, {a.from_})")
    if a.out is not None or a.set:
        raise SpecbindError("bind --from: --out and --set apply to a bind from a checkpoint")
    t0 = time.perf_counter()
    f = open_bound(
        a.from_, model=a.model, tp_size=a.tp_size, tp_rank=a.tp_rank, ep_size=a.ep_size,
        ep_rank=a.ep_rank, copy=True,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    r = f.ranks
    if a.json:
        print(json.dumps({
            "path": str(f.path), "model": f.model, "tp_size": r.tp_size, "tp_rank": r.tp_rank,
            "ep_size": r.ep_size, "ep_rank": r.ep_rank, "layers": len(f.layers),
            "tensors": len(f.tensors), "bytes": f.bytes, "seconds": round(seconds, 6),
        }, indent=2))  # fmt: skip
    else:
        print(
            f"loaded {len(f.tensors)} tensor(s) of {len(f.layers)} layer(s), {f.bytes} B at tp "
            f"rank {r.tp_rank} of {r.tp_size}, ep rank {r.ep_rank} of {r.ep_size} from {f.path} "
            f"in {seconds:.3f} s (copied)"
        )
    return 0


def cmd_bind(a: argparse.Namespace) -> int:
    if a.from_ is not None:
        return cmd_reload(a)
    if a.ckpt is None:
        raise SpecbindError("bind: give a checkpoint directory, or --from a bound file")
    from specbind.generated import SPECS_SHA256
    from specbind.generated import kernels as generated_kernels
    from specbind.runtime import backends
    from specbind.runtime.bind import bind_checkpoint
    from specbind.runtime.checkpoint import Checkpoint
    from specbind.runtime.export import check_out_path
    from specbind.runtime.launcher import resolve_tp
    from specbind.runtime.model import values_from_config
    from specbind.runtime.stream_out import StreamWriter

    table = _table(a.model)
    overrides = _sets(a.set)
    tp_size, tp_rank = resolve_tp(a.tp_size, a.tp_rank, os.environ)
    backend = backends.get(a.backend, generated_kernels)
    ckpt = Checkpoint(Path(a.ckpt))
    out = None if a.out is None else check_out_path(a.out, ckpt.files(), "--out", ckpt.dirs())
    values = values_from_config(table, ckpt.config, overrides)  # refuse a bad --set first
    _note_overrides(overrides)
    run = partial(
        bind_checkpoint, ckpt, table, overrides, tp_size, tp_rank, progress=a.progress,
        backend=backend, ep_size=_or(a.ep_size, 1), ep_rank=_or(a.ep_rank, 0),
    )  # fmt: skip
    if out is None:
        result = run()
    else:  # streamed: one slot's output in memory at a time, the file whole or not at all
        meta = {
            "model": table.name,
            "specs_sha256": SPECS_SHA256,
            "tp_size": str(tp_size),
            "tp_rank": str(tp_rank),
            "ep_size": str(_or(a.ep_size, 1)),
            "ep_rank": str(_or(a.ep_rank, 0)),
            "geometry": json.dumps(values, sort_keys=True),
            "overrides": json.dumps(overrides, sort_keys=True),
        }  # "layers" is added by the writer, from the layout, before any tensor is read
        with StreamWriter(out, meta, backend) as sink:
            result = run(sink=sink)
    if a.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        row = "{:>5}  {:<7} {:<10} {:<12} {:>6} {:>14}"
        print(row.format("layer", "role", "slot", "block", "bound", "bytes"))
        for layer in result.layers:
            for slot, b in layer.slots.items():
                r = b.report
                print(row.format(layer.index, layer.role, slot, b.block, r.bound, r.bytes))
        if result.globals is not None:
            g = result.globals
            print(row.format("-", "model", "globals", g.block, g.report.bound, g.report.bytes))
        total = result.as_dict()["bytes"]
        skipped = "".join(
            f"; declared unbound, not read: {n} tensor(s) under {p}"
            for p, n in result.unbound.items()
            if n
        )
        print(
            f"bound {len(result.layers)} layer(s) and the model-level tensors, {total} B at "
            f"tp rank {result.ranks.tp_rank} of {result.ranks.tp_size}, ep rank "
            f"{result.ranks.ep_rank} of {result.ranks.ep_size} in {result.seconds:.3f} s"
            + skipped
            + (f"; wrote {a.out}" if a.out else "")
        )
    return 0


def cmd_plan(a: argparse.Namespace) -> int:
    from specbind.runtime.launcher import resolve_tp
    from specbind.runtime.planning import LayerUse, plan_report, render_text

    table = _table(a.model)
    tp_size, _ = resolve_tp(a.tp_size, 0, os.environ)
    layers: list[LayerUse] = []
    if a.ckpt:
        from specbind.runtime.bind import refuse_problems
        from specbind.runtime.checkpoint import Checkpoint
        from specbind.runtime.layout import layout
        from specbind.runtime.model import values_from_config

        ckpt = Checkpoint(Path(a.ckpt))
        values = values_from_config(table, ckpt.config, _sets(a.set))
        lay = layout(table, ckpt.names(), ckpt.config)
        refuse_problems(lay)
        for index, x in lay.layers.items():
            for fill in x.slots.values():
                assert fill.block is not None
                layers.append((index, fill.block.name, frozenset(fill.names)))
        if table.globals and lay.globals:
            layers.append((-1, table.globals, frozenset(lay.globals)))
        source = str(ckpt.root)
    else:
        from specbind.runtime.model import checked_values
        from specbind.runtime.synth import schedule

        values = checked_values(table, table.default_values(), _sets(a.set))
        geometry = table.make_geometry(values)
        for p in schedule(table, table.real_layers, mtp=table.real_mtp > 0):
            for bname in p.blocks.values():
                names = table.block(bname).names(geometry, p.groups)
                layers.append((p.index, bname, frozenset(names)))
        if table.globals:
            layers.append(
                (-1, table.globals, frozenset(table.block(table.globals).names(geometry)))
            )
        source = f"model spec: the real geometry, {table.real_layers} layers + {table.real_mtp} MTP"
    rep = plan_report(table, values, tp_size, layers, source, ep_size=_or(a.ep_size, 1))
    print(json.dumps(rep, indent=2) if a.json else render_text(rep))
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    from specbind.runtime import bench

    table = _table(a.model)
    if a.repeat < 1:
        raise SpecbindError("--repeat must be >= 1")
    if a.reload:
        from specbind.runtime import bench_reload

        rel = bench_reload.run(table, bench.cache_dir(a.cache), a.repeat)
        print(json.dumps(rel, indent=2) if a.json else bench_reload.render(rel))
        return 0
    if a.scale:
        from specbind.runtime import bench_scale

        sizes = tuple(a.scale_layers or bench_scale.SIZES)
        scale = bench_scale.run(table, bench.cache_dir(a.cache), a.repeat, sizes)
        print(json.dumps(scale, indent=2) if a.json else bench_scale.render(scale))
        return 0
    if a.fixed_cost:
        from specbind.runtime import bench_fixed

        fixed = bench_fixed.run(max(5, a.repeat))
        print(json.dumps(fixed, indent=2) if a.json else bench_fixed.render(fixed))
        return 0
    result = bench.run(
        table, a.tp_size or [1, 2, 8], a.repeat, bench.cache_dir(a.cache), a.tiny,
        rss=not a.no_rss, overrides=_sets(a.set),
    )  # fmt: skip
    print(json.dumps(result, indent=2) if a.json else bench.render(result))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specbind", description="Spec-driven strict tensor binders.")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="validate specs/ and render generated/")
    g.add_argument(
        "--check", action="store_true", help="exit 1 if generated/ is stale or has orphans"
    )
    g.add_argument(
        "--root", default=str(REPO), help="repository root holding specs/ and generated/"
    )
    g.set_defaults(func=cmd_generate)

    def common(sp: argparse.ArgumentParser, sets: bool = True) -> None:
        sp.add_argument("--model", help="model spec name (default: the only one)")
        if not sets:
            return  # the census reads names, dtypes and shapes: no geometry to override
        sp.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="NAME=INT",
            help="override a geometry symbol",
        )

    def progress(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--progress",
            dest="progress",
            action="store_true",
            default=None,
            help="always show progress",
        )
        sp.add_argument(
            "--no-progress", dest="progress", action="store_false", help="never show progress"
        )

    s = sub.add_parser("synth", help="write a synthetic checkpoint in the HF layout")
    s.add_argument("out")
    size = s.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true", help="the spec's tiny geometry (default)")
    size.add_argument("--full", action="store_true", help="the model's real geometry")
    s.add_argument(
        "--layers", type=int, default=None, help="decoder layers (default: the spec's synth.layers)"
    )
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--shards", type=int, default=None, help="number of shard files")
    s.add_argument("--no-mtp", action="store_true", help="omit the MTP layer")
    s.add_argument("--nested-config", action="store_true", help="put the fields under text_config")
    s.add_argument(
        "--sparse",
        action="store_true",
        help="headers only, data left as holes (zeros, no disk); ~5 GB shards unless --shards",
    )
    s.add_argument(
        "--gates-bf16",
        action="store_true",
        help="write every F32 tensor as BF16 (a model cast wholesale: a broken checkpoint)",
    )
    common(s)
    s.set_defaults(func=cmd_synth)

    au = sub.add_parser("audit", help="census of every tensor of a checkpoint")
    au.add_argument("ckpt")
    au.add_argument("--json", action="store_true")
    common(au, sets=False)
    progress(au)
    au.set_defaults(func=cmd_audit)

    def tp(sp: argparse.ArgumentParser, rank: bool) -> None:
        sp.add_argument(
            "--tp-size",
            type=int,
            help="tensor-parallel size (default: WORLD_SIZE, OMPI_COMM_WORLD_SIZE, 1)",
        )
        sp.add_argument(
            "--ep-size", type=int, help="expert-parallel size: experts split whole (default 1)"
        )
        if rank:
            sp.add_argument(
                "--tp-rank", type=int, help="this rank (default: RANK, OMPI_COMM_WORLD_RANK, 0)"
            )
            sp.add_argument("--ep-rank", type=int, help="this expert-parallel rank (default 0)")

    b = sub.add_parser("bind", help="bind this rank's share of every tensor strictly")
    b.add_argument("ckpt", nargs="?", help="the checkpoint directory (or --from)")
    b.add_argument(
        "--from",
        dest="from_",
        metavar="PATH",
        help="load a rank's --out file back instead, checked against these binders and the "
        "rank flags given",
    )
    b.add_argument("--json", action="store_true")
    b.add_argument("--out", help="write this rank's bound weights to this .safetensors file")
    b.add_argument(
        "--backend",
        choices=["numpy", "cupy"],
        default="numpy",
        help="numpy: host memory; cupy: a CUDA device (the gpu extra)",
    )
    tp(b, rank=True)
    common(b)
    progress(b)
    b.set_defaults(func=cmd_bind)

    pl = sub.add_parser("plan", help="every tensor's local shape and bytes on every rank")
    pl.add_argument("ckpt", nargs="?", help="a checkpoint (geometry from its config.json)")
    pl.add_argument("--json", action="store_true")
    tp(pl, rank=False)
    common(pl)
    pl.set_defaults(func=cmd_plan)

    be = sub.add_parser("bench", help="speed and memory beside the loader users would write")
    be.add_argument(
        "--tp-size", type=int, action="append", help="tp sizes to measure (default 1 2 8)"
    )
    be.add_argument("--repeat", type=int, default=3, help="timed runs per measurement (median)")
    be.add_argument(
        "--cache", help="where the checkpoint slice is kept (default: ~/.cache/specbind/bench)"
    )
    be.add_argument("--tiny", action="store_true", help="tiny geometry (a smoke run)")
    be.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocesses")
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
    be.add_argument("--json", action="store_true")
    common(be)
    be.set_defaults(func=cmd_bench)
    return p


def entry() -> NoReturn:
    """The ``specbind`` console script and ``python -m specbind``: ``main``, then exit without
    interpreter teardown, once stdout and stderr are flushed (nothing else is buffered: files are
    written through ``atomic_writer``, which closes them before ``main`` returns)."""
    rc = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BrokenPipeError, ValueError):  # reader gone, or stream closed
            stream.flush()
    os._exit(rc)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        rc: int = args.func(args)
        return rc
    except SpecbindError as e:
        print(f"specbind: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout closed early (`| head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("specbind: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # a path the user gave that cannot be read or written as asked
        where = f"{e.filename}: " if e.filename else ""
        print(f"specbind: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug in specbind: say so, in one line
        if os.environ.get("SPECBIND_DEBUG") == "1":
            traceback.print_exc()
        print(
            f"specbind: internal error: {type(e).__name__}: {e} "
            "(SPECBIND_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 3
