"""Library noise that is not the user's to fix, silenced around Hugging Face calls."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_hf() -> Iterator[None]:
    """No per-tensor progress bars (one per rank) and no deprecation notes that peft triggers
    inside transformers 5 (``is_gradient_checkpointing``): they are not the user's to fix."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*save_embedding_layers.*", category=UserWarning)
        # GGUF bases have no config.json beside them; the vocabulary is never modified here.
        warnings.filterwarnings("ignore", message="Could not find a config file", category=UserWarning)
        yield
