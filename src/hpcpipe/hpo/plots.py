"""The study's plots as PNG files, drawn by ``optuna.visualization.matplotlib``.

Optuna marks these functions experimental (they warn); the warnings are silenced here. A plot
that the study cannot support yet (importances need two completed trials, intermediate values
need a reported step) is skipped with the reason, never an error.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from hpcpipe.layout import StudyLayout

if TYPE_CHECKING:
    import optuna

PLOTS = ("optimization_history", "param_importances", "parallel_coordinate", "intermediate_values")


def write_plots(study: optuna.Study, out_dir: Path) -> tuple[list[Path], dict[str, str]]:
    """``out_dir/<plot>.png`` for each plot; returns the files and {plot: why it was skipped}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as ovm

    out_dir.mkdir(parents=True, exist_ok=True)
    written, skipped = [], {}
    for name in PLOTS:
        why = _unsupported(study, name)
        if why:
            skipped[name] = why
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ax = getattr(ovm, f"plot_{name}")(study)
            except (ValueError, RuntimeError) as exc:  # e.g. a single distinct value per parameter
                skipped[name] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                continue
        figure = (ax.flat[0] if hasattr(ax, "flat") else ax).get_figure()
        figure.set_size_inches(9, 5)
        path = out_dir / StudyLayout.PLOT.format(name=name)
        figure.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written, skipped


def _unsupported(study: optuna.Study, name: str) -> str | None:
    import optuna

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        return "no completed trial yet"
    if name == "param_importances" and len(complete) < 2:
        return "needs two completed trials"
    if name == "parallel_coordinate" and not any(t.params for t in complete):
        return "no parameters"
    if name == "intermediate_values" and not any(t.intermediate_values for t in trials):
        return "no trial reported an evaluation"
    return None
