"""The padded split of a vocabulary axis, as vLLM's ``VocabParallelEmbedding`` and
``ParallelLMHead`` make it (vllm/model_executor/layers/vocab_parallel_embedding.py:
``pad_vocab_size``, then ``vocab_range_from_global_vocab_size``): the axis is padded up to a
multiple, the padded size split into tp equal shares, and rank r holds the stored rows of
``[r·P/tp, (r+1)·P/tp)``, then zeros past the stored size.

One arithmetic for every user: an engine layout's ``pad:`` (``generator.engines``,
``specbind.engine_ops``) and a block's ``padded:`` units (``core.planning``).
Invariants: ``start <= end <= full``, ``end - start <= per``; a tp that does not split the
padded size is the caller's refusal (``split`` returns None), never a rounded share.
"""

from __future__ import annotations

from specbind.core.record import record


@record
class PaddedShare:
    padded: int  # the axis padded up to the multiple
    per: int  # rows each rank holds (stored, then zeros)
    start: int  # first stored row this rank holds (clamped to the stored size)
    end: int  # one past its last stored row

    @property
    def zeros(self) -> int:
        """Rows of zeros after this rank's stored rows."""
        return self.per - (self.end - self.start)


def padded_size(full: int, multiple: int) -> int:
    """``full`` rounded up to a multiple of ``multiple`` (vLLM's ``pad_vocab_size``)."""
    return -(-full // multiple) * multiple


def split(full: int, multiple: int, tp: int, rank: int) -> PaddedShare | None:
    """Rank ``rank``'s share of an axis of ``full`` rows padded to ``multiple`` and split in
    ``tp``; None when tp does not split the padded size into equal shares."""
    padded = padded_size(full, multiple)
    if padded % tp:
        return None
    per = padded // tp
    return PaddedShare(padded, per, min(rank * per, full), min((rank + 1) * per, full))
