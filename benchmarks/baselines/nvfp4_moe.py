"""The NVFP4 MoE loader a user writes by hand (as vLLM's per-expert weight loader does), for
``python -m benchmarks --quant nvfp4-modelopt``: for each of this ep rank's experts, slice the tp
rank's rows of gate and up (columns of down) out of the packed weight and its block scale,
copy them into the stacked ``w13``/``w2`` arrays, and gather the global and input scales per
expert. Plain NumPy over a memory map; it names the tensors, as a hand-written loader does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specbind.core.dtypes import DTYPES
from specbind.core.planning import BlockPlan, Ranks
from specbind.runtime.binder.checks import Array
from specbind.runtime.io.safetensors_file import SafetensorsFile


def baseline(path: Path, plan: BlockPlan, ranks: Ranks) -> dict[str, Array]:
    """The hand-written loader: per expert, this rank's slice of every packed weight and
    block scale copied into the stacked arrays; scalars gathered per expert."""
    f = SafetensorsFile(path)

    def arr(name: str) -> Array:
        t = f.raw(name)
        dt = DTYPES[t.dtype].numpy
        assert dt is not None
        return np.frombuffer(t.data, dtype=dt).reshape(t.shape)  # [bytes] -> on-disk shape

    assert plan.members is not None
    fam = next(iter(plan.members))
    ids = list(plan.members[fam])
    tp, r = ranks.tp_size, ranks.tp_rank
    out: dict[str, Array] = {}
    pre = "mlp.experts."
    for field, srcs, cols in (
        ("w13", ("gate_proj", "up_proj"), False),
        ("w2", ("down_proj",), True),
    ):
        for suffix in ("weight", "weight_scale"):
            parts = []
            for e in ids:
                per = []
                for s in srcs:
                    a = arr(f"{pre}{e}.{s}.{suffix}")
                    n = a.shape[-1 if cols else 0] // tp
                    per.append(a[:, r * n : (r + 1) * n] if cols else a[r * n : (r + 1) * n])
                parts.append(np.concatenate(per, axis=0))
            out[field if suffix == "weight" else f"{field}_{suffix}"] = np.stack(parts)
        for suffix in ("weight_scale_2", "input_scale"):
            vals = [[arr(f"{pre}{e}.{s}.{suffix}").reshape(()) for s in srcs] for e in ids]
            v = np.array(vals, dtype=np.float32)  # [E_r, sources]
            out[f"{field}_{suffix}"] = v if len(srcs) > 1 else v[:, 0]
    return out
