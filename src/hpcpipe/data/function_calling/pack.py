"""Encoded conversations -> fixed-length training sequences, packed with per-document boundaries.

Packing puts several conversations into one ``seq_len`` row (first-fit decreasing, so rows are
nearly full); ``doc_ids`` numbers the conversations inside a row (-1 marks padding), from which
the recipe builds a block-diagonal causal mask and positions that restart at every conversation:
no token ever attends to another conversation. Without packing each row holds one conversation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcpipe.data.function_calling.tokens import IGNORE, Encoded

PAD_DOC = -1


@dataclass(frozen=True)
class Packed:
    input_ids: np.ndarray  # (N, T) int32
    labels: np.ndarray  # (N, T) int32, IGNORE where not supervised
    doc_ids: np.ndarray  # (N, T) int32, PAD_DOC on padding
    context: np.ndarray  # (N, T) bool: each conversation's leading system prompt (Encoded.context)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def fill(self) -> float:
        """Fraction of token slots holding conversation tokens (1.0 = no padding)."""
        return float((self.doc_ids != PAD_DOC).mean()) if len(self) else 0.0

    def save(self, path: Path) -> None:
        np.savez(
            path, input_ids=self.input_ids, labels=self.labels, doc_ids=self.doc_ids, context=self.context
        )

    @classmethod
    def load(cls, path: Path) -> Packed:
        with np.load(path, allow_pickle=False) as data:  # plain arrays only: no pickled objects
            return cls(data["input_ids"], data["labels"], data["doc_ids"], data["context"])


def bins_first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices grouped into bins of total length <= capacity, longest first (first-fit decreasing)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    room = np.empty(0, dtype=np.int64)
    bins: list[list[int]] = []
    for i in order:
        fits = np.flatnonzero(room >= lengths[i])
        if fits.size:
            b = int(fits[0])
        else:
            b = len(bins)
            bins.append([])
            room = np.append(room, capacity)
        bins[b].append(i)
        room[b] -= lengths[i]
    return bins


def pack(examples: Sequence[Encoded], seq_len: int, packing: bool, pad_id: int) -> Packed:
    """Rows of ``seq_len`` tokens; every example must already fit in ``seq_len``."""
    lengths = [len(e.input_ids) for e in examples]
    groups = bins_first_fit(lengths, seq_len) if packing else [[i] for i in range(len(examples))]
    n = len(groups)
    input_ids = np.full((n, seq_len), pad_id, dtype=np.int32)
    labels = np.full((n, seq_len), IGNORE, dtype=np.int32)
    doc_ids = np.full((n, seq_len), PAD_DOC, dtype=np.int32)
    context = np.zeros((n, seq_len), dtype=bool)
    for row, group in enumerate(groups):
        at = 0
        for doc, i in enumerate(group):
            end = at + lengths[i]
            input_ids[row, at:end] = examples[i].input_ids
            labels[row, at:end] = examples[i].labels
            doc_ids[row, at:end] = doc
            context[row, at : at + examples[i].context] = True
            at = end
    return Packed(input_ids, labels, doc_ids, context)
