"""Models: our own compact GPT (``gpt.py``); Hugging Face and torchvision wrappers live beside it."""

from __future__ import annotations

from hpcpipe.models.gpt import GPT

__all__ = ["GPT"]
