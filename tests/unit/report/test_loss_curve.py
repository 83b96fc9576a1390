"""The loss-curve PNG of a run, from a hand-written metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcpipe.report.loss_curve import plot_loss_curve


@pytest.mark.parametrize(("rate", "label"), [("tokens_per_s", "loss per token"), ("samples_per_s", "loss")])
def test_the_y_axis_says_per_token_only_for_a_recipe_that_counts_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rate: str, label: str
) -> None:
    """An image classifier's axis read "cross-entropy (nats/token)"."""
    import matplotlib.axes

    rows = [{"step": s, "loss": 2.0 / s, rate: 100.0} for s in (1, 2, 3)] + [{"step": 3, "val_loss": 0.9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    said: list[str] = []
    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylabel", lambda ax, text, **kw: said.append(text))
    assert plot_loss_curve(tmp_path, tmp_path / "curve.png").is_file()
    assert said == [label]
