"""A two-operand ``einsum`` lowered to one batched matmul; pure, no arrays.

``"hrc,hrk->hck"`` names every axis by a letter. Each letter is one of four roles:
- batch: in both operands and the output (``h``: one independent matmul per head);
- left: only in the first operand (``c``), right: only in the second (``k``);
- contract: in both operands, not the output (``r``: summed).
The lowering permutes A to ``[batch.., left.., contract..]`` and B to
``[batch.., contract.., right..]``, multiplies ``[B, L, C] @ [B, C, R]``, and permutes
``[batch.., left.., right..]`` into the output's letter order.

Invariants: a letter appears at most once per operand, the output's letters are distinct and
come from the operands, and no letter is summed within one operand (no traces); anything else
is an ``AlgebraError`` naming the einsum. The generator checks an einsum here at generate
time, and ``runtime.binder.ops.contract`` lowers the same text at bind time, so both agree by
construction.
"""

from __future__ import annotations

import re
from functools import lru_cache

from specbind.core.errors import AlgebraError
from specbind.core.record import record

_FORM = re.compile(r"[a-z]{1,8},[a-z]{1,8}->[a-z]{1,8}")


@record
class Lowering:
    """``einsum`` as ``matmul`` of [batch, left, contract] by [batch, contract, right]."""

    letters_a: str
    letters_b: str
    letters_out: str
    batch: str  # the letters of each role, in the order the lowering lays them out
    left: str
    contract: str
    right: str
    perm_a: tuple[int, ...]  # A's axes -> [batch.., left.., contract..]
    perm_b: tuple[int, ...]  # B's axes -> [batch.., contract.., right..]
    perm_out: tuple[int, ...]  # [batch.., left.., right..] -> the output's letter order


@lru_cache(maxsize=64)
def lower(spec: str, ranks: tuple[int, int] | None = None) -> Lowering:
    """Lower ``spec`` (``"ab,bc->ac"``); with ``ranks``, each operand's letters must match its
    rank. Refuses a malformed einsum with an ``AlgebraError`` naming it."""
    if not _FORM.fullmatch(spec):
        raise AlgebraError(f"{spec!r}: an einsum is 'letters,letters->letters' (a-z, 1 to 8)")
    ins, out = spec.split("->")
    la, lb = ins.split(",")
    for i, (letters, which) in enumerate(((la, "first"), (lb, "second"))):
        if ranks is not None and len(letters) != ranks[i]:
            raise AlgebraError(
                f"{spec!r}: the {which} operand has rank {ranks[i]}, not {len(letters)}"
            )
        if len(set(letters)) != len(letters):
            raise AlgebraError(f"{spec!r}: a letter repeats within the {which} operand (no traces)")
    if len(set(out)) != len(out) or any(c not in la + lb for c in out):
        raise AlgebraError(f"{spec!r}: output letters must be distinct and come from the operands")
    lonely = [c for c in la + lb if (c in la) != (c in lb) and c not in out]
    if lonely:
        raise AlgebraError(f"{spec!r}: letter(s) {''.join(lonely)} are summed within one operand")
    batch = [c for c in out if c in la and c in lb]
    contract = [c for c in la if c in lb and c not in out]
    left = [c for c in la if c not in lb]
    right = [c for c in lb if c not in la]
    mid = batch + left + right
    return Lowering(
        letters_a=la,
        letters_b=lb,
        letters_out=out,
        batch="".join(batch),
        left="".join(left),
        contract="".join(contract),
        right="".join(right),
        perm_a=tuple(la.index(c) for c in batch + left + contract),
        perm_b=tuple(lb.index(c) for c in batch + contract + right),
        perm_out=tuple(mid.index(c) for c in out),
    )
