"""Evaluate a block's shapes, shards and constraints at a concrete geometry (generate time).

Invariant: a spec that cannot bind its own model's real geometry never generates: every dim is
a positive integer, every sharded dim splits into whole units, every constraint holds at tp=1.
The same checks run again at bind time in generated code, against the checkpoint's config.
"""

from __future__ import annotations

from generator import algebra
from generator.spec import Block, Model
from runtime.errors import AlgebraError, GeometryError, SpecbindError


def block_env(block: Block, values: dict[str, int], tp: int = 1) -> dict[str, int]:
    env = dict(values)
    env["tp"] = tp
    for name, expr in block.derived.items():
        try:
            env[name] = int(algebra.evaluate(expr, env))
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
        for i, e in enumerate(t.shape):
            path = ("tensors", t.name, "shape", i)
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
            axis = 0 if t.shard.kind == "rows" else len(shape) - 1
            if unit < 1 or shape[axis] % unit != 0:
                raise block.located.error(
                    ("tensors", t.name, "shard"),
                    f"{context}: dim {axis} ({shape[axis]}) does not split into whole "
                    f"{t.shard.unit} units ({unit})",
                )
        out[t.full_name] = shape
    return out


def check_model_geometry(model: Model, blocks: dict[str, Block]) -> None:
    """Refuse a spec pair whose real geometry breaks a shape, shard or constraint."""
    for use in model.blocks:
        block = blocks[use.block]
        ctx = f"at {model.name} geometry"
        env = block_env(block, block_values(model, block))
        shapes_at(block, env, ctx)
        for i, c in enumerate(block.constraints):
            try:
                ok = algebra.evaluate(c.check, env)
            except SpecbindError as e:
                raise block.located.error(("constraints", i, "check"), f"{ctx}: {e}") from None
            if not ok:
                raise block.located.error(
                    ("constraints", i, "check"), f"{ctx}: constraint {c.name} fails: {c.why}"
                )
