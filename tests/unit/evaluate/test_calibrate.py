"""The call threshold calibrated after training (evaluate/calibrate.py): near misses from the
generator, and the threshold at which the asked share of them declines."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcpipe.config.synthetic import SHAPE_FIELDS, SyntheticMix
from hpcpipe.evaluate.calibrate import Calibration, near_misses, read_calibration, threshold_for


def test_threshold_for_declines_the_target_share() -> None:
    p = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    assert threshold_for(p, 0.5) == 0.6  # 0.1..0.5 decline (P < 0.6): 5 of 10
    assert threshold_for(p, 0.9) == 0.95  # 9 of 10 below
    assert threshold_for(p, 0.85) == 0.95  # ceil(8.5) = 9 must decline
    assert sum(x < threshold_for(p, 0.3) for x in p) == 3
    top = threshold_for(p, 1.0)  # all decline: just above the largest
    assert top > 0.95 and all(x < top for x in p)
    assert threshold_for([0.2, 0.2, 0.9], 0.5) == 0.9  # ties: both 0.2 decline at 0.9
    with pytest.raises(ValueError):
        threshold_for([], 0.9)
    with pytest.raises(ValueError):
        threshold_for(p, 0.0)


def test_near_misses_are_requests_no_listed_function_serves() -> None:
    from hpcpipe.data.function_calling.generator import generate_conversations

    mix = SyntheticMix()
    convs = near_misses(40, seed=7, mix=mix)
    assert len(convs) == 40
    assert all([m.role for m in c.messages] == ["system", "user"] and c.tools for c in convs)
    # Each is the twin of a single request: the request's own function is no longer listed.
    singles_and_twins = {shape: 0.0 for shape in SHAPE_FIELDS} | {
        "single": 1.0,
        "twins": 1.0,
        "follow_ups": 0.0,
    }
    singles = generate_conversations(80, 7, mix.model_copy(update=singles_and_twins))
    for single, twin in zip(singles[0::2], convs, strict=False):
        called = {c.name for m in single.messages for c in m.tool_calls}
        assert twin.messages[1].content == single.messages[1].content
        assert called and not called & {t["name"] for t in twin.tools}
    assert near_misses(40, seed=7, mix=mix) == convs  # seeded
    assert near_misses(40, seed=8, mix=mix) != convs


def test_the_calibration_is_saved_beside_the_adapter(tmp_path: Path) -> None:
    assert read_calibration(tmp_path) is None
    found = Calibration(0.71, 0.95, 100, 104736, {"p50": 0.2})
    found.save(tmp_path)
    assert read_calibration(tmp_path) == found
