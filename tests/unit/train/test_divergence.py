"""The fp16 stop rule's edge: a streak of skips stops the run only once a step ran at a scale < 1."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpcpipe.errors import UserError
from hpcpipe.train.divergence import require_healthy


def _fp16(in_a_row: int) -> SimpleNamespace:
    """A precision whose scaler skipped ``in_a_row`` steps from the initial 2**16 (halving)."""
    skips = SimpleNamespace(in_a_row=in_a_row, scale=2.0**16 / 2**in_a_row)
    return SimpleNamespace(skips_overflows=True, skipped_steps=in_a_row, skips=skips, scaler=None)


def test_the_17th_skip_at_scale_1_does_not_stop_the_18th_at_half_does() -> None:
    """It stopped after 17 (the scale then 0.5, never tried): a gradient overflowing at scale 1
    by less than twice fp16's range trains at 0.5."""
    require_healthy(17, 1.0, None, 1.0, _fp16(17))  # type: ignore[arg-type]
    with pytest.raises(UserError, match=r"from 1 to 18 \(18 in a row, 18 skipped in all\)"):
        require_healthy(18, 1.0, None, 1.0, _fp16(18))  # type: ignore[arg-type]
