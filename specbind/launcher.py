"""The tensor-parallel size and rank, from flags or from the environment a launcher sets.

Precedence: ``--tp-size``/``--tp-rank`` flags, then torchrun's ``WORLD_SIZE``/``RANK``, then
mpirun's ``OMPI_COMM_WORLD_SIZE``/``OMPI_COMM_WORLD_RANK``, then 1/0. A launcher variable that
is not a non-negative integer is refused by name, never ignored.
Trap: a tp size above 1 with no rank from a flag or a launcher is refused, never read as rank
0: ``bind --tp-size 4`` alone would bind a quarter of the model and say nothing of it. The
same holds for ``--ep-size`` without ``--ep-rank`` (``resolve_ep``); a launcher gives no ep rank.
"""

from __future__ import annotations

from collections.abc import Mapping

from specbind.core.errors import GeometryError, RankError
from specbind.core.planning import check_tp

LAUNCHERS = (("WORLD_SIZE", "RANK"), ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"))


def _int(env: Mapping[str, str], key: str) -> int | None:
    raw = env.get(key)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise RankError(f"environment {key}={raw!r} is not an integer") from None
    if value < 0:
        raise RankError(f"environment {key}={raw!r} is negative")
    return value


def resolve_tp(size: int | None, rank: int | None, env: Mapping[str, str]) -> tuple[int, int]:
    if size is not None and rank is not None:
        check_tp(size, rank)
        return size, rank  # both flags given: the environment is not read at all
    env_size = env_rank = None
    source = ""
    for size_key, rank_key in LAUNCHERS:
        s, r = _int(env, size_key), _int(env, rank_key)
        if s is not None or r is not None:
            env_size, env_rank = s, r
            source = f" (from {size_key}/{rank_key})"
            break
    tp_size = size if size is not None else (env_size if env_size is not None else 1)
    if rank is None and env_rank is None and tp_size > 1:
        given = f"--tp-size {size}" if size is not None else f"tp size {tp_size}{source}"
        raise RankError(
            f"{given} without --tp-rank outside a launcher (no RANK or OMPI_COMM_WORLD_RANK set): "
            f"name the rank with --tp-rank 0..{tp_size - 1}, or bind every rank with --out-dir "
            "or under torchrun"
        )
    tp_rank = rank if rank is not None else (env_rank if env_rank is not None else 0)
    try:
        check_tp(tp_size, tp_rank)
    except GeometryError as e:
        raise RankError(f"{e}{source}") from None
    return tp_size, tp_rank


def resolve_ep(size: int | None, rank: int | None) -> tuple[int, int]:
    """The expert-parallel size and rank, from the flags alone (no launcher variable names an
    ep rank). An ep size above 1 without ``--ep-rank`` is refused, never read as rank 0."""
    ep_size = 1 if size is None else size
    if rank is None and ep_size > 1:
        raise RankError(
            f"--ep-size {ep_size} without --ep-rank outside a launcher: name the rank with "
            f"--ep-rank 0..{ep_size - 1}, or bind every rank with --out-dir or under torchrun"
        )
    return ep_size, 0 if rank is None else rank
