"""train/evaluation.py: what an evaluation leaves as it found it."""

from __future__ import annotations


def test_streams_kept_undoes_torch_python_and_numpy_draws() -> None:
    """An evaluation or FLOP count that drew from Python's or NumPy's stream (an augmentation)
    moved the training's: a resumed run, which skips that evaluation, then drew other numbers."""
    import random

    import numpy as np
    import torch

    from hpcpipe.train.evaluation import streams_kept

    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    with streams_kept(torch.device("cpu")):
        random.random(), np.random.rand(), torch.rand(1)
    assert random.getstate() == before[0]
    assert (np.random.get_state()[1] == before[1]).all() and torch.equal(torch.get_rng_state(), before[2])
