"""The image manifest's normalisation statistics."""

from __future__ import annotations

import numpy as np

from hpcpipe.data.images.formats import ImageSplit
from hpcpipe.data.images.manifest import _chunked_mean_std, channel_stats


def test_chunked_statistics_equal_numpys_over_the_whole_split() -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (5000, 3, 8, 8), dtype=np.uint8)
    mean, std = _chunked_mean_std(pixels, chunk=700)  # chunks that do not divide the split
    per_channel = pixels.transpose(1, 0, 2, 3).reshape(3, -1)  # (C, N*H*W)
    np.testing.assert_allclose(mean, per_channel.mean(axis=1, dtype=np.float64), rtol=1e-12)
    np.testing.assert_allclose(std, per_channel.std(axis=1, dtype=np.float64), rtol=1e-12)
    split = ImageSplit(np.zeros(5000, np.int64), ["a"], pixels, shape=(3, 8, 8))
    means, stds = channel_stats(split)
    assert means == [round(float(m) / 255, 6) for m in mean] and len(stds) == 3
