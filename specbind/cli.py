"""The ``specbind`` command line.

Invariant: every refusal is one line on stderr and a non-zero exit, by ``EXIT``: 1 a refusal
(a ``SpecbindError``: the checkpoint, config, spec or bound file is wrong, or the system would
not let the work finish; ``audit`` with a problem; ``generate --check`` when stale), 2 a usage
error (argparse's own, or a ``UsageError``: a flag, a value, a path that is not there), 3 an
internal error (anything else: a bug, the traceback only when ``SPECBIND_DEBUG=1``), 130 / 143
interrupted / terminated. Results go to stdout; progress bars go to stderr.
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
import importlib
import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

from specbind.core.errors import SpecbindError, UsageError

if TYPE_CHECKING:
    from specbind.runtime.bind.bind_options import BindOptions

# The folder that holds specs/ and generated/: the repository root in a checkout (specbind/
# links to the top-level folders), the installed package in a wheel. Resolved through the
# generated/ link so it holds even while `make drift` has removed generated/.
REPO = (Path(__file__).resolve().parent / "generated").resolve().parent

# The exit statuses of every command (README, CLI): what a script or CI may branch on.
EXIT = {"ok": 0, "refused": 1, "usage": 2, "internal": 3, "interrupted": 130, "terminated": 143}


def _table(name: str | None, ckpt: str | None = None) -> Any:
    """The model named by --model (refused when the checkpoint's config.json ``model_type``
    belongs to another model); else as ``specbind.api.model_table`` picks it, by that
    ``model_type`` when several models are generated."""
    from specbind.api import model_table
    from specbind.runtime.io.checkpoint import CheckpointDir

    config = None
    if ckpt is not None:  # also with --model: a checkpoint naming another model is refused
        try:
            config = CheckpointDir(Path(ckpt)).config
        except SpecbindError:
            config = None  # the command itself reports the unreadable checkpoint
    return model_table(name, "--model", config)


def _json(rep: dict[str, Any]) -> str:
    """A command's ``--json`` output: ``rep`` with ``specbind_version`` first, in every one."""
    from specbind.version import __version__

    return json.dumps({"specbind_version": __version__, **rep}, indent=2)


def _sets(items: list[str]) -> dict[str, int]:
    from specbind.core.shown import shown

    out: dict[str, int] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--set {shown(item)}: expected NAME=INTEGER")
        if not re.fullmatch(r"-?[0-9]{1,12}", val):  # int() also takes '1_6', '+1', '１６'
            raise UsageError(f"--set {shown(item)}: {shown(val)} is not an integer")
        if key in out:
            raise UsageError(f"--set {key} is given twice ({out[key]} and {val})")
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
    from specbind.generator.engines import unproven

    for rel in unproven(root):
        print(
            f"note: {rel} is unproven: no test proves it against the engine's own loader "
            "(no proof:); bind_for_engine warns wherever it is used",
            file=sys.stderr,
        )
    return 0


def cmd_synth(a: argparse.Namespace) -> int:
    from specbind.runtime.layout.config import checked_values
    from specbind.synth import synth, tiny_values

    table = _table(a.model)
    if a.seed < 0:
        raise UsageError(f"--seed {a.seed}: must be >= 0")
    if a.shards is not None and a.shards < 1:
        raise UsageError(f"--shards {a.shards}: must be >= 1")
    base = table.default_values() if a.full else tiny_values(table)
    values = checked_values(table, base, _sets(a.set))
    layers = a.layers if a.layers is not None else (table.synth.layers if table.synth else 1)
    scheme = _scheme(table, a.quant) if a.quant is not None else None
    if a.layers is None and a.full and a.sparse:
        layers = table.real_layers  # the whole model: holes cost no disk
    summary = synth(
        table, Path(a.out), values, layers=layers, seed=a.seed, mtp=not a.no_mtp,
        shards=a.shards, gates_bf16=a.gates_bf16, nested_config=a.nested_config, quant=scheme,
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
    from specbind.audit import audit, render_text
    from specbind.runtime.io.checkpoint import CheckpointDir

    overrides = _sets(a.set)
    table = _table(a.model, a.ckpt)
    ckpt = CheckpointDir(Path(a.ckpt))
    picture = None
    if a.svg is not None:  # checked before the work, written after it
        from specbind import svg

        with _usage():  # the path given is wrong, not the checkpoint (as --out)
            picture = svg.target(a.svg, ckpt.files(), dirs=ckpt.dirs())
    rep = audit(
        ckpt,
        table,
        progress=a.progress,
        overrides=overrides,
        mtp=not a.no_mtp,
        verify=not a.names_only,
        allow_unshared_scales=a.allow_unshared_scales,
    )
    _note_overrides(overrides)  # after audit has refused a --set naming no symbol
    if picture is not None:
        from specbind.audit_svg import render_svg

        svg.write(
            picture, render_svg(rep, {b.name: [r.name for r in b.tensors] for b in table.blocks})
        )
    print(_json(rep) if a.json else render_text(rep, a.verbose))
    return EXIT["ok"] if rep["ok"] else EXIT["refused"]


@contextlib.contextmanager
def _usage() -> Iterator[None]:
    """A refusal raised in here is about what the command line gave (an ``--out`` path), not
    about the checkpoint: reported as a usage error."""
    try:
        yield
    except UsageError:
        raise
    except SpecbindError as e:
        raise UsageError(str(e)) from None


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

    from specbind.api import open_bound

    if a.ckpt is not None:
        raise UsageError(f"bind: give a checkpoint or --from, not both ({a.ckpt}, {a.from_})")
    if a.out is not None or a.set:
        raise UsageError("bind --from: --out and --set apply to a bind from a checkpoint")
    if not os.path.lexists(a.from_):  # a path not there is the command line's, not the file's
        raise UsageError(f"{a.from_}: cannot open: No such file or directory")
    t0 = time.perf_counter()
    f = open_bound(
        a.from_, model=a.model, tp_size=a.tp_size, tp_rank=a.tp_rank, ep_size=a.ep_size,
        ep_rank=a.ep_rank, copy=True,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    r = f.ranks
    if a.json:
        print(_json({
            "path": str(f.path), "model": f.model, "tp_size": r.tp_size, "tp_rank": r.tp_rank,
            "ep_size": r.ep_size, "ep_rank": r.ep_rank, "layers": len(f.layers),
            "tensors": len(f.tensors), "bytes": f.bytes, "seconds": round(seconds, 6),
        }))  # fmt: skip
    else:
        print(
            f"loaded {len(f.tensors)} tensor(s) of {len(f.layers)} layer(s), {f.bytes} B at tp "
            f"rank {r.tp_rank} of {r.tp_size}, ep rank {r.ep_rank} of {r.ep_size} from {f.path} "
            f"in {seconds:.3f} s (copied)"
        )
    return 0


def cmd_bind(a: argparse.Namespace) -> int:
    from specbind.runtime.ranks.comm import launched

    if a.from_ is not None:
        return cmd_reload(a)
    if a.ckpt is None:
        raise UsageError("bind: give a checkpoint directory, or --from a bound file")
    if a.out_dir is not None or launched(os.environ):
        return cmd_bind_ranks(a)
    from specbind.core.planning import Ranks
    from specbind.generated import SPECS_SHA256
    from specbind.launcher import resolve_ep, resolve_tp
    from specbind.runtime.bind.bind import ReportOnly, bind_checkpoint
    from specbind.runtime.binder import backends
    from specbind.runtime.io.checkpoint import CheckpointDir
    from specbind.runtime.layout.config import values_from_config

    table = _table(a.model, a.ckpt)
    overrides = _sets(a.set)
    opts = _options(a)
    tp_size, tp_rank = resolve_tp(a.tp_size, a.tp_rank, os.environ)
    ep_size, ep_rank = resolve_ep(a.ep_size, a.ep_rank)
    backend = backends.get(a.backend, _kernels(a.backend))
    ckpt = CheckpointDir(Path(a.ckpt))
    out = None
    if a.out is not None:  # the writer's modules only when there is a file to write
        from specbind.runtime.io.out_path import check_out_path

        with _usage():  # the path given is wrong, not the checkpoint
            out = check_out_path(a.out, ckpt.files(), "--out", ckpt.dirs())
    values = values_from_config(table, ckpt.config, overrides)  # refuse a bad --set first
    _note_overrides(overrides)
    run = partial(
        bind_checkpoint, ckpt, table, overrides, tp_size, tp_rank, backend=backend,
        ep_size=ep_size, ep_rank=ep_rank, **opts.bind_kwargs(),
    )  # fmt: skip
    if out is None:  # checks and reports only: each slot dropped once bound
        result = run(sink=ReportOnly())
    else:  # streamed: one slot's output in memory at a time, the file whole or not at all
        from specbind.runtime.bound.bound_format import BoundMeta
        from specbind.runtime.bound.stream_out import StreamWriter

        ranks = Ranks(tp_size, tp_rank, ep_size, ep_rank)
        head = BoundMeta(
            table.name, SPECS_SHA256, ranks, values, overrides,
            padding=table.padding(values, ranks),
        )  # fmt: skip
        with StreamWriter(out, head, backend, ckpt.files(), ckpt.dirs()) as sink:
            result = run(sink=sink)  # it refuses a shard that shrank before the file is kept
    if a.json:
        print(_json(result.as_dict()))
    else:
        from specbind.bind_report import render_text

        print(render_text(result.as_dict(), a.verbose, a.out))
    return 0


def _kernels(backend: str) -> Any:
    """The generated kernels' module for the cupy backend; the numpy backend runs none."""
    if backend != "cupy":
        return None
    from specbind.generated import kernels

    return kernels


def _options(a: argparse.Namespace) -> BindOptions:
    """``bind``'s binding flags as the ``BindOptions`` the API takes too."""
    from specbind.runtime.bind.bind_options import BindOptions

    return BindOptions(
        quant_output=tuple(a.quant_output or ()),
        allow_unshared_scales=a.allow_unshared_scales,
        progress=a.progress,
        mtp=not a.no_mtp,
    )


def cmd_bind_ranks(a: argparse.Namespace) -> int:
    """``bind`` under torchrun (every rank at once), or ``bind --out-dir`` (a world of one)."""
    from specbind.generated import SPECS_SHA256
    from specbind.generated import kernels as generated_kernels
    from specbind.runtime.binder import backends
    from specbind.runtime.ranks import distributed
    from specbind.runtime.ranks.comm import Comm, LocalComm, TorchComm, launched

    if a.out is not None:
        raise UsageError(
            "--out under torchrun: every rank would write the same file; use --out-dir"
        )
    for flag, value in (("--tp-rank", a.tp_rank), ("--ep-rank", a.ep_rank)):
        if value is not None:
            raise UsageError(
                f"{flag} with --out-dir or under torchrun: the rank comes from the process "
                "group (rank = ep_rank * tp_size + tp_rank)"
            )
    if a.timeout <= 0:
        raise UsageError(f"--timeout {a.timeout:g}: must be > 0 seconds")
    opts = _options(a)
    job = distributed.Job(
        ckpt=Path(a.ckpt), table=_table(a.model, a.ckpt), specs_sha256=SPECS_SHA256,
        overrides=_sets(a.set), tp_size=a.tp_size, ep_size=_or(a.ep_size, 1),
        backend=backends.get(a.backend, generated_kernels),
        out_dir=None if a.out_dir is None else Path(a.out_dir), progress=opts.progress,
        allow_unshared_scales=opts.allow_unshared_scales, quant_outputs=opts.quant_output,
        mtp=opts.mtp,
    )  # fmt: skip
    if a.backend == "cupy" and launched(os.environ):  # each rank binds on its own device
        importlib.import_module("cupy").cuda.Device(int(os.environ.get("LOCAL_RANK", "0"))).use()
    comm: Comm = TorchComm(os.environ, a.timeout) if launched(os.environ) else LocalComm()
    try:
        # flags the world cannot hold: the same usage error on every rank, before any work
        distributed.place(comm.world, comm.rank, a.tp_size, _or(a.ep_size, 1))
        rep = distributed.run(job, comm)
    finally:
        comm.close()
    if rep is not None:
        print(_json(rep) if a.json else distributed.render(rep))
    return 0


def cmd_plan(a: argparse.Namespace) -> int:
    from specbind.launcher import resolve_tp
    from specbind.plan_report import LayerUse, plan_report, render_text
    from specbind.runtime.binder.quant import LayerQuant

    table = _table(a.model, a.ckpt)
    tp_size, _ = resolve_tp(a.tp_size, 0, os.environ)
    layers: list[LayerUse] = []
    quant: dict[tuple[int, str], LayerQuant | None] = {}
    ckpt_files: list[Path] = []
    ckpt_dirs: list[Path] = []  # no picture inside them, as no --out
    if a.ckpt:
        from specbind.plan_report import checkpoint_layers
        from specbind.runtime.io.checkpoint import CheckpointDir
        from specbind.runtime.layout.config import values_from_config

        if a.quant is not None:
            raise UsageError("--quant plans the spec's model; a checkpoint says its own")
        ckpt = CheckpointDir(Path(a.ckpt))
        ckpt_files, ckpt_dirs = list(ckpt.files()), ckpt.dirs()
        values = values_from_config(table, ckpt.config, _sets(a.set))
        layers, quant, source = checkpoint_layers(table, ckpt, values, mtp=not a.no_mtp)
    else:
        from specbind.core.planning import expand
        from specbind.runtime.binder.quant import quantized_rules, storable
        from specbind.runtime.layout.config import checked_values
        from specbind.synth import schedule

        values = checked_values(table, table.default_values(), _sets(a.set))
        geometry = table.make_geometry(values)
        scheme = _scheme(table, a.quant) if a.quant is not None else None
        for p in schedule(table, table.real_layers, mtp=table.real_mtp > 0 and not a.no_mtp):
            for bname in p.blocks.values():
                block = table.block(bname)
                lq = None if scheme is None else storable(scheme, block, geometry)
                rules = quantized_rules(block.tensors, lq)
                rules = tuple(r for r in rules if r.group is None or r.group in p.groups)
                whole = {f: range(n) for f, n in block.counts(geometry).items()}
                names = [r.name for r in expand(rules, whole)[0]]
                layers.append((p.index, bname, frozenset(names)))
                quant[(p.index, bname)] = lq
        if table.globals:
            layers.append(
                (-1, table.globals, frozenset(table.block(table.globals).names(geometry)))
            )
        source = f"model spec: the real geometry, {table.real_layers} layers + {table.real_mtp} MTP"
        if scheme is not None:
            source += f", every linear it can hold as {scheme.name}"
    picture = None
    if a.svg is not None:  # checked before the work, written after it
        from specbind import svg

        with _usage():  # the path given is wrong, not the checkpoint (as --out)
            picture = svg.target(a.svg, ckpt_files, dirs=ckpt_dirs)
    rep = plan_report(
        table, values, tp_size, layers, source, ep_size=_or(a.ep_size, 1),
        quant=lambda i, b: quant.get((i, b)),
    )  # fmt: skip
    if picture is not None:
        from specbind.plan_svg import render_svg

        svg.write(picture, render_svg(rep))
    print(_json(rep) if a.json else render_text(rep))
    return 0


def cmd_models(a: argparse.Namespace) -> int:
    from specbind.models_table import render_text, supported

    rows = supported()
    print(_json({"models": rows}) if a.json else render_text(rows))
    return 0


def _scheme(table: Any, name: str) -> Any:
    known = {s.name: s for s in table.schemes}
    if name not in known:
        raise UsageError(f"--quant {name!r}: no such scheme (known: {', '.join(known)})")
    return known[name]


def cmd_bench(a: argparse.Namespace) -> int:
    from specbind import bench
    from specbind.core.planning import Ranks
    from specbind.launcher import resolve_ep, resolve_tp

    if a.repeat < 1:
        raise UsageError("--repeat must be >= 1")
    table = _table(a.model, a.ckpt)
    tp_size, tp_rank = resolve_tp(a.tp_size, a.tp_rank, os.environ)
    ranks = Ranks(tp_size, tp_rank, *resolve_ep(a.ep_size, a.ep_rank))
    result = bench.run(Path(a.ckpt), table, _sets(a.set), ranks, a.repeat, mtp=not a.no_mtp)
    print(_json(result) if a.json else bench.render(result))
    return 0


class _Formatter(argparse.HelpFormatter):
    """argparse's help layout, its width read as ``shutil.get_terminal_size`` reads it but
    without importing ``shutil`` (which imports bz2, lzma and zlib): argparse builds a formatter
    for every ``add_argument``, so every start paid that import (~4 ms)."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
        width: int | None = None,
    ) -> None:  # fmt: skip
        if width is None:
            width = _columns() - 2  # as HelpFormatter: the terminal's columns less 2
        super().__init__(prog, indent_increment, max_help_position, width)


def _columns() -> int:
    """``shutil.get_terminal_size().columns``: $COLUMNS, else stdout's terminal, else 80."""
    with contextlib.suppress(KeyError, ValueError):
        columns = int(os.environ["COLUMNS"])
        if columns > 0:
            return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` (its subcommands' too) with ``_Formatter`` as its help layout."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


class _Unused:
    """The parser of a command that is not the one run: every call is taken and ignored."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


# Every --json flag's help: the key every JSON output starts with, and that it goes to stdout.
JSON_HELP = "print {} as one JSON object on stdout (its first key: specbind_version)"

COMMANDS = ("generate", "synth", "audit", "bind", "plan", "bench", "models")


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command``, one that knows that command alone (what
    ``main`` builds when the first argument names one): each ``ArgumentParser`` looks its
    messages up in gettext's catalogues and each ``add_argument`` builds a help formatter, so
    the other five commands' parsers cost every start ~5 ms."""
    from specbind.version import __version__

    p = _Parser(prog="specbind", description="Spec-driven strict tensor binders.")
    p.add_argument("--version", action="version", version=f"specbind {__version__}")
    subparsers = p.add_subparsers(dest="command", required=True)

    class Sub:
        @staticmethod
        def add_parser(name: str, **kwargs: Any) -> argparse.ArgumentParser:
            if command is not None and name != command:
                unused: Any = _Unused()
                return cast(argparse.ArgumentParser, unused)
            return subparsers.add_parser(name, **kwargs)

    sub = Sub()

    g = sub.add_parser("generate", help="validate specs/ and render generated/")
    g.add_argument(
        "--check", action="store_true", help="exit 1 if generated/ is stale or has orphans"
    )
    g.add_argument(
        "--root", default=str(REPO), help="repository root holding specs/ and generated/"
    )
    g.set_defaults(func=cmd_generate)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--model",
            help="model spec name (default: the one claiming the checkpoint's config.json "
            "model_type; without a checkpoint, the spec marked default)",
        )
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
        "--quant",
        metavar="SCHEME",
        help="store every linear the scheme can hold quantized (a scheme of specs/schemes/)",
    )
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

    def verbose(sp: argparse.ArgumentParser, what: str) -> None:
        sp.add_argument(
            "-v", "--verbose", action="store_true", help=f"{what} (default: one per block)"
        )

    def no_mtp(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--no-mtp",
            action="store_true",
            help="the decoder alone: the MTP layers config.json counts are neither required "
            "nor bound (an engine that does not speculate; a checkpoint saved without them)",
        )

    def unshared(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--allow-unshared-scales",
            action="store_true",
            help="accept quantization scales the blocks declare shared that differ",
        )

    au = sub.add_parser(
        "audit", help="census of every tensor of a checkpoint; exit 1 if bind would refuse it"
    )
    au.add_argument("ckpt")
    au.add_argument("--json", action="store_true", help=JSON_HELP.format("the census and verdict"))
    au.add_argument(
        "--svg", metavar="FILE", help="also draw the layer x slot grid, problems in red (SVG)"
    )
    au.add_argument(
        "--names-only",
        action="store_true",
        help="the census alone: names, dtypes and config.json, no tensor read (shapes and "
        "values unchecked; fast on a huge checkpoint)",
    )
    verbose(au, "a row per layer and slot")
    common(au)
    progress(au)
    no_mtp(au)
    unshared(au)
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
                "--tp-rank",
                type=int,
                help="this rank (default: RANK, OMPI_COMM_WORLD_RANK; 0 only at tp size 1)",
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
    b.add_argument("--json", action="store_true", help=JSON_HELP.format("what was bound"))
    where = b.add_mutually_exclusive_group()
    where.add_argument("--out", help="write this rank's bound weights to this .safetensors file")
    where.add_argument(
        "--out-dir",
        help="write one file per rank and an index naming the layout (under torchrun: every "
        "rank at once, checked together)",
    )
    b.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="under torchrun: seconds a rank waits for the others at each step (default 600)",
    )
    b.add_argument(
        "--backend",
        choices=["numpy", "cupy"],
        default="numpy",
        help="numpy: host memory; cupy: a CUDA device (the gpu extra)",
    )
    unshared(b)
    b.add_argument(
        "--quant-output",
        action="append",
        choices=["swizzled", "dequantized"],
        help="also bind quantized fields as CUTLASS-swizzled block scales / dequantized BF16",
    )
    verbose(b, "a row per layer and slot")
    no_mtp(b)
    tp(b, rank=True)
    common(b)
    progress(b)
    b.set_defaults(func=cmd_bind)

    pl = sub.add_parser("plan", help="every tensor's local shape and bytes on every rank")
    pl.add_argument("ckpt", nargs="?", help="a checkpoint (geometry from its config.json)")
    pl.add_argument("--json", action="store_true", help=JSON_HELP.format("the plan"))
    pl.add_argument(
        "--svg", metavar="FILE", help="also draw who holds which bytes, ranks x blocks (SVG)"
    )
    pl.add_argument(
        "--quant",
        metavar="SCHEME",
        help="without a checkpoint: plan every linear the scheme can hold stored quantized",
    )
    no_mtp(pl)
    tp(pl, rank=False)
    common(pl)
    pl.set_defaults(func=cmd_plan)

    mo = sub.add_parser("models", help="the supported models, from the generated tables")
    mo.add_argument("--json", action="store_true", help=JSON_HELP.format("the models"))
    mo.set_defaults(func=cmd_models)

    be = sub.add_parser(
        "bench",
        help="time, GiB/s and peak RSS of this rank's bind beside plain safetensors slicing",
    )
    be.add_argument("ckpt", help="the checkpoint directory (or a Hub id in the Hub cache)")
    be.add_argument("--repeat", type=int, default=3, help="timed rounds of each side (median, min)")
    be.add_argument("--json", action="store_true", help=JSON_HELP.format("the figures"))
    tp(be, rank=True)
    no_mtp(be)
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


class Terminated(BaseException):
    """SIGTERM (``kill``, a launcher tearing its ranks down): unwinds like Ctrl-C, so a
    half-written ``--out`` temp file is removed and the previous file is left as it was. A
    ``BaseException``, as ``KeyboardInterrupt`` is: no ``except Exception`` on the way may turn
    it into an ordinary failure."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    args = parser(given[0] if given and given[0] in COMMANDS else None).parse_args(argv)
    previous: Any = None
    with contextlib.suppress(ValueError):  # only the main thread may set a handler
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        if getattr(args, "ckpt", None) is not None:  # a Hub id: its snapshot in the Hub cache
            from specbind.hub import resolve

            args.ckpt = resolve(args.ckpt)
        from specbind.sigbus import refuse_sigbus

        with refuse_sigbus(EXIT["refused"]):  # a shard truncated under its map: one line, exit 1
            rc: int = args.func(args)
        return rc
    except Terminated:
        _say("specbind: terminated")
        return EXIT["terminated"]
    except UsageError as e:
        _say(f"specbind: error: {e}")
        return EXIT["usage"]
    except SpecbindError as e:
        _say(f"specbind: error: {e}")
        return EXIT["refused"]
    except BrokenPipeError:  # stdout closed early (`| head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        _say("specbind: interrupted")
        return EXIT["interrupted"]
    except OSError as e:  # a path the user gave that cannot be read or written as asked
        where = f"{e.filename}: " if e.filename else ""
        _say(f"specbind: error: {where}{e.strerror or e}")
        return EXIT["refused"]
    except Exception as e:  # a bug in specbind: say so, in one line
        if os.environ.get("SPECBIND_DEBUG") == "1":
            import traceback

            traceback.print_exc()
        _say(
            f"specbind: internal error: {type(e).__name__}: {e} "
            "(SPECBIND_DEBUG=1 shows the traceback)"
        )
        return EXIT["internal"]
    finally:  # main() called in-process (tests, an engine's tool) leaves no handler behind
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _say(line: str) -> None:
    """``line`` and its newline on stderr in one ``write``: stderr writes through, so ``print``
    makes two, and under torchrun every rank's copy of the same refusal would interleave."""
    sys.stderr.write(line + "\n")
