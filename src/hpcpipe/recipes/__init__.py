"""Workload recipes. ``run.recipe`` names one; ``registry`` finds its class (an entry point of the
group ``hpcpipe.recipes``, hpcpipe's built-ins included, or ``module:Class``), ``base`` is the
public ``hpcpipe.Recipe`` and ``dataset`` the public ``hpcpipe.DatasetRecipe``. The built-in
recipes are modules here that use exactly that API: ``gpt``, ``resnet``, ``lora_fc``,
``hf_causal_lm`` and ``torchvision_classifier``.

Importing this package stays light (no torch at import time): the config validates jobs against
``registry``, which lives in this package.
"""

from __future__ import annotations

from hpcpipe.recipes.registry import build_recipe

__all__ = ["build_recipe"]
