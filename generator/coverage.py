"""Every element of every tensor is read by some output (generate time).

A block already refuses a tensor that no output reads; this is the same claim element by
element: a slice that reads only part of a tensor (an absorb over each head's nope rows) must
be joined by outputs that read the rest (the rope rows as ``q_rope``), or the rest would be
dropped without a word. Checked by replaying each output's view and slice on an index array
of the tensor at a small geometry (the model's synth tiny geometry, tp 1), so it costs
microseconds and needs no symbolic reasoning.

Invariant: an element is covered when a verbatim, concat or stack output reads its tensor, or
when some transform operand's view and slice select it.
Trap: at a geometry where a part is empty (R = 0) that part trivially covers nothing: the
check is only as strong as the geometry it runs at, so it runs at the tiny one, where the spec
writer chose every size positive and pairwise different.
"""

from __future__ import annotations

import math

import numpy as np

from specbind.core import algebra
from specbind.generator.block_spec import Block


def check_coverage(block: Block, env: dict[str, int], shapes: dict[str, tuple[int, ...]],
                   ctx: str) -> None:  # fmt: skip
    """Refuse a block one of whose tensors has elements no output reads, at ``env`` (tp 1)."""
    covered = {
        t.name: np.zeros(math.prod(shapes[t.name]), dtype=bool)
        for t in block.tensors
        if t.family is None
    }
    for out in block.outputs:
        tf = out.transform
        if tf is None:
            for s in out.sources:
                if s in covered:
                    covered[s][:] = True
            continue
        for o in tf.operands:
            idx = np.arange(covered[o.tensor].size).reshape(shapes[o.tensor])  # flat positions
            if o.view is not None:
                idx = idx.reshape(tuple(int(algebra.evaluate(e, env)) for e in o.view))
            if o.slice is not None:
                cut = o.slice
                start = 0 if cut.start is None else int(algebra.evaluate(cut.start, env))
                stop = (
                    idx.shape[cut.axis]
                    if cut.stop is None
                    else int(algebra.evaluate(cut.stop, env))
                )
                idx = np.take(idx, np.arange(start, stop), axis=cut.axis)
            covered[o.tensor][idx.ravel()] = True
    for name, mask in covered.items():
        if not mask.all():
            rel = block.rel(name)
            raise block.located.error(
                ("tensors", rel),
                f"{ctx}: {int((~mask).sum())} of {mask.size} elements of {rel} are read by no "
                "output (they would be dropped); bind the rest as its own field",
            )
