"""Bind one tensor-parallel rank of a checkpoint as torch tensors, the way an engine would.

    python examples/bind_for_torch.py CHECKPOINT_DIR [TP_SIZE] [TP_RANK]

``tests/tools/test_api.py`` runs this file on a tiny checkpoint and type-checks it with
``mypy --strict``: the API's types carry through to a user's code.
"""

from __future__ import annotations

import sys

import torch

import specbind
from specbind.generated.dsa import DsaWeights
from specbind.generated.moe import MoeWeights


def main(path: str, tp_size: int, tp_rank: int) -> None:
    ck = specbind.open(path)
    census = ck.audit()
    print(f"{ck.model}: {census['tensors']} tensors, problems: {census['problems']}")
    plan = ck.plan(tp_size=tp_size)
    print(f"plan: {len(plan['blocks'])} block kinds across {tp_size} rank(s)")

    m = ck.bind(tp_rank=tp_rank, tp_size=tp_size, backend="torch")
    for layer in m.layers:
        attention = layer.slots["attention"]
        if attention.block == "dsa":
            w: DsaWeights[torch.Tensor] = attention.weights_as(DsaWeights)
            q: torch.Tensor = w.q_absorb  # [heads/tp * kv_lora_rank, q_lora_rank] bf16
            print(f"layer {layer.index}: q_absorb {tuple(q.shape)} {q.dtype}")
        mlp = layer.slots["mlp"]
        if mlp.block == "moe":
            e: MoeWeights[torch.Tensor] = mlp.weights_as(MoeWeights)
            print(f"layer {layer.index}: w13 {tuple(e.w13.shape)} {e.w13.dtype}")
    total = sum(t.numel() * t.element_size() for t in m.tensors().values())
    print(f"rank {m.tp_rank}/{m.tp_size}: {len(m.tensors())} tensors, {total} bytes")


if __name__ == "__main__":
    main(
        sys.argv[1],
        int(sys.argv[2]) if len(sys.argv) > 2 else 1,
        int(sys.argv[3]) if len(sys.argv) > 3 else 0,
    )
