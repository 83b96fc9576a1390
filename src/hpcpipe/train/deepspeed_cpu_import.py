"""DeepSpeed imported once by the fork server for ranks that compute on the CPU.

Importing ``deepspeed`` costs a rank about 1.5 s of CPU, and the engine's optimizer check then
imports DeepSpeed's Muon module, whose kernels go through ``torch.compile`` at import: about as
much again (py-spy over tests/e2e and tests/distributed, 2026-12-02: the two imports were 7% of
all their CPU time). ``launch/job.py`` names this module in the fork server's preload for a
DeepSpeed job on a machine without a GPU (``environment.gpu_device_present``), so the server pays
once and every rank and every restarted group inherits it. Not where a GPU may be present:
DeepSpeed picks its accelerator at import, and the CUDA one initialises CUDA, which a process
that forks workers must not do.
"""

from __future__ import annotations

import contextlib
import importlib

import torch

from hpcpipe.errors import ConfigError
from hpcpipe.train.deepspeed import import_deepspeed


def _import_for_the_cpu() -> None:
    """DeepSpeed on its CPU accelerator, as ``import_deepspeed`` sets it up for a CPU rank, and the
    Muon module; a missing DeepSpeed is left for the ranks to report (one line, exit 2)."""
    with contextlib.suppress(ConfigError):
        import_deepspeed(torch.device("cpu"))
        with contextlib.suppress(ImportError):  # a DeepSpeed release without Muon
            importlib.import_module("deepspeed.runtime.zero.muon.muon_optimizer")


_import_for_the_cpu()  # imported as the fork server's preload: the import is the work
