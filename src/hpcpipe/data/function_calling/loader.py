"""Packed token rows for training (shuffled, rank-sharded, resumable) and evaluation (all rows).

A batch is ``(input_ids, labels, doc_ids, context)``, each (B, T): int64, and bool for
``context`` (each conversation's system prompt); the recipe turns ``doc_ids`` into each
conversation's span of the row and its positions on the device. The order is ``SampleOrder``'s:
a pure function of (seed, step, rank), so a resumed run continues with exactly the rows it would
have seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from hpcpipe.data.function_calling.pack import PAD_DOC, Packed
from hpcpipe.data.function_calling.tokens import IGNORE
from hpcpipe.data.order import SampleOrder

FCBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _batch(rows: Packed, items: np.ndarray) -> FCBatch:
    """(B, T) tensors of rows ``items``: int64, and bool for the context marks."""
    return (
        torch.from_numpy(rows.input_ids[items].astype(np.int64)),
        torch.from_numpy(rows.labels[items].astype(np.int64)),
        torch.from_numpy(rows.doc_ids[items].astype(np.int64)),
        torch.from_numpy(rows.context[items]),
    )


class PackedTrainLoader:
    """The recipe's TrainLoader: micro-batches of packed rows in ``SampleOrder``."""

    def __init__(
        self,
        rows: Packed,
        micro_batch_size: int,
        global_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
    ) -> None:
        self.rows = rows
        self.order = SampleOrder(len(rows), micro_batch_size, global_batch_size, rank, world_size, seed)

    def next_microbatch(self) -> FCBatch:
        return _batch(self.rows, self.order.items(self.order.next_positions()))

    def state_dict(self) -> dict[str, int]:
        return self.order.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order.load_state_dict(state)

    def set_micro_batch_size(self, micro_batch_size: int) -> None:
        self.order.set_micro_batch_size(micro_batch_size)

    def close(self) -> None:
        """Nothing to release: the rows are in memory."""


class PackedEvalBatches:
    """Every held-out row once, in contiguous blocks per rank; equal batch counts on every rank.

    A rank that runs out of rows yields one all-padding row (no supervised token), so FSDP2's
    collectives in every forward still line up and nothing is counted twice.
    """

    def __init__(self, rows: Packed, micro_batch_size: int, rank: int, world_size: int, limit: int) -> None:
        n = len(rows)
        per_rank = -(-n // world_size)
        self.items = np.arange(rank * per_rank, min(n, (rank + 1) * per_rank), dtype=np.int64)
        self.n_batches = max(1, min(limit, -(-per_rank // micro_batch_size)))
        self.micro = micro_batch_size
        self.rows = rows

    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self) -> Iterator[FCBatch]:
        seq_len = self.rows.input_ids.shape[1]
        for i in range(self.n_batches):
            items = self.items[i * self.micro : (i + 1) * self.micro]
            if items.size == 0:
                yield (
                    torch.zeros((1, seq_len), dtype=torch.int64),
                    torch.full((1, seq_len), IGNORE, dtype=torch.int64),
                    torch.full((1, seq_len), PAD_DOC, dtype=torch.int64),
                    torch.zeros((1, seq_len), dtype=torch.bool),
                )
                continue
            yield _batch(self.rows, items)
