"""Every rank's planned byte pieces of a checkpoint, as the distributed bind plans them
(``runtime.ranks.byte_coverage.plan_pieces`` per rank of ``distributed.place``), with the
names they must cover once per replica: what the coverage tests check with
``byte_coverage.check``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specbind.runtime.bind.preamble import refuse_problems
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.layout.config import values_from_config
from specbind.runtime.layout.slots import layout
from specbind.runtime.ranks import byte_coverage, distributed


def every_rank(
    ck: Path, table: Any, tp: int, ep: int = 1
) -> tuple[list[list[byte_coverage.Piece]], set[str]]:
    """Every rank's planned pieces at tp x ep, in rank order, and the names to be covered."""
    ckpt = CheckpointDir(ck)
    geometry = table.make_geometry(values_from_config(table, ckpt.config))
    lay = layout(table, ckpt.names(), ckpt.config)
    refuse_problems(lay)
    by_rank = [
        byte_coverage.plan_pieces(ckpt, table, lay, geometry, distributed.place(tp * ep, r, tp, ep))
        for r in range(tp * ep)
    ]
    return by_rank, byte_coverage.claimed_names(table, lay)
