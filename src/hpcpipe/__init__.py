"""hpcpipe: deep-learning training from a 2-core laptop to multi-node GPU clusters with one config.

The public API: the job config (``JobConfig``, ``load_config``), the errors that reach a user as
one line (``UserError`` and its kinds), and the recipe API that brings a team's own model
(``Recipe``, ``DatasetRecipe``, ``Datasets`` and what their methods take and return; the pytest
helpers are in ``hpcpipe.testing``). Everything else is hpcpipe's own and may change.
"""

from __future__ import annotations

from hpcpipe.config import JobConfig, load_config
from hpcpipe.errors import ConfigError, DataError, UserError
from hpcpipe.recipes.base import (
    Batch,
    DataSummary,
    ExportRequest,
    PaddingBatch,
    Recipe,
    RecipeContext,
    TrainLoader,
)
from hpcpipe.recipes.dataset import DatasetRecipe, Datasets

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "ConfigError",
    "DataError",
    "DataSummary",
    "DatasetRecipe",
    "Datasets",
    "ExportRequest",
    "JobConfig",
    "PaddingBatch",
    "Recipe",
    "RecipeContext",
    "TrainLoader",
    "UserError",
    "__version__",
    "load_config",
]
