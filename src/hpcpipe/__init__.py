"""hpcpipe: deep-learning training from a 2-core laptop to multi-node GPU clusters with one config."""

from __future__ import annotations

from hpcpipe.config import JobConfig, load_config
from hpcpipe.errors import ConfigError, DataError, UserError

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataError",
    "JobConfig",
    "UserError",
    "__version__",
    "load_config",
]
