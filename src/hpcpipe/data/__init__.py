"""The data pipelines, one package per kind of data, plus what they share.

- ``tokens/``: corpus -> tokenizer -> token shards + manifest -> stateful window loaders (gpt).
- ``images/``: CIFAR / IDX / ImageFolder readers, hash manifest, loader, generator (resnet-cifar).
- ``function_calling/``: conversation formats, chat tokens, packing, prepare, loader, generator
  (lora-function-calling).
- ``order.py``: the deterministic, resumable sample order every loader uses; ``map_style.py``: the
  loader over any map-style ``torch.utils.data.Dataset`` (``hpcpipe.DatasetRecipe``, images);
  ``stage.py``: the node-local cache (``hpcpipe data stage``).

This module re-exports the token pipeline's public names (``prepare_dataset``, ``TokenWindowLoader``
...). The loaders import torch, so they are imported lazily here: the CLI's ``data prepare`` path
stays free of torch and starts fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcpipe.data.tokens.corpus import (
    Document,
    corpus_fingerprint,
    iter_documents,
    plan_splits,
    scan_corpus,
    stdlib_dir,
)
from hpcpipe.data.tokens.shards import (
    MANIFEST_FILE,
    PreparedDataset,
    load_tokenizer,
    open_dataset,
    prepare_dataset,
    verify_dataset,
)
from hpcpipe.data.tokens.tokenizer import (
    EOS_TOKEN,
    BPETokenizer,
    ByteTokenizer,
    Tokenizer,
    train_tokenizer,
)

if TYPE_CHECKING:
    from hpcpipe.data.tokens.loader import EvalWindows, TokenWindowLoader

_LAZY = {"EvalWindows", "TokenWindowLoader"}

__all__ = [
    "EOS_TOKEN",
    "MANIFEST_FILE",
    "BPETokenizer",
    "ByteTokenizer",
    "Document",
    "EvalWindows",
    "PreparedDataset",
    "TokenWindowLoader",
    "Tokenizer",
    "corpus_fingerprint",
    "iter_documents",
    "load_tokenizer",
    "open_dataset",
    "plan_splits",
    "prepare_dataset",
    "scan_corpus",
    "stdlib_dir",
    "train_tokenizer",
    "verify_dataset",
]


def __getattr__(name: str) -> Any:
    """Import the torch-dependent loaders on first use."""
    if name in _LAZY:
        from hpcpipe.data.tokens import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'hpcpipe.data' has no attribute {name!r}")
