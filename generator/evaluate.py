"""Evaluate a block's shapes, shards and constraints at a concrete geometry (generate time).

Invariant: a spec that cannot bind its own model's real geometry never generates: every dim is
a positive integer, every sharded dim splits into whole units, every constraint holds at tp=1.
The same checks run again at bind time in generated code, against the checkpoint's config.
"""

from __future__ import annotations

import math

from specbind.core import algebra, algebra_ops
from specbind.core.errors import AlgebraError, GeometryError, SpecbindError
from specbind.core.geometry import computed
from specbind.core.planning import plan_block, rank_units
from specbind.generator import transforms
from specbind.generator.block_spec import Block
from specbind.generator.coverage import check_coverage
from specbind.generator.derivation import check_sum_units
from specbind.generator.model_spec import Model


def block_env(block: Block, values: dict[str, int], tp: int = 1) -> dict[str, int]:
    env = dict(values)
    env["tp"] = tp
    env["ep"] = 1
    for name, expr in block.derived.items():
        try:
            env[name] = algebra_ops.bounded(int(algebra.evaluate(expr, env)))
        except SpecbindError as e:
            raise block.located.error(("derived", name), str(e)) from None
    return env


def block_values(model: Model, block: Block) -> dict[str, int]:
    use = next(u for u in model.blocks if u.block == block.name)
    gv = model.values()
    return {s: gv[g] for s, g in use.symbols.items()}


def shapes_at(block: Block, env: dict[str, int], context: str) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for t in block.tensors:
        dims: list[int] = []
        rel = block.rel(t.name)
        for i, e in enumerate(t.dims):
            path = ("tensors", rel, "shape", i)
            try:
                v = int(algebra.evaluate(e, env))
            except (AlgebraError, GeometryError) as exc:
                raise block.located.error(path, f"{context}: {exc}") from None
            if v < 1:
                raise block.located.error(
                    path, f"{context}: dim {e.text!r} evaluates to {v}, not >= 1"
                )
            dims.append(v)
        shape = tuple(dims)
        if t.shard.kind != "replicated":
            unit = env[t.shard.unit or ""]
            axis = t.shard.resolved(len(shape))
            if unit < 1 or shape[axis] % unit != 0:
                raise block.located.error(
                    ("tensors", rel, "shard"),
                    f"{context}: dim {axis} ({shape[axis]}) does not split into whole "
                    f"{t.shard.unit} units ({unit})",
                )
        out[t.name] = shape
    return out


def local_env(block: Block, values: dict[str, int], tp: int, units: set[str]) -> dict[str, int]:
    """The env one rank sees in its views: each shard unit in ``units`` is ``unit / tp``, or 1
    where tp is a multiple of it (the unit replicated on tp / unit ranks)."""
    local = dict(values)
    for u in units:  # shard units are base symbols (the spec checker refuses derived ones)
        local[u] = rank_units(local[u], tp)[0]
    return block_env(block, local, tp)


def local_shapes(
    block: Block, shapes: dict[str, tuple[int, ...]], env: dict[str, int]
) -> dict[str, tuple[int, ...]]:
    """Rank 0's shape of every tensor at ``env["tp"]``, from the runtime's own planner, so
    generate-time checks and bind time agree on what a shard is."""
    rules = [t for t in block.tensors if t.family is None]  # transforms never read a family
    return plan_block(block.name, rules, shapes, env, 0, {}).local_shapes()


def check_transforms(block: Block, values: dict[str, int], ctx: str) -> None:
    """Every transform's shapes at every tp the block's units allow, and its declared layout."""
    env = block_env(block, values)
    full = shapes_at(block, env, ctx)
    units = {t.shard.unit for t in block.tensors if t.shard.unit is not None}
    whole = {t.shard.unit for t in block.tensors if t.shard.never_replicated is not None}
    tps = [
        tp
        for tp in (1, 2, 4, 8)
        if all(env[u] % tp == 0 or (tp % env[u] == 0 and u not in whole) for u in units)
    ]
    for out in block.outputs:
        tf = out.transform
        if tf is None:
            continue
        path = ("outputs", out.field)
        if tf.scale is not None:  # a scale is a full-geometry real number: it must be finite
            try:
                factor = algebra.evaluate_real(tf.scale, env)
            except SpecbindError as exc:
                raise block.located.error((*path, "scale"), f"{ctx}: {exc}") from None
            if not math.isfinite(factor):
                raise block.located.error((*path, "scale"), f"{ctx}: scale is {factor}, not finite")
        op_units = {block.tensor(o.tensor).shard.unit for o in tf.operands} - {None}
        by_tp = {}
        for tp in tps:
            lenv = local_env(block, values, tp, {u for u in op_units if u is not None})
            by_tp[tp] = transforms.result_shape(
                tf, {t.name: t for t in block.tensors}, lenv,
                local_shapes(block, full, block_env(block, values, tp)),
                block.located, path, f"{ctx}, tp {tp}",
            )  # fmt: skip
        for tp, shape in by_tp.items():
            want = list(by_tp[1])
            # ranks sharing the result: tp, or fewer where a unit is replicated on tp / unit ranks
            split = min([min(tp, env[u]) for u in op_units if u is not None] or [tp])
            if tf.layout_kind == "rows":
                want[0] //= split
            elif tf.layout_kind == "cols":
                want[-1] //= split
            elif tf.layout_kind == "axis":
                want[tf.layout_axis] //= split
            if list(shape) != want:
                raise block.located.error(
                    (*path, "shard"),
                    f"{ctx}: at tp {tp} the result is {list(shape)}, but a {tf.layout_kind} "
                    f"layout of {list(by_tp[1])} would be {want}",
                )


def distinct_values(values: dict[str, int]) -> dict[str, int]:
    """``values`` with every symbol made different from every other: a colliding value is
    multiplied by the smallest factor that frees it (0 stays 0). Multiplying keeps what
    divides what, so the shard units still divide their dims; a transform that mixes up two
    symbols (N for V in a slice) cannot hide behind their being equal at the real geometry."""
    out: dict[str, int] = {}
    for name in sorted(values):
        v, k = values[name], 1
        while v and v * k in out.values():
            k += 1
        out[name] = v * k
    return out


def tiny_geometry(model: Model) -> dict[str, int]:
    """The synth tiny geometry over the real one, its computed symbols recomputed."""
    assert model.synth is not None
    try:
        return computed(model.geometry, model.values() | dict(model.synth.tiny))
    except SpecbindError as e:
        raise model.located.error(("synth", "tiny"), f"at the synth tiny geometry: {e}") from None


def check_model_geometry(model: Model, blocks: dict[str, Block]) -> None:
    """Refuse a spec pair whose real geometry breaks a shape, shard or constraint, or whose
    transforms do not fit at a geometry where no two symbols are equal; or whose own
    constraints fail at its real or its synthetic (tiny) geometry; or (at the tiny geometry)
    whose transforms do not fit or leave elements of a tensor read by no output."""
    real_values = model.values()
    geometries = [("real", real_values)]
    if model.synth is not None:
        geometries.append(("synth tiny", tiny_geometry(model)))
    for i, c in enumerate(model.constraints):
        assert c.expr is not None
        for what, values in geometries:
            if not algebra.evaluate(c.expr, values):
                raise model.located.error(
                    ("constraints", i, "check"),
                    f"at the {what} geometry of {model.name}: constraint {c.name} fails: {c.why}",
                )
    for what, values in geometries:
        check_section_sizes(model, blocks, values, f"at the {what} geometry of {model.name}")
    for use in model.blocks:
        block = blocks[use.block]
        real = block_values(model, block)
        distinct = distinct_values(real)
        if distinct != real:
            shown = ", ".join(f"{k}={v}" for k, v in distinct.items())
            ctx = f"at a geometry where no two symbols are equal ({shown})"
            _check_shapes(block, block_env(block, distinct), ctx)
            check_transforms(block, distinct, ctx)
        ctx = f"at {model.name} geometry"
        env = block_env(block, real)
        _check_shapes(block, env, ctx)
        check_whole_units(block, real, ctx)
        check_sum_units(model, block, use, ctx)
        check_transforms(block, real, ctx)
        if model.synth is not None:  # every element read by some output, at the tiny geometry
            tiny = tiny_geometry(model)
            values = {s: tiny[g] for s, g in use.symbols.items()}
            tctx = f"at the synth tiny geometry of {model.name}"
            tenv = block_env(block, values)
            tshapes = shapes_at(block, tenv, tctx)
            check_transforms(block, values, tctx)  # the views and slices fit there too
            check_coverage(block, tenv, tshapes, tctx)
        for i, c in enumerate(block.constraints):
            assert c.expr is not None
            try:
                ok = algebra.evaluate(c.expr, env)
            except SpecbindError as e:
                raise block.located.error(("constraints", i, "check"), f"{ctx}: {e}") from None
            if not ok:
                raise block.located.error(
                    ("constraints", i, "check"), f"{ctx}: constraint {c.name} fails: {c.why}"
                )


def check_section_sizes(
    model: Model, blocks: dict[str, Block], values: dict[str, int], ctx: str
) -> None:
    """Each section's size is what its block declares on the sectioned axis, so a size
    written in the wrong order or over the wrong symbol fails here, not at the first bind;
    a sectioned axis the section's rank does not have is refused too."""
    for i, r in enumerate(model.names):
        for k, (to, size) in enumerate(zip(r.to, r.sizes, strict=False)):
            rows = int(algebra.evaluate(algebra.parse(size), values))
            for use in model.blocks:
                block = blocks[use.block]
                t = next((x for x in block.tensors if x.name == to), None)
                if t is None or not t.dims:
                    continue
                if not -len(t.dims) <= r.axis < len(t.dims):
                    raise model.located.error(
                        ("names", i, "axis"),
                        f"section {to} splits axis {r.axis}, but block {block.name!r} declares "
                        f"{block.rel(to)} with {len(t.dims)} axes ({t.shape})",
                    )
                axis = r.axis % len(t.dims)
                local = {s: values[g] for s, g in use.symbols.items()}
                want = int(algebra.evaluate(t.dims[axis], block_env(block, local)))
                if rows != want:
                    what = "rows" if axis == 0 else f"on axis {axis}"
                    raise model.located.error(
                        ("names", i, "sections", k),
                        f"{ctx}: section {to} is {size} = {rows} {what}, but block "
                        f"{block.name!r} declares {block.rel(to)} with {want} "
                        f"({t.dims[axis].text})",
                    )


def check_whole_units(block: Block, values: dict[str, int], ctx: str) -> None:
    """Every sharded dim is a whole number of its unit at every geometry, not only at this
    one: scaling the unit by k scales the dim by k. ``[H * D + 2 * KV * D, X]`` on ``{rows:
    H}`` divides by H at many geometries, yet rank r's contiguous rows would cross from q into
    k and v (right shape, wrong rows); it is refused here, naming the tensor, so the author
    declares its sections (model ``names:`` sections), each with its own unit."""
    env = block_env(block, values)
    for t in block.tensors:
        if t.shard.kind == "replicated" or t.shard.unit is None or not t.dims:
            continue
        axis = t.shard.resolved(len(t.dims))
        unit = t.shard.unit
        dim = int(algebra.evaluate(t.dims[axis], env))
        for k in (2, 3):
            # derived symbols recomputed from the scaled unit (Q = H * D scales with H), or
            # held as they are (a head dim derived as hidden / H does not shrink with H)
            try:
                again = block_env(block, values | {unit: values[unit] * k})
                scaled = int(algebra.evaluate(t.dims[axis], again))
            except SpecbindError:  # a derived symbol that no longer divides
                scaled = k * dim + 1
            if scaled != k * dim:
                held = env | {unit: env[unit] * k}
                scaled = int(algebra.evaluate(t.dims[axis], held))
            if scaled != k * dim:
                raise block.located.error(
                    ("tensors", block.rel(t.name), "shard"),
                    f"{ctx}: {block.rel(t.name)} shards {t.shard.kind} on {unit}, but dim "
                    f"{axis} ({t.dims[axis].text}) is not a whole number of {unit} units at "
                    f"every geometry ({unit} x {k} gives {scaled}, not {k} x {dim}): rank r's "
                    f"rows would cross sections; declare its sections, each with its own unit",
                )


def _check_shapes(block: Block, env: dict[str, int], ctx: str) -> None:
    """Every dim positive, every shard whole, every concat joining equal off-axis shapes."""
    shapes = shapes_at(block, env, ctx)
    for out in block.outputs:
        for s in sorted(out.halves):  # each unit's rows: whole rotary pairs
            t = block.tensor(s)
            per = shapes[s][0] // env[t.shard.unit or ""]
            if per % 2:
                raise block.located.error(
                    ("outputs", out.field, "concat"),
                    f"{ctx}: {block.rel(s)} reorders rotary pairs into halves per "
                    f"{t.shard.unit} unit, but a unit holds {per} rows, an odd number",
                )
        if out.kind in ("concat", "stack"):
            dims = {s[: out.axis] + s[out.axis + 1 :] for s in (shapes[n] for n in out.sources)}
            if len(dims) != 1:
                raise block.located.error(
                    ("outputs", out.field, "concat"),
                    f"{ctx}: concat on axis {out.axis} joins shapes "
                    f"{[list(shapes[n]) for n in out.sources]} that differ off that axis",
                )
